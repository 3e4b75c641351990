"""What a fine-tuning workdir keeps so that the same command resumes a killed run and ends with
the results of a run never interrupted: each finished seed's record (seed_<k>/run.json), the
unfinished seed's train state and loop position (seed_<k>/resume/<step>/: saved at every epoch
end, every save_checkpoints_steps and on SIGTERM; removed once the seed is done) and the
pretraining checkpoint step every seed starts from (init.json: a pretraining workdir's newest
step may move on while the runs are under way)."""
import dataclasses
import json
import shlex

from electra_jax import atomic
from electra_jax import checkpoint
from electra_jax import cli
from electra_jax import paths
from electra_jax import saved_config
from electra_jax.errors import UserError
from electra_jax.finetune import tasks as tasks_lib

RESULTS = 'results.json'
RUN = 'run.json'
RESUME = 'resume'
BEST = 'best'
INIT = 'init.json'
METRICS = 'metrics.jsonl'
# Keys a resumed run may change: they touch neither the numbers nor the files' meaning.
CHANGEABLE_KEYS = ('progress_bar', 'save_checkpoints_steps')
# Keys only one kind of task reads (a run of another kind, e.g. one saved before the key
# existed, may differ in them).
KEYS_OF_KIND = {tasks_lib.TAGGING: ('tag_head', 'tag_encoding'), tasks_lib.SPAN: ('span_head',)}


def open_workdir(workdir: str, c) -> tuple[str, bool]:
  """(the workdir's absolute path, True if it holds an unfinished run of config `c` to resume).

  Refuses finished results, a pretraining workdir and, once a seed has saved, another config.
  Creates nothing (a run that fails to read its data leaves no workdir behind).
  """
  workdir = paths.absolute(workdir)
  saved_config.check_not_other_output(workdir)
  names = paths.listdir(workdir)
  if RESULTS in names:
    raise UserError(f"--workdir '{workdir}' already holds fine-tuning results; pass a new "
                    '--workdir (results are never overwritten)')
  if not saved_config.exists(workdir):
    if any(n.startswith('seed_') for n in names):
      raise UserError(f"--workdir '{workdir}' holds seed_* directories but no config.json; "
                      'pass a new --workdir')
    return workdir, False
  written_by = saved_config.kind(workdir)
  if written_by == 'other':
    raise UserError(f"--workdir '{workdir}' holds a {saved_config.FILE_NAME} that python -m "
                    'electra_jax.finetune did not write (a transformers model directory? '
                    f'start from it with --config.init_checkpoint={shlex.quote(workdir)}); pass '
                    'a new --workdir')
  if checkpoint.has_steps(workdir) or written_by != 'fine-tuning':
    raise UserError(f"--workdir '{workdir}' holds a pretraining run; fine-tune into a new "
                    f'--workdir (--config.init_checkpoint={shlex.quote(workdir)} starts from it)')
  if not _has_progress(workdir):
    return workdir, False  # Stopped before its first save: nothing to keep, any config.
  saved = saved_config.load_finetuning(workdir).to_dict()
  current = c.to_dict()
  kind = tasks_lib.get_task(c.task).kind
  unread = [k for other, keys in KEYS_OF_KIND.items() if other != kind for k in keys]
  changed = sorted(k for k in current if saved.get(k) != current[k]
                   and k not in CHANGEABLE_KEYS and k not in unread)
  if changed:
    diffs = ', '.join(f'{k}: {saved.get(k)!r} -> {current[k]!r}' for k in changed)
    raise UserError(f"--workdir '{workdir}' holds an unfinished fine-tuning run with another "
                    f'config ({diffs}); re-run with its values ({saved_config.path(workdir)}) '
                    'to resume it, or pass a new --workdir')
  return workdir, True


def _seed_dirs(workdir: str) -> list[str]:
  return [paths.join(workdir, n) for n in paths.listdir(workdir) if n.startswith('seed_')]


def _has_progress(workdir: str) -> bool:
  """A seed has finished or completed a resume save (a best checkpoint alone is not committed
  progress: a resumed run drops it)."""
  return any(paths.exists(paths.join(d, RUN))
             or checkpoint.complete_steps(paths.join(d, RESUME)) for d in _seed_dirs(workdir))


def clear_unsaved(workdir: str):
  """Removes the seed directories of a run that stopped before its first save (a fresh start
  rewrites everything else)."""
  for seed_dir in _seed_dirs(workdir):
    paths.remove_tree(seed_dir)


def init_step(workdir: str, c, resuming: bool) -> int | None:
  """The pretraining checkpoint step the runs start from: the one recorded when resuming, else
  config.init_step or the init_checkpoint workdir's newest (None: a transformers directory or
  random weights)."""
  steps = [] if not c.init_checkpoint or c.random_init else checkpoint.steps(c.init_checkpoint)
  record = paths.join(workdir, INIT)
  if resuming and paths.exists(record):
    step = json.loads(paths.read_text(record))['step']
    if step is not None and step not in steps:
      raise UserError(f'the runs in {workdir} started from step {step} of '
                      f"config.init_checkpoint='{c.init_checkpoint}', which no longer holds it "
                      f'(steps: {steps}); fine-tune again in a new --workdir')
    return step
  if not steps:  # A transformers directory, or random weights.
    if c.init_step is not None:
      raise UserError(f'config.init_step={c.init_step} picks a checkpoint of a pretraining '
                      'workdir; config.init_checkpoint is none (or random_init is set): drop '
                      'init_step')
    return None
  if c.init_step is None:
    return steps[-1]
  if c.init_step not in steps:
    raise UserError(f'config.init_step={c.init_step} is not a checkpoint of '
                    f"config.init_checkpoint='{c.init_checkpoint}'; its steps: {steps}")
  return c.init_step


def write_init(workdir: str, c, step: int | None):
  atomic.write_json(paths.join(workdir, INIT),
                    dict(init_checkpoint=None if c.random_init else c.init_checkpoint,
                         step=step))


@dataclasses.dataclass
class Position:
  """Where a seed's run stands: `batches_done` batches of `epoch` trained, their loss sums,
  and the records of the epochs before."""
  epoch: int = 1
  batches_done: int = 0
  loss_sum: float = 0.0
  count: float = 0.0
  history: list = dataclasses.field(default_factory=list)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, record: dict) -> 'Position':
    return cls(**record)


def _drop_resume_state(seed_dir: str):
  resume_dir = paths.join(seed_dir, RESUME)
  if paths.exists(resume_dir):
    paths.remove_tree(resume_dir)


def open_best(seed_dir: str) -> checkpoint.Checkpointer:
  """The seed's best-epoch checkpoints: every step kept until prune_best (a kill between a
  new best and its commit never leaves none)."""
  return checkpoint.Checkpointer(paths.join(seed_dir, BEST), keep=None, async_save=False)


def prune_best(best_ckpt: checkpoint.Checkpointer, keep_step: int | None):
  """Deletes every best checkpoint but `keep_step`, the committed best (all of them if None)."""
  for step in best_ckpt.all_steps():
    if step != keep_step:
      best_ckpt.delete(step)


def _tidy_finished(seed_dir: str, run: dict):
  _drop_resume_state(seed_dir)
  if paths.exists(paths.join(seed_dir, BEST)):
    best_ckpt = open_best(seed_dir)
    try:
      prune_best(best_ckpt, run['best']['step'])
    finally:
      best_ckpt.close()


def read_run(seed_dir: str) -> dict | None:
  """A finished seed's record (fine-tuning's run_seed result), None if the seed is not done.
  What a kill left behind it (its resume state, a superseded best checkpoint) is removed."""
  path = paths.join(seed_dir, RUN)
  if not paths.exists(path):
    return None
  run = json.loads(paths.read_text(path))
  _tidy_finished(seed_dir, run)
  return run


def finish_seed(seed_dir: str, run: dict):
  """Records the seed as done (the commit point of its last epoch), then drops its resume
  state and any best checkpoint but the run's."""
  atomic.write_json(paths.join(seed_dir, RUN), run)
  _tidy_finished(seed_dir, run)


def write_metrics(seed_dir: str, history: list):
  """seed_<k>/metrics.jsonl, one row per epoch (rewritten whole: object stores cannot append,
  and a resumed run drops rows its checkpoint does not reach)."""
  atomic.write_text(paths.join(seed_dir, METRICS),
                    ''.join(cli.json_line(r) + '\n' for r in history))
