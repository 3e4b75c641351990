"""Fine-tuning on your own CSV/TSV, JSON Lines, Parquet or Arrow; defaults to the bundled Austen set
(which novel a sentence is from, data/austen_novels).

Columns: text (or text_a/text_b) and label, or the ones --config.text_columns and
--config.label_column name; a header row is required for CSV/TSV.
"""
from configs.finetune import glue


def get_config():
  c = glue.get_config()
  c.task = 'files'
  c.train_file = 'data/austen_novels/train.tsv'
  c.eval_file = 'data/austen_novels/eval.tsv'
  return c
