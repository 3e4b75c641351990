"""The resolved config a run keeps in WORKDIR/config.json: its one writer and its one reader.

A run also keeps its vocabulary beside it (WORKDIR/spm.model or vocab.txt, written at its
start): the config loaded here names that copy, so evaluating, exporting, fine-tuning or
resuming a run reads the ids it was trained with, wherever the file it was started with is now
(another machine, rebuilt, deleted).

Train, evaluate, export, fine-tuning, init_from and predict all load a saved config here. A
workdir written before a key existed still loads: a key it lacks takes today's default from
configs/base_config.py (fine-tuning workdirs: configs/finetune/glue.py; the behaviour the key
was added with), a key since removed is dropped, a renamed one is read under its new name.
"""
import copy
import json
import shlex

import ml_collections

from configs import base_config
from configs.finetune import glue as finetune_config
from electra_jax import atomic
from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import metric_writer
from electra_jax import paths
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError, first_line
from electra_jax.hf import tokenizer_files

FILE_NAME = 'config.json'
# The file other commands keep at the top of their output folders (data.prepare's metadata,
# experiments.compare's spec), with what such a folder holds and how to use it: named when one
# is passed as a run's --workdir.
OTHER_OUTPUTS = (
    ('train_metadata.json', 'prepared training data (python -m electra_jax.data.prepare); train '
     'on it with --config.train_data_dir={}'),
    ('compare.json', 'a comparison (python -m electra_jax.experiments.compare); its runs are '
     '{0}/pretrain/NAME and {0}/finetune/NAME/STEP'),
)
# Pretraining keys renamed since workdirs were first written: old name -> new name.
RENAMED_KEYS = {'tfds_text_key': 'text_key'}  # 2026-11-28: JSON Lines files use it too.


def path(workdir) -> str:
  return paths.join(paths.absolute(workdir), FILE_NAME)


def exists(workdir) -> bool:
  return paths.exists(path(workdir))


def vocabulary_path(workdir, vocab_file: str) -> str:
  """Where a run in `workdir` keeps its copy of `vocab_file` (a WordPiece vocab.txt or a
  sentencepiece model), named as export names it in transformers' directories."""
  name = (tokenizer_files.WORDPIECE_FILE if tokenizer_lib.is_wordpiece_vocab(vocab_file) else
          tokenizer_files.SPM_FILE)
  return paths.join(paths.absolute(workdir), name)


def keep_vocabulary(workdir, c: ml_collections.ConfigDict):
  """Copies the vocabulary `c` names into `workdir` (unless it is that copy already)."""
  named = paths.as_found(c.vocab_file)
  kept = vocabulary_path(workdir, c.vocab_file)
  if named != kept:
    atomic.write_bytes(kept, paths.read_bytes(named))


def resumed_vocabulary(c: ml_collections.ConfigDict, workdir) -> ml_collections.ConfigDict:
  """`c`, resuming or evaluating the run in `workdir`, with vocab_file its kept copy. A
  different file at the path `c` names is refused: it would give other token ids."""
  kept = vocabulary_path(workdir, c.vocab_file)
  named = paths.as_found(c.vocab_file)
  if named == kept or not paths.exists(kept):  # Or a run from before runs kept their copy.
    return c
  if paths.exists(named) and not paths.same_file(named, kept):
    raise UserError(f"vocab_file '{c.vocab_file}' is not the vocabulary the run in "
                    f"'{paths.absolute(workdir)}' was trained with (its copy: {kept}); pass "
                    f'--config.vocab_file={kept}, or start the new vocabulary in a new '
                    '--workdir')
  c = copy.deepcopy(c)
  c.vocab_file = kept
  return c


def write(workdir, c: ml_collections.ConfigDict):
  """Writes `c` atomically: a reader sees the old file or the whole new one."""
  atomic.write_text(path(workdir), config_lib.to_json(c) + '\n')


def other_output(directory) -> str | None:
  """What another command's output folder `directory` holds (OTHER_OUTPUTS), or None."""
  directory = paths.absolute(directory)
  for name, holds in OTHER_OUTPUTS:
    if paths.exists(paths.join(directory, name)):
      return holds.format(directory)
  return None


def check_not_other_output(workdir):
  """Refuses a --workdir to train or fine-tune in that holds another command's output (the run
  would write its files among them), or lies in a run's checkpoint step (that run's rotation
  would delete it)."""
  step = _step_holding(workdir)
  if step:
    raise UserError(f"--workdir '{paths.absolute(workdir)}' lies in checkpoint step {step[1]} "
                    f"of the run in '{step[0]}', which deletes it with that step; pass a "
                    '--workdir outside that run')
  holds = other_output(workdir) if paths.is_dir(workdir) else None
  if holds:
    raise UserError(f"--workdir '{paths.absolute(workdir)}' holds {holds}; pass a new --workdir")


def run_step(path) -> tuple[str, int] | None:
  """(RUN, STEP) when `path` is RUN/checkpoints/STEP of a run (RUN holds config.json), else
  None."""
  found = checkpoint.step_folder(path)
  return found if found and exists(found[0]) else None


def _step_holding(directory) -> tuple[str, int] | None:
  """run_step of `directory` or of the nearest folder above it that is one, else None."""
  directory = paths.absolute(directory)
  while True:
    found = run_step(directory)
    if found:
      return found
    if paths.parent(directory) == directory:
      return None
    directory = paths.parent(directory)


def _read(workdir, kind: str, command: str) -> dict:
  target = path(workdir)
  step = run_step(workdir) if kind == 'training' else None
  if step:
    raise UserError(f"'{paths.absolute(workdir)}' is checkpoint step {step[1]} of the run in "
                    f"'{step[0]}'; pass --workdir={shlex.quote(step[0])} --step={step[1]}")
  if not paths.is_dir(workdir):
    state = 'is a file' if paths.exists(workdir) else 'does not exist'
    raise UserError(f"'{paths.absolute(workdir)}' {state}; pass a {kind} workdir (python -m "
                    f'electra_jax.{command} --workdir=...)')
  holds = None if paths.exists(target) else other_output(workdir)
  if holds:
    raise UserError(f"'{paths.absolute(workdir)}' is not a {kind} workdir: it holds {holds}")
  if not paths.exists(target):
    raise UserError(f"'{target}' not found; '{workdir}' is not a {kind} workdir (python -m "
                    f'electra_jax.{command} writes config.json there)')
  try:
    saved = json.loads(paths.read_text(target))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"'{target}' is not a JSON config ({e}); restore it from the run's "
                    'command line') from None
  if not isinstance(saved, dict):
    kind = {list: 'an array', str: 'a string', bool: 'a boolean', type(None): 'null'}.get(
        type(saved), 'a number')
    raise UserError(f"'{target}' holds {kind}, not a JSON object of config keys; restore it "
                    "from the run's command line")
  return saved


def _filled(c: ml_collections.ConfigDict, saved: dict, workdir) -> ml_collections.ConfigDict:
  """`c` with the saved values of its keys; one of the wrong type (an edited file) is a
  UserError naming it."""
  for key, value in saved.items():
    if key in c:
      try:
        if value is None and c[key] is not None:  # ConfigDict lets None into any key
          default = json.dumps(c[key], default=str)
          raise TypeError(f'{key} has no unset value; its default is {default}')
        c.update({key: value})
      except (TypeError, ValueError) as e:
        raise UserError(f"'{path(workdir)}': {key}={json.dumps(value)} does not fit the key "
                        f"({first_line(e)}); restore the file from the run's command "
                        'line') from None
  return c


def _kind(saved: dict) -> str:
  """Who wrote a config.json: 'fine-tuning' (it names a task), 'pretraining' (a model size,
  no task) or 'other' (e.g. a transformers model directory's)."""
  return 'fine-tuning' if 'task' in saved else 'pretraining' if 'model_size' in saved else 'other'


def kind(workdir) -> str:
  """Who wrote `workdir`'s config.json (it must exist): 'fine-tuning', 'pretraining' or
  'other' (e.g. a transformers model directory)."""
  return _kind(_read(workdir, 'training', 'train'))


def is_finetuning(workdir) -> bool:
  """`workdir` holds a fine-tuning config."""
  return exists(workdir) and kind(workdir) == 'fine-tuning'


def _not_pretraining(workdir, kind: str) -> str:
  """Why a workdir of `kind` ('fine-tuning' or 'other') is not a pretraining run's."""
  if kind == 'fine-tuning':
    return (f"'{paths.absolute(workdir)}' holds a fine-tuning run (python -m "
            'electra_jax.finetune)')
  return (f"'{paths.absolute(workdir)}' holds a config.json that python -m electra_jax.train "
          'did not write (a transformers model directory? start from its weights with '
          '--config.init_from=DIR)')


def check_trains_in(workdir, c: ml_collections.ConfigDict, vocabulary: str | None = None):
  """Refuses a --workdir for pretraining that holds another kind of run, someone else's
  config.json, or (without a config.json: a new run) files the run would write over: its
  logs, or another file of the name its vocabulary's copy takes. `c`: the resolved config;
  `vocabulary`: the file the copy is made from (default c.vocab_file)."""
  check_not_other_output(workdir)
  if exists(workdir):
    kind = _kind(_read(workdir, 'training', 'train'))
    if kind != 'pretraining':
      raise UserError(f'--workdir {_not_pretraining(workdir, kind)}; pass a new --workdir')
    return
  directory = paths.absolute(workdir)
  for name in metric_writer.NAMES:
    if paths.exists(paths.join(directory, f'{name}.jsonl')):
      raise UserError(f"--workdir '{directory}' holds {name}.jsonl but no run's {FILE_NAME}; "
                      'a new run would write its log over it: pass a new --workdir')
  named = paths.as_found(vocabulary or c.vocab_file)
  kept = vocabulary_path(workdir, c.vocab_file)
  if named != kept and paths.is_file(named) and paths.exists(kept) and not paths.same_file(
      named, kept):
    raise UserError(f"--workdir '{directory}' holds a {paths.name(kept)} other than the run's "
                    'vocabulary, whose copy a new run writes under that name: pass a new '
                    '--workdir or move that file away')


def load(workdir) -> ml_collections.ConfigDict:
  """The resolved pretraining config saved in `workdir`, or a UserError naming the file."""
  saved = _read(workdir, 'training', 'train')
  if _kind(saved) != 'pretraining':
    predict = ('' if _kind(saved) != 'fine-tuning' else
               f'; to label text with it: python -m electra_jax.predict '
               f'--workdir={shlex.quote(paths.absolute(workdir))} --input=FILE --output=DIR')
    raise UserError(f'{_not_pretraining(workdir, _kind(saved))}; pass the workdir of a '
                    f'pretraining run (python -m electra_jax.train){predict}')
  for old, new in RENAMED_KEYS.items():
    if old in saved:
      saved.setdefault(new, saved.pop(old))
  c = _filled(base_config.get_config(), saved, workdir)
  kept = vocabulary_path(workdir, c.vocab_file)
  if paths.exists(kept):
    c.vocab_file = kept
  try:
    return config_lib.resolve(c)
  except UserError as e:
    raise UserError(f"'{path(workdir)}': {e}") from None


def load_finetuning(workdir) -> ml_collections.ConfigDict:
  """The resolved fine-tuning config saved in a fine-tuning workdir (finetune writes it with
  every None key already filled), locked."""
  saved = _read(workdir, 'fine-tuning', 'finetune')
  c = _filled(finetune_config.get_config(), saved, workdir)
  c.lock()
  return c
