"""The ELECTRA objective: mask, generate, sample (Gumbel-max), discriminate; losses and metrics.

`ElectraObjective` is a pure function of (params, batch, rng). Metrics come out as sums
(numerators and denominators) so that steps, devices and eval batches combine exactly;
`summarize` turns them into the reported ratios.
"""
import dataclasses
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax import masking
from electra_jax.model import Electra


@dataclasses.dataclass(frozen=True)
class ElectraObjective:
  """loss = gen_weight * MLM(G) + disc_weight * RTD(D), with G's samples as D's input."""
  model: Electra
  special_ids: Sequence[int]
  mask_id: int
  vocab_size: int
  mask_prob: float
  max_predictions: int
  mask_token_prob: float = 0.85
  random_token_prob: float = 0.0
  temperature: float = 1.0
  gen_weight: float = 1.0
  disc_weight: float = 50.0

  @classmethod
  def from_config(cls, model, c, special_ids, mask_id):
    return cls(model=model, special_ids=tuple(special_ids), mask_id=mask_id,
               vocab_size=c.vocab_size, mask_prob=c.mask_prob,
               max_predictions=c.max_predictions_per_seq, mask_token_prob=c.mask_token_prob,
               random_token_prob=c.random_token_prob, temperature=c.temperature,
               gen_weight=c.gen_weight, disc_weight=c.disc_weight)

  def __call__(self, params, batch: Mapping[str, jax.Array], rng, deterministic=False,
               example_ids=None, denominators=None):
    """Returns (loss, metric sums).

    Randomness is drawn per example from fold_in(rng, example_ids[b]) (default: the row index),
    so a batch split into micro-batches with their global `example_ids` draws the same masks,
    samples and dropout as the whole batch. `denominators` (from `loss_denominators` of the
    whole batch) make each micro-batch's loss its share of the whole batch's loss.
    """
    input_ids, segment_ids = batch['input_ids'], batch['segment_ids']
    input_mask = batch['input_mask']
    keys = masking.example_keys(rng, input_ids.shape[0], example_ids)
    mask_keys, gen_keys, sample_keys, disc_keys = jnp.moveaxis(
        jax.vmap(lambda k: jax.random.split(k, 4))(keys), 1, 0)
    m = masking.mask_batch(
        mask_keys, input_ids, input_mask, special_ids=self.special_ids, mask_id=self.mask_id,
        vocab_size=self.vocab_size, mask_prob=self.mask_prob,
        max_predictions=self.max_predictions, mask_token_prob=self.mask_token_prob,
        random_token_prob=self.random_token_prob)

    gen_logits = self._apply(params, Electra.generator_logits, gen_keys, deterministic,
                             m.masked_ids, segment_ids, input_mask, m.masked_positions)
    mlm_losses = optax.softmax_cross_entropy_with_integer_labels(gen_logits, m.masked_lm_ids)

    # The samples are constants for the rest of the step: no gradient reaches G through them.
    sampled = jax.vmap(gumbel_sample, (0, 0, None))(
        sample_keys, jax.lax.stop_gradient(gen_logits), self.temperature)
    corrupted = masking.scatter_positions(input_ids, m.masked_positions, sampled,
                                          m.masked_weights)
    # A sample that equals the original token counts as original.
    real = input_mask.astype(jnp.float32)
    labels = (corrupted != input_ids).astype(jnp.float32) * real

    disc_logits = self._apply(params, Electra.discriminator_logits, disc_keys, deterministic,
                              corrupted, segment_ids, input_mask)
    disc_losses = optax.sigmoid_binary_cross_entropy(disc_logits, labels)

    if denominators is None:
      denominators = {'mlm_count': jnp.sum(m.masked_weights), 'disc_count': jnp.sum(real)}
    mlm_loss = weighted_mean(mlm_losses, m.masked_weights, denominators['mlm_count'])
    disc_loss = weighted_mean(disc_losses, real, denominators['disc_count'])
    loss = self.gen_weight * mlm_loss + self.disc_weight * disc_loss
    metrics = electra_metric_sums(
        gen_logits=gen_logits, masked_lm_ids=m.masked_lm_ids, masked_weights=m.masked_weights,
        mlm_losses=mlm_losses, sampled=sampled, disc_logits=disc_logits,
        disc_losses=disc_losses, labels=labels, real=real)
    return loss, metrics

  def loss_denominators(self, batch: Mapping[str, jax.Array]) -> dict:
    """The whole batch's masked-position and real-token counts (no randomness involved)."""
    return {
        'mlm_count': masking.num_predictions(
            batch['input_ids'], batch['input_mask'], special_ids=self.special_ids,
            mask_prob=self.mask_prob, max_predictions=self.max_predictions),
        'disc_count': jnp.sum(batch['input_mask'].astype(jnp.float32)),
    }

  def _apply(self, params, method, keys, deterministic, *inputs):
    """model.apply(method) with dropout drawn per example from `keys` (vmapped over rows)."""
    variables = {'params': params}
    cfg = self.model.cfg
    if deterministic or (cfg.dropout_rate == 0 and cfg.attention_dropout_rate == 0):
      return self.model.apply(variables, *inputs, True, method=method)

    def one(key, *row):
      row = [x[None] for x in row]
      return self.model.apply(variables, *row, False, method=method,
                              rngs={'dropout': key})[0]

    return jax.vmap(one)(keys, *inputs)


def gumbel_sample(rng, logits, temperature: float):
  """Gumbel-max sampling with the official release's noise formula."""
  u = jax.random.uniform(rng, logits.shape, jnp.float32)
  gumbel = -jnp.log(-jnp.log(u + 1e-9) + 1e-9)
  return jnp.argmax(logits / temperature + gumbel, axis=-1).astype(jnp.int32)


def weighted_mean(values, weights, denominator=None):
  """sum(values * weights) / sum(weights), or over a given denominator (the whole batch's)."""
  denominator = jnp.sum(weights) if denominator is None else denominator
  return jnp.sum(values * weights) / (denominator + 1e-6)


def electra_metric_sums(*, gen_logits, masked_lm_ids, masked_weights, mlm_losses, sampled,
                        disc_logits, disc_losses, labels, real):
  """Numerators and denominators of every reported metric (summed over the batch)."""
  predicted_replaced = (disc_logits > 0).astype(jnp.float32) * real
  auc_numerator, auc_pairs = auc_pair_counts(disc_logits, labels, real)
  return {
      'mlm_loss_sum': jnp.sum(mlm_losses * masked_weights),
      'mlm_count': jnp.sum(masked_weights),
      'mlm_correct': jnp.sum((jnp.argmax(gen_logits, -1) == masked_lm_ids) * masked_weights),
      'sampled_correct': jnp.sum((sampled == masked_lm_ids) * masked_weights),
      'disc_loss_sum': jnp.sum(disc_losses * real),
      'disc_count': jnp.sum(real),
      'disc_correct': jnp.sum((predicted_replaced == labels) * real),
      'disc_true_positive': jnp.sum(predicted_replaced * labels),
      'disc_predicted_positive': jnp.sum(predicted_replaced),
      'disc_label_positive': jnp.sum(labels),
      'auc_numerator': auc_numerator,
      'auc_pairs': auc_pairs,
  }


def auc_pair_counts(logits, labels, weights):
  """Exact ROC AUC sufficient statistics over the (replaced, original) token pairs of a batch.

  Returns (sum over replaced tokens of #originals scored lower + half the ties, #pairs); summing
  both over batches gives the AUC over all within-batch pairs. A sort, not a histogram: a young
  discriminator's logits differ by far less than any fixed bin width.
  """
  s = logits.reshape(-1).astype(jnp.float32)
  order = jnp.argsort(s)
  s = s[order]
  pos = (labels * weights).reshape(-1)[order]
  neg = ((1.0 - labels) * weights).reshape(-1)[order]
  neg_before = jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.cumsum(neg)])
  first = jnp.searchsorted(s, s, side='left')
  last = jnp.searchsorted(s, s, side='right')
  below, tied = neg_before[first], neg_before[last] - neg_before[first]
  return jnp.sum(pos * (below + 0.5 * tied)), jnp.sum(pos) * jnp.sum(neg)


def summarize(sums: Mapping[str, np.ndarray], gen_weight: float, disc_weight: float) -> dict:
  """Metric sums -> the reported ratios (floats)."""
  s = {k: np.asarray(v, np.float64) for k, v in sums.items()}
  ratio = lambda a, b: float(s[a] / s[b]) if s[b] > 0 else float('nan')
  mlm_loss = ratio('mlm_loss_sum', 'mlm_count')
  disc_loss = ratio('disc_loss_sum', 'disc_count')
  return {
      'loss': gen_weight * mlm_loss + disc_weight * disc_loss,
      'mlm_loss': mlm_loss,
      'disc_loss': disc_loss,
      'mlm_accuracy': ratio('mlm_correct', 'mlm_count'),
      'sampled_accuracy': ratio('sampled_correct', 'mlm_count'),
      'disc_accuracy': ratio('disc_correct', 'disc_count'),
      'disc_precision': ratio('disc_true_positive', 'disc_predicted_positive'),
      'disc_recall': ratio('disc_true_positive', 'disc_label_positive'),
      'disc_auc': ratio('auc_numerator', 'auc_pairs'),
      'replaced_fraction': ratio('disc_label_positive', 'disc_count'),
  }
