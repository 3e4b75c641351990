"""The resolved config a run keeps in WORKDIR/config.json: its one writer and its one reader.

Train, evaluate, export, fine-tuning, init_from and predict all load a saved config here. A
workdir written before a key existed still loads: a key it lacks takes today's default from
configs/base_config.py (fine-tuning workdirs: configs/finetune/glue.py; the behaviour the key
was added with), a key since removed is dropped, a renamed one is read under its new name.
"""
import json

import ml_collections

from configs import base_config
from configs.finetune import glue as finetune_config
from electra_jax import atomic
from electra_jax import config as config_lib
from electra_jax import paths
from electra_jax.errors import UserError

FILE_NAME = 'config.json'
# Pretraining keys renamed since workdirs were first written: old name -> new name.
RENAMED_KEYS = {'tfds_text_key': 'text_key'}  # 2026-11-28: JSON Lines files use it too.


def path(workdir) -> str:
  return paths.join(paths.absolute(workdir), FILE_NAME)


def exists(workdir) -> bool:
  return paths.exists(path(workdir))


def write(workdir, c: ml_collections.ConfigDict):
  """Writes `c` atomically: a reader sees the old file or the whole new one."""
  atomic.write_text(path(workdir), config_lib.to_json(c) + '\n')


def _read(workdir, kind: str, command: str) -> dict:
  target = path(workdir)
  if not paths.exists(target):
    raise UserError(f"'{target}' not found; '{workdir}' is not a {kind} workdir (python -m "
                    f'electra_jax.{command} writes config.json there)')
  try:
    return json.loads(paths.read_text(target))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"'{target}' is not a JSON config ({e}); restore it from the run's "
                    'command line') from None


def is_finetuning(workdir) -> bool:
  """`workdir` holds a fine-tuning config (it names a task; a pretraining config has no such
  key)."""
  return exists(workdir) and 'task' in _read(workdir, 'training', 'train')


def load(workdir) -> ml_collections.ConfigDict:
  """The resolved pretraining config saved in `workdir`, or a UserError naming the file."""
  saved = _read(workdir, 'training', 'train')
  for old, new in RENAMED_KEYS.items():
    if old in saved:
      saved.setdefault(new, saved.pop(old))
  c = base_config.get_config()
  c.update({k: v for k, v in saved.items() if k in c})
  try:
    return config_lib.resolve(c)
  except UserError as e:
    raise UserError(f"'{path(workdir)}': {e}") from None


def load_finetuning(workdir) -> ml_collections.ConfigDict:
  """The resolved fine-tuning config saved in a fine-tuning workdir (finetune writes it with
  every None key already filled), locked."""
  saved = _read(workdir, 'fine-tuning', 'finetune')
  c = finetune_config.get_config()
  c.update({k: v for k, v in saved.items() if k in c})
  c.lock()
  return c
