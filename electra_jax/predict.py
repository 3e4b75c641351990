r"""Predictions of a fine-tuned model: GLUE leaderboard files, SQuAD answers, or labels for a file.

  python -m electra_jax.predict --workdir=FT_DIR --output=DIR --split=test
  python -m electra_jax.predict --workdir=FT_DIR --output=DIR --glue_test=test.parquet
  python -m electra_jax.predict --workdir=FT_DIR --output=DIR --input=FILE [--seed=K]

--split=test of a GLUE run writes the leaderboard's files from TFDS, --glue_test from GLUE's own
test files (offline); --input labels any file.
FT_DIR is a finished `python -m electra_jax.finetune` run; its best seed's best epoch predicts
(--seed picks another). Where the data has labels the task's metrics are reported too. The last
stdout line is a JSON summary. Output files: electra_jax/finetune/predictions.py.
"""
import time

from absl import flags

from electra_jax import cli
from electra_jax import distributed
from electra_jax.errors import UserError
from electra_jax.finetune import predictions
from electra_jax.finetune import saved_run

FLAGS = flags.FLAGS


def _define_flags():
  flags.DEFINE_string('workdir', None, 'A finished fine-tuning workdir (python -m '
                      'electra_jax.finetune --workdir=...).')
  flags.DEFINE_string('output', None, 'Directory for the prediction files (created).')
  flags.DEFINE_multi_string('input', [], 'A file to predict: CSV/TSV/JSON Lines/Parquet/Arrow with '
                            "the run's text columns (text, or text_a and text_b, or its "
                            'text_columns) and optionally its label column; SQuAD tasks: '
                            'SQuAD-format JSON. Repeat for several.')
  flags.DEFINE_multi_string('glue_test', [], "A GLUE task's test file (the Hub's Parquet, GLUE's "
                            'TSV), written as the leaderboard\'s file (SST-2.tsv) keyed by the '
                            "file's idx/index/id; MNLI names each: MNLI-m=FILE, MNLI-mm=FILE, "
                            'AX=FILE. Repeatable.')
  flags.DEFINE_string('split', None, "A TFDS split of the task (validation, test, ...); 'test' "
                      'of a GLUE task writes its leaderboard files (MNLI: MNLI-m, MNLI-mm, AX).')
  flags.DEFINE_integer('seed', None, "The run whose best epoch predicts (default: the seed "
                       'that scored best).')
  flags.DEFINE_integer('batch_size', None, 'Examples per call, a multiple of the devices '
                       "(default: the run's eval_batch_size, rounded up to one).")
  flags.DEFINE_integer('max_examples', 0, 'Predict at most this many examples of each input '
                       '(0: all); for quick checks.')
  flags.DEFINE_bool('overwrite', False, 'Replace prediction files already in --output.')


def main(argv):
  del argv  # cli.run refuses stray arguments.
  distributed.require_one_process('python -m electra_jax.predict')
  start = time.time()
  missing = [flag for flag, value in (('--workdir', FLAGS.workdir), ('--output', FLAGS.output))
             if value is None]
  if missing:
    raise UserError(f"{' and '.join(missing)} missing; pass --workdir=FT_DIR (a fine-tuning "
                    'run) and --output=DIR (where the predictions go)')
  if not FLAGS.input and not FLAGS.glue_test and FLAGS.split is None:
    raise UserError('pass --input=FILE (a file to predict), --glue_test=FILE (a GLUE test file '
                    "for the leaderboard) or --split=SPLIT (a TFDS split of the task; 'test' for "
                    "GLUE's leaderboard files)")
  bad = []
  if FLAGS.max_examples < 0:
    bad.append(f'--max_examples={FLAGS.max_examples} must be >= 0 (0: every example)')
  if FLAGS.batch_size is not None and FLAGS.batch_size <= 0:
    bad.append(f"--batch_size={FLAGS.batch_size} must be > 0 (or leave it out: the run's "
               'eval_batch_size)')
  if bad:
    raise UserError('; '.join(bad))
  run = saved_run.load(FLAGS.workdir)
  parts = [predictions.file_part(run, path, FLAGS.max_examples) for path in FLAGS.input]
  parts += [predictions.glue_test_part(run, spec, FLAGS.max_examples) for spec in FLAGS.glue_test]
  if FLAGS.split is not None:
    parts += predictions.split_parts(run, FLAGS.split, FLAGS.max_examples)
  result = predictions.predict(run, parts, FLAGS.output, FLAGS.seed, FLAGS.batch_size,
                               FLAGS.overwrite)
  cli.print_result(dict(result, wall_time_sec=round(time.time() - start, 2)))


def run():
  """Console entry point (electra-predict)."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  run()
