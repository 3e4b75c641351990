"""Restore a checkpoint and report pretraining metrics on held-out text.

  python -m electra_jax.evaluate --config=configs/demo.py --workdir=/tmp/electra_demo \
      [--eval_files=GLOB] [--num_batches=N] [--step=K]

Prints a human-readable table, then one JSON line (the last stdout line) with RTD/MLM metrics
and the unigram baseline: the MLM accuracy of always guessing the most frequent token.
"""
import time

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from electra_jax import cli
from electra_jax import objective as objective_lib
from electra_jax import parallel
from electra_jax import experiment as experiment_lib
from electra_jax import train_state as ts
from electra_jax.data import pipeline

config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py).',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Training workdir holding checkpoints/.')
flags.DEFINE_string('eval_files', None, 'Glob of held-out text (default: config.eval_files).')
flags.DEFINE_integer('num_batches', 0, 'Evaluate at most this many batches (0: all).')
flags.DEFINE_integer('step', None, 'Checkpoint step to restore (default: the latest).')
FLAGS = flags.FLAGS

EVAL_SEED_SALT = 0x45564C  # Fixed masking/sampling randomness for every evaluation.


def evaluate_params(params, eval_step, c, tokenizer, mesh, num_batches=None, files=None):
  """Metrics of `params` on the eval set; identical masking every call (comparable over time)."""
  rng = jax.random.fold_in(jax.random.key(c.seed), EVAL_SEED_SALT)
  sums, num_batches_done = None, 0
  batches = pipeline.make_eval_iterator(c, tokenizer, jax.process_index(), jax.process_count(),
                                        num_batches=num_batches or None, files=files)
  for i, local_batch in enumerate(batches):
    batch = parallel.global_batch(local_batch, mesh)
    step_sums = eval_step(params, batch, jax.random.fold_in(rng, i))
    sums = step_sums if sums is None else jax.tree.map(lambda a, b: a + b, sums, step_sums)
    num_batches_done += 1
  if sums is None:
    return {}
  metrics = objective_lib.summarize(jax.device_get(sums), c.gen_weight, c.disc_weight)
  metrics['num_batches'] = num_batches_done
  metrics['num_tokens'] = int(np.asarray(jax.device_get(sums['disc_count'])))
  return metrics


def unigram_baseline_accuracy(c, tokenizer, files=None) -> float:
  """MLM accuracy of always predicting the most frequent maskable token."""
  counts = np.asarray(pipeline.count_token_frequencies(c, tokenizer, files=files), np.float64)
  counts[list(tokenizer.special_ids)] = 0
  return float(counts.max() / counts.sum()) if counts.sum() else float('nan')


def main(argv):
  del argv
  if FLAGS.config is None or FLAGS.workdir is None:
    raise cli.UserError('both --config and --workdir are required, e.g. '
                        '--config=configs/demo.py --workdir=/tmp/electra_demo')
  start = time.time()
  run = experiment_lib.Experiment.create(FLAGS.config)
  experiment_lib.check_saved_config_matches(FLAGS.workdir, run.config)
  ckpt, latest = experiment_lib.open_checkpoints(FLAGS.workdir)
  step = latest if FLAGS.step is None else FLAGS.step
  if step not in ckpt.all_steps():
    raise cli.UserError(f'--step={step} is not a checkpoint in {ckpt.directory}; '
                        f'available: {ckpt.all_steps()}')
  state = ckpt.restore(step, run.abstract_state())
  ckpt.close()
  eval_step = ts.jit_eval_step(ts.make_eval_step(run.objective), run.mesh)
  files = FLAGS.eval_files or run.config.eval_files
  metrics = evaluate_params(state.params, eval_step, run.config, run.tokenizer, run.mesh,
                            num_batches=FLAGS.num_batches, files=files)
  if not metrics:
    raise cli.UserError(f"eval files '{files}' produced no examples; check --eval_files")
  metrics['unigram_baseline_accuracy'] = unigram_baseline_accuracy(run.config, run.tokenizer,
                                                                   files)
  for key, value in metrics.items():
    print(f'  {key:28s} {value:.4f}' if isinstance(value, float) else f'  {key:28s} {value}')
  cli.print_result(dict(step=step, workdir=FLAGS.workdir, eval_files=files, **metrics,
                        wall_time_sec=round(time.time() - start, 2)))


def run():
  flags.mark_flags_as_required(['config', 'workdir'])
  cli.run(main)


if __name__ == '__main__':
  run()
