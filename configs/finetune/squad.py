"""SQuAD fine-tuning (v2.0 by default; --config.task=squad_v1 for 1.1): 512-token windows, as
the official code (configure_finetuning.py) sets for SQuAD."""
from configs.finetune import glue


def get_config():
  c = glue.get_config()
  c.task = 'squad_v2'
  c.max_seq_length = 512
  c.eval_batch_size = 64
  return c
