"""Ablation: DeBERTa-v3's gradient-disentangled embedding sharing (tie='gdes') instead of the
paper's shared embeddings: each embedding array D reads is stop_gradient(G's) + its own delta,
so the RTD loss cannot pull G's embeddings (He et al. 2021, DeBERTaV3). Same FLOPs as
configs/ablations/electra.py (the deltas add one embedding lookup).
"""
from configs import small


def get_config():
  c = small.get_config()
  c.tie = 'gdes'
  return c
