"""Ablation: BERT-style MLM. One full-size masked LM, no generator, no discriminator.

Paper (Base, GLUE dev): BERT 82.2 vs ELECTRA 85.0; the gap grows as models get smaller.
"""
from configs import small


def get_config():
  c = small.get_config()
  c.objective = 'mlm'
  return c
