"""Ablation: tied embeddings (the default) with a generator as large as the discriminator:
the reference point of the weight-sharing study.

Paper (same-size G and D trained 500k steps, GLUE; this config keeps small.py's 1M, as every
ablation here does: --config.num_train_steps=500000 for the study's length): no tying 83.6,
tied token embeddings 84.3, all weights tied 84.4.
"""
from configs import small


def get_config():
  c = small.get_config()
  c.generator_hidden_size = 1.0
  c.tie = 'embeddings'
  return c
