"""A finished fine-tuning workdir as predictions read it: its config, task, network, tokenizer
and each seed's best checkpoint.

Fine-tuning records the network it tuned in FT_DIR/network/: config.json (the pretraining-form
config: sizes, vocabulary, casing) and a copy of the vocabulary, so FT_DIR needs neither the
pretraining workdir nor the path its vocabulary had. A workdir written before that record
existed resolves the network from its init_checkpoint as fine-tuning did.
"""
import dataclasses
import json
import shlex

import jax
import ml_collections
import numpy as np

from electra_jax import atomic
from electra_jax import checkpoint
from electra_jax import model as model_lib
from electra_jax import paths
from electra_jax import saved_config
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError
from electra_jax.finetune import metrics
from electra_jax.finetune import pretrained
from electra_jax.finetune import tasks as tasks_lib

NETWORK = 'network'
RESULTS = 'results.json'


def run_folder_holding(workdir, path) -> str | None:
  """Which of the run's own folders in `workdir` holds `path` (its checkpoints/, a fine-tuning
  run's seed_*/ and network/), e.g. 'seed_0'; None if none does. Output written there would
  pass for the run's own files."""
  finetuning = is_finetuning_workdir(workdir)
  return next((name for name in paths.listdir(workdir)
               if (name in (checkpoint.SUBDIR, checkpoint.CORRUPT_SUBDIR)
                   or finetuning and (name == NETWORK or name.startswith('seed_')))
               and paths.contains(paths.join(workdir, name), path)), None)


def run_folder_above(path) -> tuple[str, str] | None:
  """(RUN, FOLDER): the run above `path` (a folder holding a config.json) and its own folder
  `path` lies in (run_folder_holding), else None. Output written there would pass for the
  run's files, or go with a checkpoint step its rotation deletes."""
  path = paths.canonical(path)
  run = path
  while paths.parent(run) != run:
    run = paths.parent(run)
    if saved_config.exists(run):
      try:
        folder = run_folder_holding(run, path)
      except UserError:  # Not our config.json (unreadable, someone else's): no run of ours.
        continue
      if folder is not None:
        return run, folder
  return None


def write_network(workdir: str, source: ml_collections.ConfigDict):
  """FT_DIR/network/{config.json, <the vocabulary file>} for `source`, the network's
  pretraining-form config (vocab_file: the file to copy)."""
  directory = paths.join(workdir, NETWORK)
  paths.make_dirs(directory)
  vocab_name = paths.name(source.vocab_file)
  atomic.write_bytes(paths.join(directory, vocab_name), paths.read_bytes(source.vocab_file))
  record = ml_collections.ConfigDict(source.to_dict())
  record.vocab_file = vocab_name  # Relative to network/: the workdir can move.
  saved_config.write(directory, record)


@dataclasses.dataclass
class FinetunedRun:
  workdir: str
  config: ml_collections.ConfigDict  # the resolved fine-tuning config
  task: tasks_lib.Task
  model_config: model_lib.ModelConfig
  network: ml_collections.ConfigDict  # pretraining-form: vocab_file (absolute), casing, sizes
  tokenizer: object
  runs: list  # results.json's per-seed records (seed, best, final, history)

  def best_seed(self) -> int:
    """The seed whose best epoch scored highest on the main metric (the lowest on a tie; NaN
    ranks below every number)."""
    key = f'eval_{self.task.main_metric}'
    return max(self.runs, key=lambda r: (metrics.ranked(r['best'][key]), -r['seed']))['seed']

  def read_params(self, seed: int) -> tuple[dict, int]:
    """(the seed's best-epoch params as numpy arrays, its step)."""
    seeds = [r['seed'] for r in self.runs]
    if seed not in seeds:
      raise UserError(f'--seed={seed} is not a run of {self.workdir}; its seeds: {seeds}')
    run = next(r for r in self.runs if r['seed'] == seed)
    directory = paths.join(self.workdir, f'seed_{seed}', 'best')
    if not self.config.save_best_checkpoint:
      raise UserError(f'{self.workdir} kept no checkpoint (config.save_best_checkpoint=false); '
                      'fine-tune again with it true')
    if run.get('diverged_in_epoch') and run.get('checkpoint') is None:
      kept = [r['seed'] for r in self.runs if r.get('checkpoint') is not None]
      advice = (f'pick another --seed (those with a checkpoint: {kept})' if kept else
                'so did every seed: fine-tune again with a lower config.learning_rate')
      raise UserError(f"seed {seed} of {self.workdir} diverged in epoch "
                      f"{run['diverged_in_epoch']} before any finite epoch, so it has no "
                      f'checkpoint; {advice}')
    if not paths.is_dir(directory):
      raise UserError(f"{directory} does not exist: seed {seed}'s checkpoint was moved or "
                      'deleted; restore it or pick another --seed')
    ckpt = checkpoint.Checkpointer(directory, read_only=True)
    try:
      step = ckpt.latest_step()
      if step is None:
        raise UserError(f'no complete checkpoint in {directory}')
      params = ckpt.read_state(step)
    finally:
      ckpt.close()
    return jax.tree.map(np.asarray, jax.device_get(params)), int(step)


def _network(workdir: str, c) -> tuple[ml_collections.ConfigDict, object]:
  """(the network's pretraining-form config, vocab_file its absolute path; its tokenizer)."""
  directory = paths.join(workdir, NETWORK)
  if not saved_config.exists(directory):
    return pretrained.network_config(c)
  source = ml_collections.ConfigDict(saved_config.load(directory).to_dict())
  source.vocab_file = paths.join(directory, paths.name(source.vocab_file))
  return source, tokenizer_lib.load_tokenizer(source.vocab_file, source.vocab_size,
                                              source.do_lower_case)


def is_finetuning_workdir(workdir: str) -> bool:
  """A workdir python -m electra_jax.finetune wrote (finished or not): a fine-tuning config and
  no pretraining checkpoints."""
  return not checkpoint.has_steps(workdir) and saved_config.is_finetuning(workdir)


def _check_finetuning_run(workdir: str):
  """Refuses a folder whose config.json another command wrote, saying what it holds."""
  pretraining = checkpoint.has_steps(workdir)
  if not (pretraining or saved_config.exists(workdir)):
    return  # load_finetuning names the missing file.
  written_by = 'pretraining' if pretraining else saved_config.kind(workdir)
  parent = paths.parent(workdir)
  if paths.name(workdir) == NETWORK and is_finetuning_workdir(parent):
    raise UserError(f"'{workdir}' is the network/ folder of the fine-tuning run in '{parent}'; "
                    f'pass --workdir={shlex.quote(parent)}')
  if written_by == 'pretraining':
    raise UserError(f"'{workdir}' holds a pretraining run (python -m electra_jax.train); "
                    'predictions come from a fine-tuned one (python -m electra_jax.finetune '
                    f'--config.init_checkpoint={shlex.quote(workdir)} --workdir=FT_DIR)')
  if written_by == 'other':
    raise UserError(f"'{workdir}' holds a config.json that python -m electra_jax.finetune did "
                    'not write (a transformers model directory? fine-tune from it with '
                    f'--config.init_checkpoint={shlex.quote(workdir)})')


def load(workdir: str) -> FinetunedRun:
  """The finished fine-tuning run in `workdir`, or a UserError saying what is missing."""
  workdir = paths.absolute(workdir)
  _check_finetuning_run(workdir)
  c = saved_config.load_finetuning(workdir)
  results_path = paths.join(workdir, RESULTS)
  if not paths.exists(results_path):
    raise UserError(f"'{results_path}' not found: the fine-tuning run in '{workdir}' has not "
                    'finished; re-run its finetune command to resume it')
  results = json.loads(paths.read_text(results_path))
  task = tasks_lib.get_task(c.task)
  if task.name == 'files':
    task = tasks_lib.named_files_task(tuple(results['label_names']))
  elif task.name == 'tagging':
    task = tasks_lib.named_tagging_task(tuple(results['label_names']))
  elif task.kind == tasks_lib.TAGGING:
    task = tasks_lib.encoded_task(task, c.tag_encoding)
  if task.kind in (tasks_lib.CLASSIFICATION, tasks_lib.REGRESSION):
    task = dataclasses.replace(task, file_text=tuple(results.get('text_columns') or ()))
  source, tokenizer = _network(workdir, c)
  return FinetunedRun(workdir=workdir, config=c, task=task,
                      model_config=pretrained.fine_tuned_config(source, c), network=source,
                      tokenizer=tokenizer,
                      runs=results['runs'])
