"""BERT's masked LM (the paper's baseline): the full-size network predicts the masked tokens of
the masked input; no generator, no discriminator. Weight 1, like BERT's MLM."""
import jax.numpy as jnp

from electra_jax.errors import UserError
from electra_jax.objectives import base


class MaskedLM(base.Objective):
  name = 'mlm'
  layout = base.Layout(generator=False, rtd_head=False, mlm_head=True)

  @classmethod
  def validate(cls, c):
    super().validate(c)
    if c.tie != 'embeddings':
      raise UserError(f"config.tie={c.tie!r} means nothing for objective 'mlm' (no generator); "
                      "leave config.tie='embeddings'")

  def loss(self, s: base.Step):
    m = s.masked
    logits = s.full_size('discriminator_outputs', m.masked_ids, m.masked_positions)['mlm']
    loss, sums = s.full_mlm(logits, m.masked_lm_ids, m.masked_weights,
                            s.denominators['mlm_count'])
    return loss, dict(sums, token_count=jnp.sum(s.real))
