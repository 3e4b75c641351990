"""Save and restore time of one training checkpoint (train state + loop state), on any path.

  python benchmarks/checkpoint_io.py --config=configs/small.py --workdir=/tmp/ckpt_io [--rounds=3]
  STORAGE_EMULATOR_HOST=http://127.0.0.1:4443 python benchmarks/checkpoint_io.py \
      --config=configs/small.py --workdir=gs://electra-demo/ckpt_io

Builds the config's step-0 state (parameters + AdamW moments, float32), then per round: saves
it through the training Checkpointer and waits until the save is complete, then restores it
the way a resumed run does (restore_latest_valid onto the same shardings). Prints one JSON line
with the checkpoint size and the median seconds of each.
"""
import statistics
import time

import jax
from absl import flags
from ml_collections import config_flags

from electra_jax import checkpoint
from electra_jax import cli
from electra_jax import experiment as experiment_lib
from electra_jax import paths

FLAGS = flags.FLAGS


def main(argv):
  del argv
  if FLAGS.rounds < 1:
    raise cli.UserError(f'--rounds={FLAGS.rounds} must be >= 1')
  exp = experiment_lib.Experiment.create(FLAGS.config)
  directory = checkpoint.directory_of(FLAGS.workdir)
  if paths.exists(directory):
    raise cli.UserError(f'{directory} exists; pass a new --workdir')
  state = exp.init_state()
  abstract = exp.abstract_state()
  size = checkpoint.size_bytes(abstract)
  saves, restores = [], []
  for step in range(1, FLAGS.rounds + 1):
    ckpt = checkpoint.Checkpointer(directory, keep=1)
    start = time.perf_counter()
    ckpt.save(step, state, force=True, loop_state=dict(window=None, data_position=0))
    ckpt.close()  # Waits for the async write and its commit.
    saves.append(time.perf_counter() - start)
    start = time.perf_counter()
    ckpt = checkpoint.Checkpointer(directory, keep=1)
    restored_step, restored, _ = ckpt.restore_latest_valid(abstract)
    jax.block_until_ready(restored)
    restores.append(time.perf_counter() - start)
    ckpt.close()
    assert restored_step == step
    print(f'round {step}: save {saves[-1]:.2f} s, restore {restores[-1]:.2f} s', flush=True)
  cli.print_result(dict(workdir=FLAGS.workdir, checkpoint_bytes=size, rounds=FLAGS.rounds,
                        save_sec=round(statistics.median(saves), 3),
                        restore_sec=round(statistics.median(restores), 3),
                        save_sec_all=[round(t, 3) for t in saves],
                        restore_sec_all=[round(t, 3) for t in restores]))


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Where the checkpoints go (a local path or gs://...); '
                      'its checkpoints/ must not exist yet.')
  flags.DEFINE_integer('rounds', 3, 'Save + restore rounds (one step each).')
  flags.mark_flags_as_required(['config', 'workdir'])
  cli.run(main)
