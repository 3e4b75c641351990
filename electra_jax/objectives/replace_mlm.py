"""Replace MLM (paper section 3.2): MLM(G) plus the full-size network's MLM on G's samples at
the masked positions (no [MASK] tokens in its input); its cross-entropy has weight 1."""
import jax.numpy as jnp

from electra_jax.objectives import base


class ReplaceMLM(base.Objective):
  name = 'replace_mlm'
  layout = base.Layout(generator=True, rtd_head=False, mlm_head=True)

  def loss(self, s: base.Step):
    g, m = s.corrupt(), s.masked
    logits = s.full_size('discriminator_outputs', g.corrupted, m.masked_positions)['mlm']
    full_loss, sums = s.full_mlm(logits, m.masked_lm_ids, m.masked_weights,
                                 s.denominators['mlm_count'])
    loss = self.gen_weight * g.mlm_loss + full_loss
    return loss, dict(g.gen_sums, **sums, token_count=jnp.sum(s.real))
