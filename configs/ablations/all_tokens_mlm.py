"""Ablation: All-Tokens MLM. As Replace MLM, but the full-size network predicts every token,
with a copy mechanism p = D·1[x_t = input_t] + (1 − D)·p_MLM.

Paper (Base, GLUE dev): 84.3, closing most of the gap between BERT (82.2) and ELECTRA (85.0).
"""
from configs import small


def get_config():
  c = small.get_config()
  c.objective = 'all_tokens_mlm'
  return c
