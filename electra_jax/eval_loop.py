"""Held-out evaluation shared by train (periodic) and evaluate (CLI)."""
import jax
import numpy as np
import tqdm

from electra_jax.objectives import metrics as objective_metrics
from electra_jax import parallel
from electra_jax.data import pipeline

EVAL_SEED_SALT = 0x45564C  # Fixed masking/sampling randomness for every evaluation.


def eval_batches(c, tokenizer, mesh, num_batches=None, corpus=None):
  """The eval set's global batches, as evaluate_params passes them to the eval step.
  `corpus`: the eval set (sources.open_corpus), if opened already. On devices that do not
  divide eval_batch_size (evaluate on another machine), all-zero rows after the examples fill
  each batch up to a multiple: the examples keep their rows, so their masks and metrics."""
  rows_per_batch = parallel.fill_up_to_devices(c.eval_batch_size, mesh)
  batches = pipeline.make_eval_iterator(
      c, tokenizer, parallel.process_rows(mesh, rows_per_batch), num_batches=num_batches or None,
      corpus=corpus, rows_per_batch=rows_per_batch)
  for local_batch in batches:
    yield parallel.global_batch(local_batch, mesh)


def evaluate_params(params, eval_step, c, tokenizer, mesh, num_batches=None, corpus=None,
                    progress: bool = False):
  """Metrics of `params` on the eval set; identical masking every call (comparable over time).
  `progress`: a bar of batches on stderr (process 0), for the evaluate command."""
  rng = jax.random.fold_in(jax.random.key(c.seed), EVAL_SEED_SALT)
  # Each batch's sums are added on the host in float64 (in float32, 3,000 batches of 16k tokens
  # miscount tokens by ~50 in 49M), one batch behind, so the device runs on meanwhile.
  sums, pending, num_batches_done = None, None, 0

  def add(sums, step_sums):
    step_sums = jax.tree.map(lambda x: np.asarray(x, np.float64), jax.device_get(step_sums))
    return step_sums if sums is None else jax.tree.map(np.add, sums, step_sums)

  batches = tqdm.tqdm(eval_batches(c, tokenizer, mesh, num_batches, corpus), 'evaluating',
                      total=num_batches or None, unit='batch', leave=False,
                      disable=not progress or jax.process_index() != 0)
  for i, batch in enumerate(batches):
    step_sums = eval_step(params, batch, jax.random.fold_in(rng, i))
    if pending is not None:
      sums = add(sums, pending)
    pending = step_sums
    num_batches_done += 1
  if pending is None:
    return {}
  sums = add(sums, pending)
  metrics = objective_metrics.summarize(sums, c.gen_weight, c.disc_weight)
  metrics['num_batches'] = num_batches_done
  metrics['num_tokens'] = objective_metrics.num_tokens(sums)
  return metrics


def unigram_baseline_accuracy(c, tokenizer, corpus=None, num_batches=None) -> float:
  """MLM accuracy of always predicting the most frequent maskable token, over the examples an
  evaluation of `num_batches` (None or 0: all) reads: a large eval set is not read in full."""
  num_examples = (num_batches or 0) * c.eval_batch_size
  counts = pipeline.count_token_frequencies(c, tokenizer, corpus, num_examples).astype(np.float64)
  return float(counts.max() / counts.sum()) if counts.sum() else float('nan')
