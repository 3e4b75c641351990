"""ELECTRA 15% (paper section 3.2): as electra, but D learns (and is scored) only on the masked
positions."""
import jax.numpy as jnp

from electra_jax.objectives import base
from electra_jax.objectives import electra


class Electra15(electra.Electra):
  name = 'electra_15'

  def loss(self, s: base.Step):
    loss, sums = super().loss(s)
    return loss, dict(sums, token_count=jnp.sum(s.real))

  def rtd_weights(self, s: base.Step):
    return (base.masked_position_indicator(s.batch['input_ids'], s.masked),
            s.denominators['masked_positions'])
