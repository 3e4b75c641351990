"""Electric (Clark et al. 2020, "Pre-Training Transformers as Energy-Based Cloze Models"; the
official release's electric_objective): a two-tower cloze model proposes the replacements and
the discriminator is trained by noise-contrastive estimation with the cloze model's
log-probabilities added to its logits (objectives/electric.py).
"""
from configs import small


def get_config():
  c = small.get_config()
  c.objective = 'electric'
  return c
