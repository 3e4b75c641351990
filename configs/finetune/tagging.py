"""Token tagging (NER, chunking, POS) on your own CoNLL-format files; defaults to the bundled
Austen set (which words name a person: B-PER / I-PER / O, data/austen_names).

One word per line with its tag in the last column, a blank line between sentences (CoNLL-2003's
`word POS chunk NER` lines tag NER). Span tags (O, B-X, I-X, E-X, S-X) score chunk F1 as
conlleval does; any other tags word accuracy.
"""
from configs.finetune import glue


def get_config():
  c = glue.get_config()
  c.task = 'tagging'
  c.train_file = 'data/austen_names/train.txt'
  c.eval_file = 'data/austen_names/eval.txt'
  return c
