r"""Restore a checkpoint and report pretraining metrics on held-out text.

  python -m electra_jax.evaluate --workdir=/tmp/electra_demo [--config=configs/demo.py] \
      [--eval_files=GLOB] [--num_batches=N] [--step=K]

Without --config the run's own WORKDIR/config.json is used.

Prints a human-readable table, then one JSON line (the last stdout line) with RTD/MLM metrics
and the unigram baseline: the MLM accuracy of always guessing the most frequent token.
"""
import time

import jax
from absl import flags
from ml_collections import config_flags

from electra_jax import checkpoint
from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import cpu_devices
from electra_jax import distributed
from electra_jax import eval_loop
from electra_jax import experiment as experiment_lib
from electra_jax import init_from
from electra_jax import paths
from electra_jax import saved_config
from electra_jax import train_state as ts
from electra_jax.data import sources

FLAGS = flags.FLAGS

def main(argv):
  del argv  # cli.run refuses stray arguments.
  if FLAGS.workdir is None:
    raise cli.UserError('--workdir is required, e.g. --workdir=/tmp/electra_demo')
  if FLAGS.num_batches < 0:
    raise cli.UserError(f'--num_batches={FLAGS.num_batches} must be >= 0 (0: the whole eval '
                        'set)')
  start = time.time()
  if FLAGS.config is None:  # The run's own config.
    config = saved_config.load(FLAGS.workdir)
  else:  # With the run's own copy of its vocabulary, as a resume reads it.
    config = init_from.saved_run_config(
        FLAGS.config, FLAGS.workdir, set(config_flags.get_override_values(FLAGS['config'])))
    config = saved_config.resumed_vocabulary(config_lib.resolve(config), FLAGS.workdir)
  mode = distributed.initialize_from(FLAGS)
  cpu_devices.configure_for(config, FLAGS.cpu_devices, single_process=mode == 'single')
  run = experiment_lib.Experiment.create(config, training=False)
  experiment_lib.check_saved_config_matches(
      FLAGS.workdir, run.config, "evaluate with the run's own config (leave out --config and "
      'its overrides)')
  ckpt, latest = checkpoint.open_for_reading(FLAGS.workdir)
  step = latest if FLAGS.step is None else FLAGS.step
  checkpoint.check_step(ckpt, step, '--step')
  abstract_state = run.abstract_state()
  # With --config, another optimizer (e.g. max_grad_norm=0) is another train state tree.
  other_tree = ('if --config differs from the run\'s config in its optimizer, leave it out; '
                'else ' if FLAGS.config is not None else '')
  with ckpt.reading(step, '--step', other_tree):
    state = ckpt.restore(step, abstract_state)
  ckpt.close()
  eval_step = ts.jit_eval_step(ts.make_eval_step(run.objective), run.mesh,
                               jax.tree.map(lambda x: x.sharding, abstract_state.params))
  # --eval_files, or the run's eval set (eval_files, or tfds_eval_split).
  try:
    corpus = sources.open_corpus(run.config, 'eval', FLAGS.eval_files)
  except sources.NoFiles:
    raise cli.UserError(f"the run in '{FLAGS.workdir}' has no eval set (its eval_files is "
                        'empty); pass --eval_files=GLOB') from None
  except cli.UserError as e:  # E.g. its files are on the machine that trained it.
    if FLAGS.eval_files is not None:
      raise
    raise cli.UserError(f"the run's eval set (config.json): {e}; or pass "
                        '--eval_files=GLOB') from None
  note = _held_out_note(run.config, corpus)
  if note:
    print(f'note: {note}', flush=True)
  metrics = eval_loop.evaluate_params(state.params, eval_step, run.config, run.tokenizer,
                                      run.mesh, num_batches=FLAGS.num_batches, corpus=corpus,
                                      progress=True)
  metrics['unigram_baseline_accuracy'] = eval_loop.unigram_baseline_accuracy(
      run.config, run.tokenizer, corpus, FLAGS.num_batches)
  for key, value in metrics.items():
    print(f'  {key:28s} {value:.4f}' if isinstance(value, float) else f'  {key:28s} {value}')
  held_out = corpus.source
  eval_set = (dict(eval_files=held_out['eval_files']) if 'eval_files' in held_out else
              dict(eval_tfds=f"{held_out['tfds_name']}:{held_out['tfds_split']}"))
  cli.print_result(dict(step=step, workdir=paths.absolute(FLAGS.workdir), **eval_set,
                        **metrics, wall_time_sec=round(time.time() - start, 2)))


def _held_out_note(config, corpus) -> str | None:
  """sources.held_out_note, or None where the run's training data is not readable here (its
  paths on the machine that trained): that must not stop an evaluation."""
  try:
    return sources.held_out_note(sources.training_source(config), corpus)
  except cli.UserError:
    return None


def _define_flags():
  """Defined when the command runs, so this module imports beside other commands' modules
  (tests, notebooks) without a clash on --config."""
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py); '
                                  "default: the workdir's saved config.json.", lock_config=True)
  flags.DEFINE_string('workdir', None, 'Training workdir holding checkpoints/.')
  flags.DEFINE_string('eval_files', None, 'Glob of held-out text or record files, read as '
                      "training reads its corpus (default: the run's eval set, config.eval_files "
                      'or, with tfds_name, tfds_eval_split).')
  flags.DEFINE_integer('num_batches', 0, 'Evaluate at most this many batches (0: all).')
  flags.DEFINE_integer('step', None, 'Checkpoint step to restore (default: the latest).')
  cpu_devices.define_flag()
  distributed.define_flags()


def run():
  _define_flags()
  flags.mark_flags_as_required(['workdir'])
  cli.run(main)


if __name__ == '__main__':
  run()
