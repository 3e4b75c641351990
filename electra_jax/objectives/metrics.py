"""Metric sums of the pretraining objectives and the ratios, console line they become.

Metrics come out as sums (numerators and denominators) so that steps, devices and eval batches
combine exactly; `summarize` turns them into the reported ratios. Groups an objective may
produce: 'mlm_*' / 'sampled_correct' (the generator), 'disc_*' (p(replaced) of each token: the
RTD head's, all_tokens_mlm's 1 − p(input), Electric's NCE logit; over the masked positions for
electra_15), 'full_mlm_*' (the full-size network's MLM or copy-mechanism predictions).
"""
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np


def generator_metric_sums(gen_logits, masked_lm_ids, masked_weights, mlm_losses, sampled):
  """The generator's MLM sums: loss, accuracy of its argmax and of its samples."""
  return {
      'mlm_loss_sum': jnp.sum(mlm_losses * masked_weights),
      'mlm_count': jnp.sum(masked_weights),
      'mlm_correct': jnp.sum((jnp.argmax(gen_logits, -1) == masked_lm_ids) * masked_weights),
      'sampled_correct': jnp.sum((sampled == masked_lm_ids) * masked_weights),
  }


def disc_metric_sums(disc_logits, disc_losses, labels, real):
  """The per-token head's sums over the tokens weighted by `real` (loss, accuracy, AUC, ...);
  no loss sum where `disc_losses` is None (an objective without a replaced/original loss)."""
  predicted_replaced = (disc_logits > 0).astype(jnp.float32) * real
  auc_numerator, auc_pairs = auc_pair_counts(disc_logits, labels, real)
  loss = {} if disc_losses is None else {'disc_loss_sum': jnp.sum(disc_losses * real)}
  return loss | {
      'disc_count': jnp.sum(real),
      'disc_correct': jnp.sum((predicted_replaced == labels) * real),
      'disc_true_positive': jnp.sum(predicted_replaced * labels * real),
      'disc_predicted_positive': jnp.sum(predicted_replaced),
      'disc_label_positive': jnp.sum(labels * real),
      'auc_numerator': auc_numerator,
      'auc_pairs': auc_pairs,
  }


def full_mlm_metric_sums(logits, targets, losses, weights):
  """The full-size network's predictions (MLM or copy mechanism): loss and accuracy."""
  return {
      'full_mlm_loss_sum': jnp.sum(losses * weights),
      'full_mlm_count': jnp.sum(weights),
      'full_mlm_correct': jnp.sum((jnp.argmax(logits, -1) == targets) * weights),
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
  first, last = tie_bounds(s)
  below, tied = neg_before[first], neg_before[last] - neg_before[first]
  return jnp.sum(pos * (below + 0.5 * tied)), jnp.sum(pos) * jnp.sum(neg)


def tie_bounds(sorted_scores):
  """(first, last): where each value's run of equal values starts and ends (exclusive) in a
  sorted vector, i.e. searchsorted(s, s, 'left' / 'right').

  Running max / min over run boundaries, not jnp.searchsorted: its binary search is a while
  loop, which XLA:GPU runs from the host iteration by iteration, splitting the train step's
  CUDA graph in two (an H100 profile: 1.5 ms of host time a step; benchmarks/RESULTS.md).
  """
  s = sorted_scores
  n = s.shape[0]
  index = jnp.arange(n)
  differs = s[1:] != s[:-1]
  starts = jnp.concatenate([jnp.ones((1,), bool), differs])
  ends = jnp.concatenate([differs, jnp.ones((1,), bool)])
  first = jax.lax.cummax(jnp.where(starts, index, 0))
  last = jax.lax.cummin(jnp.where(ends, index + 1, n), reverse=True)
  return first, last


def summarize(sums: Mapping[str, np.ndarray], gen_weight: float, disc_weight: float) -> dict:
  """Metric sums -> the reported ratios (floats), for the groups the objective produced.

  loss = gen_weight · mlm_loss + disc_weight · disc_loss + full_mlm_loss (terms present only).
  For two_stage that is the ELECTRA loss in both stages (each stage optimises one term), for
  adversarial too (its generator optimises generator_reward, not mlm_loss).
  """
  s = {k: np.asarray(v, np.float64) for k, v in sums.items()}
  ratio = lambda a, b: float(s[a] / s[b]) if s[b] > 0 else float('nan')
  out = {'loss': 0.0}
  if 'mlm_count' in s:
    out['mlm_loss'] = ratio('mlm_loss_sum', 'mlm_count')
    out['loss'] += gen_weight * out['mlm_loss']
  if 'disc_loss_sum' in s:
    out['disc_loss'] = ratio('disc_loss_sum', 'disc_count')
    out['loss'] += disc_weight * out['disc_loss']
  if 'full_mlm_count' in s:
    out['full_mlm_loss'] = ratio('full_mlm_loss_sum', 'full_mlm_count')
    out['loss'] += out['full_mlm_loss']
  if 'mlm_count' in s:
    out['mlm_accuracy'] = ratio('mlm_correct', 'mlm_count')
    # Over the masked slots ('sampled_count' where the MLM sums cover more, as Electric's do).
    out['sampled_accuracy'] = ratio('sampled_correct',
                                    'sampled_count' if 'sampled_count' in s else 'mlm_count')
  if 'full_mlm_count' in s:
    out['full_mlm_accuracy'] = ratio('full_mlm_correct', 'full_mlm_count')
  if 'reward_sum' in s:  # adversarial: what its generator maximises, and its baseline's fit.
    out['generator_reward'] = ratio('reward_sum', 'mlm_count')
    out['baseline_loss'] = ratio('baseline_loss_sum', 'mlm_count')
  if 'disc_count' in s:
    out.update({
        'disc_accuracy': ratio('disc_correct', 'disc_count'),
        'disc_precision': ratio('disc_true_positive', 'disc_predicted_positive'),
        'disc_recall': ratio('disc_true_positive', 'disc_label_positive'),
        'disc_auc': ratio('auc_numerator', 'auc_pairs'),
        # Of the real tokens, also where the discriminator sees fewer (electra_15: the masked).
        'replaced_fraction': float(s['disc_label_positive'] / max(num_tokens(s), 1)),
    })
  if 'masked_count' in s:  # The share of real tokens chosen for prediction.
    out['masked_fraction'] = float(s['masked_count'] / max(num_tokens(s), 1))
  return out


def num_tokens(sums) -> int:
  """Real (non-padding) tokens the sums cover, whatever the objective."""
  return int(np.asarray(sums['token_count'] if 'token_count' in sums else sums['disc_count']))


def progress_line(metrics: dict) -> str:
  """'loss … | mlm_acc … | disc_auc …' with the metrics this objective reports."""
  parts = [f'loss {metrics["loss"]:.4f}']
  for key, short in (('mlm_accuracy', 'mlm_acc'), ('full_mlm_accuracy', 'full_mlm_acc')):
    if key in metrics:
      parts.append(f'{short} {metrics[key]:.3f}')
  if 'generator_reward' in metrics:
    parts.append(f'reward {metrics["generator_reward"]:.3f}')
  if 'disc_auc' in metrics:
    parts.append(f'disc_auc {metrics["disc_auc"]:.4f}')
  return ' | '.join(parts)
