"""Ablation: adversarial ELECTRA. The generator is trained by REINFORCE to maximise the
discriminator's loss instead of by maximum likelihood (objectives/adversarial.py).

Paper (Figure 3 / §3.2, appendix F, ELECTRA.md): the adversarial generator is less accurate
(58 % vs 65 % MLM accuracy for the maximum-likelihood one at hidden size 256) and the
discriminator does not improve downstream.
"""
from configs import small


def get_config():
  c = small.get_config()
  c.objective = 'adversarial'
  return c
