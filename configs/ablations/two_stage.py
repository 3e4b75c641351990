"""Ablation: two-stage training. The generator (as wide as D) trains alone with MLM for the
first half of the run; then the discriminator starts from its weights and trains with RTD
while the generator stays frozen.

Paper (Figure 3 / §3.2, ELECTRA.md): underperforms joint ELECTRA training; an adversarially
trained generator does too (58 % vs 65 % MLM accuracy for the maximum-likelihood generator).
"""
from configs import small


def get_config():
  c = small.get_config()
  c.objective = 'two_stage'
  c.generator_hidden_size = 1.0  # D is initialised from G: same sizes.
  c.tie = 'none'                 # A frozen G keeps its own embeddings.
  # Half of whatever num_train_steps becomes (--config.num_train_steps=N overrides it later).
  c.two_stage_generator_steps = c.get_ref('num_train_steps') // 2
  return c
