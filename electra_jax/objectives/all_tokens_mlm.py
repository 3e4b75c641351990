"""All-Tokens MLM (paper section 3.2): MLM(G) plus the full-size network predicting every token
of G's corrupted input with a copy mechanism, p = D·1[x = input] + (1 − D)·p_MLM; the
per-token head is read as the copy gate and reported in its replaced/original meaning."""
import jax
import jax.numpy as jnp
import optax

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
    copy_as_rtd_losses = optax.sigmoid_binary_cross_entropy(out['rtd'], g.labels)
    sums = dict(g.gen_sums, **metrics.full_mlm_metric_sums(log_probs, input_ids, losses, real))
    sums.update(metrics.disc_metric_sums(out['rtd'], copy_as_rtd_losses, g.labels, real))
    del sums['disc_loss_sum']  # Not a loss of this objective: the head is read as a copy gate.
    return loss, sums

  def replaced_logits(self, params, batch):
    """The logit of 1 - p(the input token): the network's probability that the original token
    is another one, whichever of its copy gate and its MLM says so (the gate alone, which the
    metrics read, ignores an MLM that predicts the input token)."""
    ids = batch['input_ids']
    out = self.apply(params, 'discriminator_outputs', None, True, ids, batch['segment_ids'],
                     batch['input_mask'], every_position(ids))
    log_p_input = jnp.take_along_axis(copy_log_probs(out['mlm'], out['rtd'], ids),
                                      ids[..., None], axis=-1)[..., 0]
    return jnp.log(-jnp.expm1(log_p_input)) - log_p_input  # log((1 - p) / p)


def every_position(input_ids):
  """[B, S] each row's positions 0..S-1: the MLM head predicts every token."""
  return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


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
