r"""Input-pipeline throughput alone, for raw text and prepared shards, 0/1/2 worker processes.

  python -m electra_jax.data.benchmark --config=configs/small.py [--num_batches=200] \
      [--workers=0,1,2] [--data_dir=DIR] [--train_steps=5]

Reads `num_batches` training batches (after a first, untimed one that pays for worker start-up)
through the same iterator training uses, and reports examples/s and tokens/s (batch x
max_seq_length, the unit of the train step's tokens_per_sec). Without --data_dir the corpus is
prepared into a temporary directory first (its time is reported). --train_steps=N also times N
steps of the config's model on this machine, so the two rates can be compared. Prints a table;
the last stdout line is JSON.
"""
import hashlib
import os
import tempfile
import time

from absl import flags
from ml_collections import config_flags

from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import paths
from electra_jax.data import pipeline
from electra_jax.data import prepare
from electra_jax.data import shards
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError

FLAGS = flags.FLAGS


def time_pipeline(config, tokenizer, num_batches: int) -> dict:
  """Builds the train iterator and times `num_batches` batches after the first."""
  start = time.perf_counter()
  iterator = pipeline.make_train_iterator(config, tokenizer)
  first = next(iterator)
  startup = time.perf_counter() - start
  digest = hashlib.sha256(first['input_ids'].tobytes())
  real_tokens = 0
  start = time.perf_counter()
  for _ in range(num_batches):
    batch = next(iterator)
    real_tokens += int(batch['input_mask'].sum())
    digest.update(batch['input_ids'][:1].tobytes())
  seconds = time.perf_counter() - start
  iterator.close()
  examples = num_batches * config.train_batch_size
  return dict(startup_sec=round(startup, 2), examples_per_sec=round(examples / seconds, 1),
              tokens_per_sec=round(examples * config.max_seq_length / seconds),
              real_tokens_per_sec=round(real_tokens / seconds), batches_sha256=digest.hexdigest())


def time_train_steps(config, num_steps: int) -> float:
  """tokens/s (batch x max_seq_length per step) of the config's train program on the first
  batch, called back to back as training calls it (benchmark.JaxStep), data excluded;
  num_steps rounded up to whole calls of config.steps_per_execution."""
  from electra_jax import benchmark  # pylint: disable=import-outside-toplevel
  exp, host_batch = benchmark.build(config, 'corpus')
  c = exp.config
  step = benchmark.JaxStep(exp, host_batch, warmup=1)
  return c.train_batch_size * c.max_seq_length / step.run_pipelined(
      benchmark.whole_calls(num_steps, c.steps_per_execution))


def main(argv):
  del argv  # cli.run refuses stray arguments.
  workers = cli.integers('workers', FLAGS.workers, 0, '0,1,2')
  if FLAGS.num_batches < 1 or FLAGS.train_steps < 0:
    raise UserError(f'--num_batches={FLAGS.num_batches} must be >= 1 and --train_steps='
                    f'{FLAGS.train_steps} >= 0 (0 skips the train step)')
  c = config_lib.resolve(FLAGS.config)
  tokenizer = tokenizer_lib.for_config(c)
  if FLAGS.data_dir:  # Checked before any timing: its metadata, shards, vocabulary and length.
    shards.check_compatible(shards.read_metadata(paths.as_found(FLAGS.data_dir)),
                            FLAGS.data_dir, c, tokenizer)
  print(f'Timing {FLAGS.num_batches} batches of {c.train_batch_size} x {c.max_seq_length} on '
        f'{os.cpu_count()} CPU core(s), workers {workers}', flush=True)
  prepare_sec = None
  with tempfile.TemporaryDirectory(prefix='electra_data_bench_') as tmp:
    data_dir = FLAGS.data_dir
    if not data_dir:
      data_dir = os.path.join(tmp, 'prepared')
      prepare_sec = prepare.prepare(c, data_dir, progress=False)['seconds']
    rows = []
    for source in ('raw', 'prepared'):
      for num_workers in workers:
        overrides = dict(num_data_workers=num_workers,
                         train_data_dir=data_dir if source == 'prepared' else '')
        config = config_lib.resolve(c)
        config.update(overrides)
        result = dict(source=source, workers=num_workers,
                      **time_pipeline(config, tokenizer, FLAGS.num_batches))
        rows.append(result)
        print(f"{source:>9} workers={num_workers} | startup {result['startup_sec']:7.2f}s | "
              f"{result['examples_per_sec']:10.1f} examples/s | "
              f"{result['tokens_per_sec']:11.0f} tokens/s", flush=True)
  summary = dict(config_batch=c.train_batch_size, max_seq_length=c.max_seq_length,
                 num_batches=FLAGS.num_batches, cpu_count=os.cpu_count(),
                 prepare_sec=prepare_sec, results=rows,
                 same_batches_for_all_runs=len({r['batches_sha256'] for r in rows}) == 1)
  if FLAGS.train_steps:
    train_tps = time_train_steps(c, FLAGS.train_steps)
    best = max(r['tokens_per_sec'] for r in rows if r['source'] == 'prepared')
    summary.update(train_step_tokens_per_sec=round(train_tps, 1),
                   prepared_over_train_step=round(best / train_tps, 1))
    print(f'train step ({c.model_size}): {train_tps:.0f} tokens/s; the prepared pipeline reads '
          f'{best / train_tps:.0f}x that', flush=True)
  for row in rows:
    del row['batches_sha256']
  cli.print_result(summary)


def _define_flags():
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py); '
                                  'override any key with --config.KEY=VALUE.', lock_config=True)
  flags.DEFINE_integer('num_batches', 200, 'Timed batches per measurement.')
  flags.DEFINE_list('workers', ['0', '1', '2'], 'Worker-process counts to measure (0: a thread '
                    'in this process).')
  flags.DEFINE_string('data_dir', None, 'Prepared directory to read (default: prepare the '
                      'config\'s corpus into a temporary directory first).')
  flags.DEFINE_integer('train_steps', 0, 'Also time this many train steps of the config\'s model '
                       '(after one compile step) for comparison; 0 skips.')


def run():
  _define_flags()
  flags.mark_flags_as_required(['config'])
  cli.run(main)


if __name__ == '__main__':
  run()
