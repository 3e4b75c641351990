"""Ablation: ELECTRA 15 %. The discriminator's loss covers only the masked positions.

Paper (Base, GLUE dev): 82.4 vs ELECTRA 85.0 (learning from all tokens is where most of the
gain comes from).
"""
from configs import small


def get_config():
  c = small.get_config()
  c.objective = 'electra_15'
  return c
