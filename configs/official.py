"""A paper config run with the official release's exact optimisation and masking
(google-research/electra), where this framework's defaults differ:

  python -m electra_jax.train --config=configs/official.py:small --workdir=/tmp/small_official

The argument picks the paper config (small, base or large; small_plus: the released Small's).
The keys (configs/base_config.py): Adam without bias correction, the decay running during
warmup, masked positions drawn with replacement, Glorot-initialised embeddings_project and
discriminator output layer. Everything else (clipping at 1.0, weight decay 0.01 off LayerNorm
and biases, Adam epsilon 1e-6, 85% [MASK] and no random tokens) is the same in both.
"""
import importlib

from electra_jax.errors import UserError

# The official release's settings of the keys where our defaults differ.
OFFICIAL = dict(adam_bias_correction=False, warmup_times_decay=True, lr_decay_power=1.0,
                mask_with_replacement=True, glorot_projections=True)


def get_config(size: str = 'small'):
  if size not in ('small', 'small_plus', 'base', 'large'):
    raise UserError(f'configs/official.py:{size!r} is not a paper config; pick small, '
                    'small_plus, base or large')
  c = importlib.import_module(f'configs.{size}').get_config()
  c.update(OFFICIAL)
  return c
