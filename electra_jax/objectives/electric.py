"""Electric (Clark et al. 2020, "Pre-Training Transformers as Energy-Based Cloze Models"; the
official release's electric_objective with two_tower_generator): a two-tower cloze model q
(model.ClozeGenerator) learns p(x_t | context) at every candidate position of the unmasked
input; its samples replace the masked positions; the discriminator's logit for "replaced" is
its own energy plus the stop-gradient log q(x̃_t | context) + log(mask_prob / (1 − mask_prob)),
and every masked position counts as replaced (noise-contrastive estimation), even a sample
equal to the original.

loss = gen_weight * cloze(q) + disc_weight * NCE(D), over the real tokens.
"""
import math

import jax
import jax.numpy as jnp
import optax

from electra_jax import masking
from electra_jax.errors import UserError
from electra_jax.objectives import base
from electra_jax.objectives import metrics


class Electric(base.Objective):
  name = 'electric'
  layout = base.Layout(generator=True, rtd_head=True, mlm_head=False, cloze_generator=True)
  exportable = True  # the discriminator; the two-tower generator has no HF class

  @classmethod
  def validate(cls, c):
    super().validate(c)
    if c.tie != 'embeddings' or c.uniform_generator:
      raise UserError(f"objective 'electric' shares the token embeddings of its cloze model and "
                      f"discriminator: set config.tie='embeddings' (is {c.tie!r}) and "
                      f'config.uniform_generator=False (is {c.uniform_generator})')
    # NCE's logit adds log q of the noise: samples drawn from q itself, as the official code
    # draws them (a temperature or a suppressed original token is another noise distribution).
    if c.temperature != 1.0 or c.disallow_correct:
      raise UserError(f"objective 'electric' samples its noise from the cloze model q itself: "
                      f'set config.temperature=1.0 (is {c.temperature}) and '
                      f'config.disallow_correct=False (is {c.disallow_correct})')

  def loss(self, s: base.Step):
    ids, m, real = s.batch['input_ids'], s.masked, s.real
    cloze, sampled, corrupted = self._noise(s)
    targets = masking.candidate_mask(ids, s.batch['input_mask'], self.special_ids)
    targets = targets.astype(jnp.float32)
    cloze_losses = optax.softmax_cross_entropy_with_integer_labels(cloze, ids)
    count = s.denominators.get('cloze_count', jnp.sum(targets))
    cloze_loss = base.weighted_mean(cloze_losses, targets, count)

    labels = base.masked_position_indicator(ids, m) * real
    disc_logits = self._nce_logits(s.full_size('discriminator_logits', corrupted), cloze,
                                   corrupted)
    disc_losses = optax.sigmoid_binary_cross_entropy(disc_logits, labels)
    disc_loss = base.weighted_mean(disc_losses, real, s.denominators['disc_count'])
    loss = self.gen_weight * cloze_loss + self.disc_weight * disc_loss

    sums = {
        'mlm_loss_sum': jnp.sum(cloze_losses * targets),
        'mlm_count': jnp.sum(targets),
        'mlm_correct': jnp.sum((jnp.argmax(cloze, -1) == ids) * targets),
        'sampled_correct': jnp.sum((sampled == m.masked_lm_ids) * m.masked_weights),
        'sampled_count': jnp.sum(m.masked_weights),
    }
    return loss, dict(sums, **metrics.disc_metric_sums(disc_logits, disc_losses, labels, real))

  def _noise(self, s: base.Step):
    """The cloze model's logits [B, S, V] on the unmasked input, its samples at the masked
    positions, and the input they make."""
    ids, m = s.batch['input_ids'], s.masked
    cloze = self.apply(s.params, 'cloze_logits', s.gen_keys, s.deterministic, ids,
                       s.batch['segment_ids'], s.batch['input_mask'])
    gen_logits = jnp.take_along_axis(cloze, m.masked_positions[..., None], axis=1)
    sampled = base.sample_replacements(s.sample_keys, jax.lax.stop_gradient(gen_logits),
                                       m.masked_lm_ids, self.temperature, self.disallow_correct)
    return cloze, sampled, masking.scatter_positions(ids, m.masked_positions, sampled,
                                                     m.write_weights)

  def _nce_logits(self, energy, cloze, tokens):
    """The logit that each of `tokens` is q's sample rather than the text's (NCE): the energy
    plus log q(token), a constant to the discriminator, plus the prior log-odds of a masked
    position."""
    log_q = jnp.take_along_axis(jax.nn.log_softmax(jax.lax.stop_gradient(cloze)),
                                tokens[..., None], axis=-1)[..., 0]
    return energy + log_q + math.log(self.mask_prob / (1 - self.mask_prob))

  def replaced_logits(self, params, batch):
    """The NCE logit of the tokens as given, q reading the same input (the cloze model's two
    towers never see the token they predict)."""
    inputs = batch['input_ids'], batch['segment_ids'], batch['input_mask']
    return self._nce_logits(self.apply(params, 'discriminator_logits', None, True, *inputs),
                            self.apply(params, 'cloze_logits', None, True, *inputs),
                            batch['input_ids'])

  def detect_corrupted(self, s):
    """As the training step: q reads the text before its samples went in."""
    cloze, _, corrupted = self._noise(s)
    return corrupted, self._nce_logits(s.full_size('discriminator_logits', corrupted), cloze,
                                       corrupted)

  def loss_denominators(self, batch, rng):
    return dict(super().loss_denominators(batch, rng), cloze_count=jnp.sum(masking.candidate_mask(
        batch['input_ids'], batch['input_mask'], self.special_ids).astype(jnp.float32)))
