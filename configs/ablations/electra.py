"""Ablation baseline: ELECTRA-Small as in configs/small.py (replaced-token detection, 1/4 G).

Paper (Base, GLUE dev, efficiency ablations): ELECTRA 85.0 vs BERT 82.2.
"""
from configs import small


def get_config():
  c = small.get_config()
  c.objective = 'electra'
  return c
