"""ELECTRA (the paper): loss = gen_weight * MLM(G) + disc_weight * RTD(D), G's samples as D's
input; disc_weight (lambda) scales only the binary RTD loss."""
import optax

from electra_jax.objectives import base
from electra_jax.objectives import metrics


class Electra(base.Objective):
  name = 'electra'
  layout = base.Layout(generator=True, rtd_head=True, mlm_head=False)
  exportable = True

  def loss(self, s: base.Step):
    g = s.corrupt()
    weights, denominator = self.rtd_weights(s)
    disc_logits = s.full_size('discriminator_logits', g.corrupted)
    disc_losses = optax.sigmoid_binary_cross_entropy(disc_logits, g.labels)
    disc_loss = base.weighted_mean(disc_losses, weights, denominator)
    gen_loss, gen_sums = self.generator_loss(s, g, disc_losses)
    loss = self.combine(self.gen_weight * gen_loss, self.disc_weight * disc_loss)
    return loss, dict(g.gen_sums, **gen_sums, **metrics.disc_metric_sums(
        disc_logits, disc_losses, g.labels, weights))

  def generator_loss(self, s: base.Step, g: base.Corruption, disc_losses):
    """(the generator's loss, metric sums it adds) given D's per-token losses [B, S]: its
    maximum-likelihood MLM loss here (adversarial trains it on disc_losses instead)."""
    del s, disc_losses
    return g.mlm_loss, {}

  def rtd_weights(self, s: base.Step):
    """(per-token weights, denominator) of the RTD loss: every real token of the batch."""
    return s.real, s.denominators['disc_count']

  def combine(self, gen_term, disc_term):
    """The step's loss from the weighted generator and discriminator terms."""
    return gen_term + disc_term
