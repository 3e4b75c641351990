"""All-Tokens MLM (paper section 3.2): MLM(G) plus the full-size network predicting every token
of G's corrupted input with a copy mechanism, p = D·1[x = input] + (1 − D)·p_MLM. Its disc_*
metrics and detect.py read one p(replaced): 1 − p(the token it was given), whichever of its copy
gate and its MLM says so."""
import jax
import jax.numpy as jnp

from electra_jax.objectives import base
from electra_jax.objectives import metrics


class AllTokensMLM(base.Objective):
  name = 'all_tokens_mlm'
  layout = base.Layout(generator=True, rtd_head=True, mlm_head=True)
  mlm_head_slots = 'all'

  def loss(self, s: base.Step):
    g = s.corrupt()
    input_ids, real = s.batch['input_ids'], s.real
    out = s.full_size('discriminator_outputs', g.corrupted, every_position(input_ids))
    log_probs = copy_log_probs(out['mlm'], out['rtd'], g.corrupted)
    losses = -jnp.take_along_axis(log_probs, input_ids[..., None], axis=-1)[..., 0]
    loss = self.gen_weight * g.mlm_loss + base.weighted_mean(losses, real,
                                                             s.denominators['disc_count'])
    sums = dict(g.gen_sums, **metrics.full_mlm_metric_sums(log_probs, input_ids, losses, real))
    # No disc_loss: this objective trains no replaced/original classifier.
    sums.update(metrics.disc_metric_sums(replaced_logit(log_probs, g.corrupted), None, g.labels,
                                         real))
    return loss, sums

  def replaced_logits(self, params, batch):
    ids = batch['input_ids']
    out = self.apply(params, 'discriminator_outputs', None, True, ids, batch['segment_ids'],
                     batch['input_mask'], every_position(ids))
    return replaced_logit(copy_log_probs(out['mlm'], out['rtd'], ids), ids)


def every_position(input_ids):
  """[B, S] each row's positions 0..S-1: the MLM head predicts every token."""
  return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


def replaced_logit(log_probs, input_ids):
  """[B, S] log((1 − p) / p) of p = the network's probability of the token it was given: that
  the original is another one (the gate alone would ignore an MLM that predicts the input).

  log p is held below −1e-30: float32 rounds p near 1 to 1 or just above it, where the logit
  would be −inf or NaN; there it is log(1e-30) ≈ −69.
  """
  log_p = jnp.take_along_axis(log_probs, input_ids[..., None], axis=-1)[..., 0]
  log_p = jnp.minimum(log_p, -1e-30)
  return jnp.log(-jnp.expm1(log_p)) - log_p


def copy_log_probs(mlm_logits, replaced_logits, input_ids):
  """All-Tokens MLM's output log p(v) = log(D·1[v = input] + (1 − D)·softmax(mlm)(v)), [..., V].

  D, the copy probability, is sigmoid(−replaced_logit): the per-token head keeps its RTD
  meaning (a high logit says 'this input token is not the original'). Computed in log space.
  """
  log_copy = jax.nn.log_sigmoid(-replaced_logits)[..., None]
  log_generate = jax.nn.log_sigmoid(replaced_logits)[..., None]
  generate = log_generate + jax.nn.log_softmax(mlm_logits.astype(jnp.float32), axis=-1)
  is_input = jax.nn.one_hot(input_ids, mlm_logits.shape[-1], dtype=bool)
  return jnp.where(is_input, jnp.logaddexp(generate, log_copy), generate)
