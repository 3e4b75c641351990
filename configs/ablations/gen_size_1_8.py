"""Ablation: generator size 1/8 of the discriminator's width.

Paper (GLUE, generator-size study): the generator works best at 1/4 to 1/2 of the
discriminator's size; a larger generator is worse and costs more compute.
"""
from configs import small


def get_config():
  c = small.get_config()
  c.generator_hidden_size = 0.125
  return c
