"""Export a training run as HF transformers ELECTRA directories.

  python -m electra_jax.export --workdir=WORKDIR --output=DIR [--what=discriminator|generator|both]
  python -m electra_jax.export --workdir=FT_DIR --output=DIR [--seed=K]

Writes what `transformers.ElectraForPreTraining.from_pretrained(DIR)` (and
`ElectraForMaskedLM` for the generator) loads: config.json, model.safetensors and tokenizer
files that `AutoTokenizer.from_pretrained(DIR)` reads offline. A fine-tuning workdir's
classifier (or regressor) becomes an `ElectraForSequenceClassification` directory, a tagger an
`ElectraForTokenClassification` one, a SQuAD run with span_head='bert' an
`ElectraForQuestionAnswering` one. The way in, from transformers weights to a run, is
`train --config.init_from=HF_DIR` (init_from.py). The conversions live in electra_jax/hf/.
"""
import os
import shutil
import tempfile
import time

from absl import flags

from electra_jax import checkpoint
from electra_jax import cli
from electra_jax import distributed
from electra_jax import paths
from electra_jax import objectives
from electra_jax import saved_config
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError
from electra_jax.finetune import saved_run
from electra_jax.finetune import tasks as tasks_lib
from electra_jax.hf import classifier as hf_classifier
from electra_jax.hf import files as hf_files
from electra_jax.hf import tokenizer_files


# Every name an export writes (transformers 4.x adds special_tokens_map.json, a slow tokenizer
# added_tokens.json): --overwrite replaces the whole directory, so it must hold nothing else.
EXPORT_NAMES = frozenset({
    'config.json', hf_files.SAFETENSORS_FILE, tokenizer_files.SPM_FILE,
    tokenizer_files.WORDPIECE_FILE, tokenizer_files.FAST_TOKENIZER_FILE,
    tokenizer_files.TOKENIZER_CONFIG_FILE, 'special_tokens_map.json', 'added_tokens.json'})
GENERATOR_DIR = 'generator'  # --what=both: the generator's own export.


def _foreign_entries(output: str) -> list[str]:
  """What in `output` (and its generator/) an export never writes, e.g. ['README.md', 'runs/']."""
  foreign = []
  for name in paths.listdir(output):
    path = paths.join(output, name)
    if name == GENERATOR_DIR and paths.is_dir(path):
      foreign += [f'{name}/{n}' for n in paths.listdir(path) if n not in EXPORT_NAMES]
    elif name not in EXPORT_NAMES:
      foreign.append(name + '/' if paths.is_dir(path) else name)
  return foreign


def _check_output(output: str, overwrite: bool, workdir: str) -> str:
  """The output directory; refused where writing it would replace the run being exported or
  anything but an earlier export (--overwrite replaces the directory whole, so a file an export
  never writes would be deleted with it)."""
  output = paths.absolute(output)
  paths.check_output_name(output, '--output')
  if paths.contains(output, workdir):
    raise UserError(f"--output '{output}' is the workdir or a directory holding it, and "
                    'the export would replace the run; choose a directory outside it (or '
                    'inside it, e.g. WORKDIR/hf)')
  inside = saved_run.run_folder_above(output)
  if inside is not None:
    raise UserError(f"--output '{output}' lies in {inside[1]}/ of the run in '{inside[0]}', "
                    'among its own files; choose a directory outside it, e.g. WORKDIR/hf')
  if paths.is_file(output):
    raise UserError(f"--output '{output}' is a file; pass a directory path")
  if not paths.is_remote(output) and os.path.ismount(os.path.realpath(output)):
    raise UserError(f"--output '{output}' is a mount point, which an export cannot replace (it "
                    'writes a new directory beside it and renames that into place); pass a '
                    f"directory inside it, e.g. {paths.join(output, 'hf')}")
  if paths.listdir(output):
    if not overwrite:
      raise UserError(f"--output '{output}' exists and is not empty; pass --overwrite to "
                      'replace it or choose another directory')
    if not paths.exists(paths.join(output, hf_files.SAFETENSORS_FILE)):
      raise UserError(f"--output '{output}' is not an earlier export (it has no "
                      f'{hf_files.SAFETENSORS_FILE}), and --overwrite replaces only those; '
                      'choose another directory or empty it yourself')
    foreign = _foreign_entries(output)
    if foreign:
      more = f' and {len(foreign) - 2} more' if len(foreign) > 2 else ''
      raise UserError(f"--output '{output}' holds {', '.join(foreign[:2])}{more}, which an "
                      'export never writes, and --overwrite replaces the whole directory; move '
                      'them out or choose another directory')
  paths.check_writable_dir(paths.parent(output), '--output (its parent)')
  return output


def _in_temp_dir(output: str, write) -> None:
  """Runs write(local_dir), then moves the result to `output`, replacing what was there only
  at the end. transformers writes local files: for a remote `output` they are uploaded to a
  staging directory beside it first (on object stores the final move copies file by file). A
  symlinked `output` stays a link: the directory it points to is the one replaced."""
  output = paths.canonical(output)
  remote = paths.is_remote(output)
  tag = f'{os.getpid()}-{int(time.time())}'
  staging = f'{output}.tmp-{tag}'
  local = tempfile.mkdtemp(prefix='electra_export_') if remote else staging
  old = None
  try:
    with paths.storage_errors(output, '--output'):  # A full disk: one line naming --output.
      write(local)
    if remote:
      paths.copy_tree(local, staging)
    if paths.exists(output):
      old = f'{output}.old-{tag}'
      paths.rename(output, old)
    paths.rename(staging, output)
  except BaseException:
    paths.remove_tree(staging)
    if old is not None and not paths.exists(output):
      paths.rename(old, output)
      old = None
    raise
  finally:
    if remote:
      shutil.rmtree(local, ignore_errors=True)
  if old is not None:
    paths.remove_tree(old)


def check_exportable(config, networks):
  """HF ELECTRA has one layout: an RTD discriminator and a generator sharing embeddings."""
  if not objectives.get(config.objective).exportable:
    supported = tuple(n for n, o in objectives.OBJECTIVES.items() if o.exportable)
    raise UserError(f'objective {config.objective!r} trains no ELECTRA networks to export '
                    f'(export supports {supported}); fine-tune the workdir directly '
                    'with --config.init_checkpoint=WORKDIR')
  if config.relative_attention_span:
    raise UserError(f'config.relative_attention_span={config.relative_attention_span}: '
                    "transformers' ELECTRA has no relative attention bias, so this model "
                    'cannot be exported; fine-tune the workdir directly with '
                    '--config.init_checkpoint=WORKDIR')
  if 'generator' in networks and not objectives.get(config.objective).layout_for(config).generator:
    raise UserError('config.uniform_generator=True: the run has no generator network to export; '
                    'export only --what=discriminator')
  if 'generator' in networks and objectives.get(config.objective).layout.cloze_generator:
    raise UserError(f'objective {config.objective!r}: its two-tower cloze generator has no '
                    'transformers class; export only --what=discriminator')
  if 'generator' in networks and config.tie == 'none':
    raise UserError("config.tie='none': the generator has its own embeddings "
                    "(generator_embeddings), not the shared ones the export writes with it; "
                    'export only --what=discriminator')
  if 'generator' in networks and config.tie == 'all':
    raise UserError("config.tie='all': the generator has no encoder of its own (it runs the "
                    "discriminator's, and shares its embeddings), and the export writes a "
                    "generator's own encoder; export only --what=discriminator")


def export_workdir(workdir: str, output: str, what: str = 'discriminator',
                   step: int | None = None, overwrite: bool = False) -> dict:
  """Writes a workdir's checkpoint as transformers directories; returns a summary.

  'discriminator' or 'generator': that model in `output`; 'both': the discriminator in
  `output` and the generator in `output/generator`. Each directory has its tokenizer files.
  """
  if what not in ('discriminator', 'generator', 'both'):
    raise UserError(f"--what={what!r} must be 'discriminator', 'generator' or 'both'")
  config = saved_config.load(workdir)
  output = _check_output(output, overwrite, workdir)
  layout = {'discriminator': {'discriminator': ''}, 'generator': {'generator': ''},
            'both': {'discriminator': '', 'generator': GENERATOR_DIR}}[what]
  check_exportable(config, layout)
  params, step = checkpoint.read_params(workdir, step, '--step')
  pad_id = tokenizer_lib.for_config(config).pad_id

  def write(tmp):
    for network, sub in layout.items():
      directory = os.path.join(tmp, sub)
      print(f'Writing the {network} to {paths.join(output, sub)}', flush=True)
      hf_files.write_model(params, config, network, directory, pad_id)
      tokenizer_files.write_tokenizer(config.vocab_file, directory,
                                      config.max_position_embeddings, config.do_lower_case)

  _in_temp_dir(output, write)
  return dict(output=output, what=what, step=int(step), workdir=paths.absolute(workdir),
              directories={n: paths.join(output, s) if s else output
                           for n, s in layout.items()})


def export_finetuned(workdir: str, output: str, seed: int | None = None,
                     overwrite: bool = False) -> dict:
  """Writes a fine-tuning run's best epoch (of its best seed, or `seed`) as an
  ElectraForSequenceClassification (a tagger: ElectraForTokenClassification; SQuAD:
  ElectraForQuestionAnswering) directory with its tokenizer; returns a summary."""
  run = saved_run.load(workdir)
  hf_classifier.check_exportable(run.task, run.model_config, run.config)
  output = _check_output(output, overwrite, run.workdir)
  seed = run.best_seed() if seed is None else seed
  params, step = run.read_params(seed)

  def write(tmp):
    print(f'Writing the {run.task.name} {hf_classifier.architecture(run.task)} (seed {seed}, '
          f'step {step}) to {output}', flush=True)
    hf_files.write_dir(tmp, hf_classifier.config_dict(run.model_config, run.task,
                                                      run.config.dropout_rate,
                                                      run.tokenizer.pad_id),
                       hf_classifier.state_dict(params, run.model_config, run.task))
    # A classifier's: the length it was fine-tuned and predicts at (a pipeline with
    # truncation=True cuts a long text where predict does). A tagger's: the positions' (the
    # token-classification pipeline always cuts there; predict reads a long sentence in
    # windows).
    length = (run.model_config.max_position_embeddings if run.task.kind == tasks_lib.TAGGING
              else run.config.max_seq_length)
    tokenizer_files.write_tokenizer(run.network.vocab_file, tmp, length,
                                    run.network.do_lower_case)

  _in_temp_dir(output, write)
  return dict(output=output, what=hf_classifier.architecture(run.task), task=run.task.name,
              seed=seed, step=step, workdir=run.workdir, directories={'classifier': output})


# --- CLI ------------------------------------------------------------------------------------

FLAGS = flags.FLAGS


def _define_flags():
  """Defined when the command runs, not on import: fine-tuning imports this module as a
  library next to its own --workdir/--output flags."""
  flags.DEFINE_string('workdir', None, 'Training workdir to export (config.json + checkpoints/).')
  flags.DEFINE_string('output', None, 'The transformers directory to write.')
  flags.DEFINE_enum('what', 'discriminator', ['discriminator', 'generator', 'both'],
                    "Which network to export; 'both' puts the generator in OUTPUT/generator.")
  flags.DEFINE_integer('step', None, 'Checkpoint step to export (default: the latest).')
  flags.DEFINE_integer('seed', None, 'A fine-tuning workdir: the seed whose best epoch is '
                       'exported (default: the seed that scored best).')
  flags.DEFINE_bool('overwrite', False, 'Replace an earlier export in --output (refused if it '
                    'holds files an export never writes).')


def main(argv):
  del argv  # cli.run refuses stray arguments.
  distributed.require_one_process('python -m electra_jax.export')
  start = time.time()
  if FLAGS.workdir is None or FLAGS.output is None:
    raise UserError('pass --workdir=WORKDIR (a training run) and --output=DIR (the transformers '
                    'directory to write); to start a run from transformers weights use '
                    'python -m electra_jax.train --config.init_from=HF_DIR')
  finetuned = saved_run.is_finetuning_workdir(FLAGS.workdir)
  if finetuned:
    if FLAGS['what'].present or FLAGS.step is not None:
      raise UserError(f"'{FLAGS.workdir}' is a fine-tuning workdir: it exports its classifier; "
                      'drop --what and --step (--seed=K picks a seed)')
  elif FLAGS.seed is not None:
    raise UserError(f'--seed={FLAGS.seed} is for fine-tuning workdirs; '
                    f"'{FLAGS.workdir}' is a pretraining one (--step=K picks a checkpoint)")
  if paths.is_bucket_root(FLAGS.output):  # Staging goes beside it: no room there.
    raise UserError(f"--output '{FLAGS.output}' is a bucket's root; pass a folder in it, e.g. "
                    f"{paths.absolute(FLAGS.output)}/hf")
  # A run refused after --output's folders are made (an unexportable config, a missing step or
  # seed) leaves none of them behind.
  with paths.new_dirs_removed_on_failure(paths.parent(FLAGS.output)):
    if finetuned:
      result = export_finetuned(FLAGS.workdir, FLAGS.output, FLAGS.seed, FLAGS.overwrite)
    else:
      result = export_workdir(FLAGS.workdir, FLAGS.output, FLAGS.what, FLAGS.step,
                              FLAGS.overwrite)
  print(f"Wrote {result['output']} in {time.time() - start:.1f}s", flush=True)
  cli.print_result(dict(result, wall_time_sec=round(time.time() - start, 2)))


def run():
  """Console entry point (electra-export)."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  run()
