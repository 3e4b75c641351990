"""The ELECTRA objective and the paper's ablations: mask, generate, sample (Gumbel-max),
discriminate (or predict); losses and metrics.

`ElectraObjective` is a pure function of (params, batch, rng); config.objective (through the
model's config) picks what the full-size network learns:

  electra         loss = gen_weight * MLM(G) + disc_weight * RTD(D), G's samples as D's input
  electra_15      as electra, D's loss only over the masked positions
  two_stage       steps < n: MLM(G) alone; from step n: disc_weight * RTD(D), G frozen (optim.py)
                  and D started from G's weights (`prepare_params`)
  mlm             BERT: MLM of the full-size network on the masked input; no generator
  replace_mlm     MLM(G) + MLM of the full-size network on G's samples at the masked positions
  all_tokens_mlm  MLM(G) + the full-size network predicting every token of G's corrupted input
                  with a copy mechanism, p = D·1[x = input] + (1 − D)·p_MLM (`copy_log_probs`)

The full-size network's cross-entropy losses (mlm, replace_mlm, all_tokens_mlm) have weight 1,
like BERT's MLM; disc_weight (λ) scales only the binary RTD loss, as in the paper.

Metrics come out as sums (numerators and denominators) so that steps, devices and eval batches
combine exactly; `summarize` turns them into the reported ratios. Groups present per objective:
'mlm_*' / 'sampled_correct' (the generator), 'disc_*' (the per-token head: RTD, or for
all_tokens_mlm the same replaced/original reading of the copy head; over the masked positions
for electra_15), 'full_mlm_*' (the full-size network's MLM or copy-mechanism predictions).
"""
import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from electra_jax import masking
from electra_jax import row_keys
from electra_jax.model import Electra


@dataclasses.dataclass(frozen=True)
class ElectraObjective:
  """(params, batch, rng) -> (loss, metric sums) for the model's config.objective."""
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
  two_stage_generator_steps: int = 0
  # The optimizer step being taken (two_stage's stage); None outside training (evaluation).
  step: Any = None

  @classmethod
  def from_config(cls, model, c, special_ids, mask_id):
    return cls(model=model, special_ids=tuple(special_ids), mask_id=mask_id,
               vocab_size=c.vocab_size, mask_prob=c.mask_prob,
               max_predictions=c.max_predictions_per_seq, mask_token_prob=c.mask_token_prob,
               random_token_prob=c.random_token_prob, temperature=c.temperature,
               gen_weight=c.gen_weight, disc_weight=c.disc_weight,
               two_stage_generator_steps=c.two_stage_generator_steps)

  @property
  def name(self) -> str:
    return self.model.cfg.objective

  def at_step(self, step) -> 'ElectraObjective':
    """This objective for optimizer step `step` (0-based; a traced value inside jit)."""
    return dataclasses.replace(self, step=step)

  def prepare_params(self, params, step):
    """The params step `step` starts from: for two_stage, at step n the discriminator
    (embeddings and encoder) becomes a copy of the generator. Done inside the jitted step, so
    a run resumed from any checkpoint makes the same copy at the same step."""
    if self.name != 'two_stage':
      return params
    switch = jnp.asarray(step) == self.two_stage_generator_steps
    take = lambda d, g: jnp.where(switch, g, d)
    copied = dict(params)
    copied['embeddings'] = jax.tree.map(take, params['embeddings'],
                                        params['generator_embeddings'])
    copied['discriminator'] = dict(params['discriminator'], encoder=jax.tree.map(
        take, params['discriminator']['encoder'], params['generator']['encoder']))
    return copied

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
    real = input_mask.astype(jnp.float32)
    if denominators is None:
      denominators = {'mlm_count': jnp.sum(m.masked_weights), 'disc_count': jnp.sum(real)}

    if not self.model.cfg.layout.generator:  # mlm: BERT on the masked input, nothing else.
      logits = self._apply(params, Electra.discriminator_outputs, disc_keys, deterministic,
                           m.masked_ids, segment_ids, input_mask, m.masked_positions)['mlm']
      losses = optax.softmax_cross_entropy_with_integer_labels(logits, m.masked_lm_ids)
      loss = weighted_mean(losses, m.masked_weights, denominators['mlm_count'])
      sums = full_mlm_metric_sums(logits, m.masked_lm_ids, losses, m.masked_weights)
      return loss, dict(sums, token_count=jnp.sum(real))

    gen_logits = self._apply(params, Electra.generator_logits, gen_keys, deterministic,
                             m.masked_ids, segment_ids, input_mask, m.masked_positions)
    mlm_losses = optax.softmax_cross_entropy_with_integer_labels(gen_logits, m.masked_lm_ids)

    # The samples are constants for the rest of the step: no gradient reaches G through them.
    sampled = jax.vmap(gumbel_sample, (0, 0, None))(
        sample_keys, jax.lax.stop_gradient(gen_logits), self.temperature)
    corrupted = masking.scatter_positions(input_ids, m.masked_positions, sampled,
                                          m.masked_weights)
    # A sample that equals the original token counts as original.
    labels = (corrupted != input_ids).astype(jnp.float32) * real
    mlm_loss = weighted_mean(mlm_losses, m.masked_weights, denominators['mlm_count'])
    gen_sums = generator_metric_sums(gen_logits, m.masked_lm_ids, m.masked_weights, mlm_losses,
                                     sampled)

    if self.name in ('electra', 'electra_15', 'two_stage'):
      disc_logits = self._apply(params, Electra.discriminator_logits, disc_keys, deterministic,
                                corrupted, segment_ids, input_mask)
      disc_losses = optax.sigmoid_binary_cross_entropy(disc_logits, labels)
      disc_weights, disc_denominator = real, denominators['disc_count']
      if self.name == 'electra_15':  # D learns (and is scored) on the masked positions only.
        disc_weights = masked_position_indicator(input_ids, m)
        disc_denominator = denominators['mlm_count']
      disc_loss = weighted_mean(disc_losses, disc_weights, disc_denominator)
      gen_term, disc_term = self.gen_weight * mlm_loss, self.disc_weight * disc_loss
      if self.name == 'two_stage' and self.step is not None:
        in_stage_1 = jnp.asarray(self.step) < self.two_stage_generator_steps
        loss = jnp.where(in_stage_1, gen_term, disc_term)
      else:
        loss = gen_term + disc_term
      sums = dict(gen_sums, **disc_metric_sums(disc_logits, disc_losses, labels, disc_weights))
      if self.name == 'electra_15':
        sums['token_count'] = jnp.sum(real)
      return loss, sums

    if self.name == 'replace_mlm':
      logits = self._apply(params, Electra.discriminator_outputs, disc_keys, deterministic,
                           corrupted, segment_ids, input_mask, m.masked_positions)['mlm']
      losses = optax.softmax_cross_entropy_with_integer_labels(logits, m.masked_lm_ids)
      loss = self.gen_weight * mlm_loss + weighted_mean(losses, m.masked_weights,
                                                        denominators['mlm_count'])
      sums = dict(gen_sums, **full_mlm_metric_sums(logits, m.masked_lm_ids, losses,
                                                   m.masked_weights))
      return loss, dict(sums, token_count=jnp.sum(real))

    # all_tokens_mlm: predict every real token of the corrupted input, copy mechanism.
    every_position = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32),
                                      input_ids.shape)
    out = self._apply(params, Electra.discriminator_outputs, disc_keys, deterministic,
                      corrupted, segment_ids, input_mask, every_position)
    log_probs = copy_log_probs(out['mlm'], out['rtd'], corrupted)
    losses = -jnp.take_along_axis(log_probs, input_ids[..., None], axis=-1)[..., 0]
    loss = self.gen_weight * mlm_loss + weighted_mean(losses, real, denominators['disc_count'])
    copy_as_rtd_losses = optax.sigmoid_binary_cross_entropy(out['rtd'], labels)
    sums = dict(gen_sums, **full_mlm_metric_sums(log_probs, input_ids, losses, real))
    sums.update(disc_metric_sums(out['rtd'], copy_as_rtd_losses, labels, real))
    del sums['disc_loss_sum']  # Not a loss of this objective: the head is read as a copy gate.
    return loss, sums

  def loss_denominators(self, batch: Mapping[str, jax.Array]) -> dict:
    """The whole batch's masked-position and real-token counts (no randomness involved)."""
    return {
        'mlm_count': masking.num_predictions(
            batch['input_ids'], batch['input_mask'], special_ids=self.special_ids,
            mask_prob=self.mask_prob, max_predictions=self.max_predictions),
        'disc_count': jnp.sum(batch['input_mask'].astype(jnp.float32)),
    }

  def _apply(self, params, method, keys, deterministic, *inputs):
    """model.apply(method) with each row's dropout drawn from its own key in `keys` [B]."""
    variables = {'params': params}
    cfg = self.model.cfg
    if deterministic or (cfg.dropout_rate == 0 and cfg.attention_dropout_rate == 0):
      return self.model.apply(variables, *inputs, True, method=method)
    return self.model.apply(variables, *inputs, False, method=method,
                            rngs={'dropout': row_keys.row_keyed(keys)})


SAMPLER_BLOCK = 128


def gumbel_noise(rng, shape):
  """Gumbel(0, 1) noise with the official release's formula (its 1e-9 guards included)."""
  u = jax.random.uniform(rng, shape, jnp.float32)
  return -jnp.log(-jnp.log(u + 1e-9) + 1e-9)


def gumbel_sample(rng, logits, temperature: float, block: int = SAMPLER_BLOCK):
  """A token from softmax(logits / temperature) per row, by Gumbel-max in two levels.

  Flat Gumbel-max draws one uniform per vocabulary entry (18.5M per ELECTRA-Small step at the
  30,522 vocabulary; most of the step's vocabulary-sized cost). The maximum of Gumbel-perturbed
  logits over a block is Gumbel-distributed around the block's logsumexp, so Gumbel-max over
  the ~V/block block logsumexps picks the block with its exact softmax mass, and Gumbel-max
  inside that block picks the token: the same distribution as flat Gumbel-max (not the same
  draw for a given key), from V/block + block uniforms instead of V.
  """
  logits = logits.astype(jnp.float32) / temperature
  vocab = logits.shape[-1]
  block = min(block, vocab)
  full = vocab // block
  lead = logits.shape[:-1]

  # jax.nn.logsumexp gives -inf for a block whose entries are all -inf.
  block_lse = jax.nn.logsumexp(logits[..., :full * block].reshape(lead + (full, block)), axis=-1)
  if full * block != vocab:  # The last, shorter block.
    tail_lse = jax.nn.logsumexp(logits[..., full * block:], axis=-1, keepdims=True)
    block_lse = jnp.concatenate([block_lse, tail_lse], axis=-1)
  block_key, token_key = jax.random.split(rng)
  chosen = jnp.argmax(block_lse + gumbel_noise(block_key, block_lse.shape), axis=-1)
  # Read `block` entries from the chosen block's start, shifted left to stay inside the row for
  # the short last block; entries before the block's start (the shift) take no part.
  first = (chosen * block).reshape(-1)
  start = jnp.minimum(first, vocab - block)
  window = jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, block))(
      logits.reshape(-1, vocab), start)
  in_block = start[:, None] + jnp.arange(block) >= first[:, None]
  window = jnp.where(in_block, window, -jnp.inf).reshape(lead + (block,))
  offset = jnp.argmax(window + gumbel_noise(token_key, window.shape), axis=-1)
  return (start.reshape(lead) + offset).astype(jnp.int32)


def weighted_mean(values, weights, denominator=None):
  """sum(values * weights) / sum(weights), or over a given denominator (the whole batch's)."""
  denominator = jnp.sum(weights) if denominator is None else denominator
  return jnp.sum(values * weights) / (denominator + 1e-6)


def masked_position_indicator(input_ids, m: masking.MaskedBatch):
  """[B, S] float32: 1 at the masked positions of `m`, 0 elsewhere."""
  zeros = jnp.zeros(input_ids.shape, jnp.int32)
  ones = jnp.ones(m.masked_positions.shape, jnp.int32)
  return masking.scatter_positions(zeros, m.masked_positions, ones,
                                   m.masked_weights).astype(jnp.float32)


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


def generator_metric_sums(gen_logits, masked_lm_ids, masked_weights, mlm_losses, sampled):
  """The generator's MLM sums: loss, accuracy of its argmax and of its samples."""
  return {
      'mlm_loss_sum': jnp.sum(mlm_losses * masked_weights),
      'mlm_count': jnp.sum(masked_weights),
      'mlm_correct': jnp.sum((jnp.argmax(gen_logits, -1) == masked_lm_ids) * masked_weights),
      'sampled_correct': jnp.sum((sampled == masked_lm_ids) * masked_weights),
  }


def disc_metric_sums(disc_logits, disc_losses, labels, real):
  """The per-token head's sums over the tokens weighted by `real` (loss, accuracy, AUC, ...)."""
  predicted_replaced = (disc_logits > 0).astype(jnp.float32) * real
  auc_numerator, auc_pairs = auc_pair_counts(disc_logits, labels, real)
  return {
      'disc_loss_sum': jnp.sum(disc_losses * real),
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
  first = jnp.searchsorted(s, s, side='left')
  last = jnp.searchsorted(s, s, side='right')
  below, tied = neg_before[first], neg_before[last] - neg_before[first]
  return jnp.sum(pos * (below + 0.5 * tied)), jnp.sum(pos) * jnp.sum(neg)


def summarize(sums: Mapping[str, np.ndarray], gen_weight: float, disc_weight: float) -> dict:
  """Metric sums -> the reported ratios (floats), for the groups the objective produced.

  loss = gen_weight · mlm_loss + disc_weight · disc_loss + full_mlm_loss (terms present only).
  For two_stage that is the ELECTRA loss in both stages (each stage optimises one term).
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
    out['sampled_accuracy'] = ratio('sampled_correct', 'mlm_count')
  if 'full_mlm_count' in s:
    out['full_mlm_accuracy'] = ratio('full_mlm_correct', 'full_mlm_count')
  if 'disc_count' in s:
    out.update({
        'disc_accuracy': ratio('disc_correct', 'disc_count'),
        'disc_precision': ratio('disc_true_positive', 'disc_predicted_positive'),
        'disc_recall': ratio('disc_true_positive', 'disc_label_positive'),
        'disc_auc': ratio('auc_numerator', 'auc_pairs'),
        'replaced_fraction': ratio('disc_label_positive', 'disc_count'),
    })
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
  if 'disc_auc' in metrics:
    parts.append(f'disc_auc {metrics["disc_auc"]:.4f}')
  return ' | '.join(parts)
