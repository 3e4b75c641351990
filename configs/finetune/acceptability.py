"""Fine-tuning on the bundled acceptability set (data/austen_acceptability, in the spirit of
CoLA): is a sentence as Austen wrote it, or were a fifth of its words replaced or swapped? The
task on which the CPU demo's pretraining pays off (README, "What to expect from the demo").

The head reads the mean of the tokens' states: the demo's two layers with local attention
(relative_attention_span=8) give the [CLS] state little of a 30-word sentence, and with the
[CLS] head neither the demo checkpoint nor random weights learn this task in 10 epochs
(benchmarks/RESULTS.md, session 28). For a full-size model use files.py with the paper's head.
"""
from configs.finetune import files


def get_config():
  c = files.get_config()
  c.train_file = 'data/austen_acceptability/train.tsv'
  c.eval_file = 'data/austen_acceptability/eval.tsv'
  c.max_seq_length = 64
  c.classifier_pooling = 'mean'
  return c
