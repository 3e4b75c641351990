"""Ablation: no weight sharing between a generator and discriminator of the same size.

Paper (same-size G and D, 500k steps, GLUE): no tying 83.6, tied token embeddings 84.3
(configs/ablations/tie_embeddings.py), all weights tied 84.4 (tie_all.py).
"""
from configs import small


def get_config():
  c = small.get_config()
  c.generator_hidden_size = 1.0
  c.tie = 'none'
  return c
