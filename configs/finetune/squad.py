"""SQuAD fine-tuning (v2.0 by default; --config.task=squad_v1 for 1.1): 384-token windows."""
from configs.finetune import glue


def get_config():
  c = glue.get_config()
  c.task = 'squad_v2'
  c.max_seq_length = 384
  c.eval_batch_size = 64
  return c
