r"""Fine-tune a pretrained ELECTRA discriminator on a GLUE task, SQuAD, your own files (classes,
regression) or your own CoNLL-format tagging files.

  python -m electra_jax.finetune --config=configs/finetune/glue.py --config.task=sst2 \
      --config.init_checkpoint=WORKDIR --workdir=FT_DIR [--config.num_seeds=10]

Runs num_seeds runs (seeds seed..seed+n-1), evaluates after every epoch, keeps each run's best
epoch as an Orbax checkpoint and reports the median over runs. Writes FT_DIR/{config.json,
results.json, seed_<k>/metrics.jsonl, seed_<k>/best/}; the last stdout line is a JSON summary.
Re-running the same command on an unfinished FT_DIR resumes it (SIGTERM / Ctrl-C save and exit 0).
"""
from absl import flags
from ml_collections import config_flags

from electra_jax import cli
from electra_jax import cpu_devices
from electra_jax import distributed
from electra_jax.finetune import loop

FLAGS = flags.FLAGS


def main(argv):
  del argv  # cli.run refuses stray arguments.
  distributed.require_one_process('python -m electra_jax.finetune')
  cpu_devices.configure_for(FLAGS.config, FLAGS.cpu_devices)
  cli.print_result(loop.finetune(FLAGS.config, FLAGS.workdir))


def _define_flags():
  config_flags.DEFINE_config_file('config', None, 'Fine-tuning config (configs/finetune/*.py); '
                                  'override any key with --config.KEY=VALUE.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Directory for results, per-seed metrics and the best '
                      'checkpoints: a new one, or an unfinished run of the same config to '
                      'resume.')
  cpu_devices.define_flag()


def run():
  _define_flags()
  flags.mark_flags_as_required(['config', 'workdir'])
  cli.run(main, keys_file='configs/finetune/glue.py')


if __name__ == '__main__':
  run()
