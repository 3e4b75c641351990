"""Orbax checkpoints of the train state plus the loop's position, async and atomic: the one
place that knows checkpoint steps (train, evaluate, export, fine-tuning, init_from and the
experiments all come here for the latest step, a step's parameters).

Layout: WORKDIR/checkpoints/<step>/{state,loop} (`loop`: JSON with the data position and the
unlogged metric window; older checkpoints also hold `data`, a per-process grain state no longer
read). Locally Orbax writes each step to a temporary directory and renames it when complete; on
an object store (gs://) it writes <step>/ in place and marks it complete with
commit_success.txt last. Either way a crash mid-save never yields a step that looks complete:
on start-up a half-written step is reported and ignored, and an unreadable newest step is moved
aside to WORKDIR/corrupt_checkpoints/ (never deleted) in favour of the newest readable one.
A state holding NaN/inf is never written.
"""
import contextlib
import logging
import os
import re
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from electra_jax import paths
from electra_jax.errors import UserError, first_line

TMP_MARKER = '.orbax-checkpoint-tmp'
# What marks a complete step on an object store (Orbax's CommitFileTemporaryPath).
COMMIT_FILE = 'commit_success.txt'
SUBDIR = 'checkpoints'
CORRUPT_SUBDIR = 'corrupt_checkpoints'  # Unreadable steps a resume moved aside.


def _warn(message: str):
  print(f'warning: {message}', file=sys.stderr, flush=True)


class _ReadOnlyNotices(logging.Filter):
  """Drops Orbax's notices that a read-only manager is read-only: every reader (evaluate,
  export, fine-tuning, compare) would print them, and before a one-line error they hide it."""
  NOTICES = ('read_only=True, setting save_interval_steps', 'Given directory is read only')

  def filter(self, record):
    return not any(n in record.getMessage() for n in self.NOTICES)


def _save_reason(error: Exception) -> str:
  """Why a save failed, in the operating system's words where there are some: tensorstore's
  message for a full disk is a long line with the cause at its end."""
  code = getattr(error, 'errno', None)
  match = re.search(r"os_error_code='?(\d+)", str(error))
  if match:
    code = int(match.group(1))
  return os.strerror(code) if isinstance(code, int) and code > 0 else first_line(error)


@jax.jit
def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def all_finite(tree) -> bool:
  """True if no floating-point leaf holds NaN/inf (one jitted reduction, one scalar fetched)."""
  return bool(_all_finite(tree))


def size_bytes(abstract_tree) -> int:
  """Bytes of every array in a (possibly abstract) pytree: one checkpoint's payload."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(abstract_tree))


def check_disk(directory: str, abstract_state, copies: int = 2):
  """UserError unless `directory` is writable and has room for `copies` checkpoints (object
  stores have no free-space figure: there only writing is checked)."""
  directory = paths.check_writable_dir(directory, '--workdir')
  if paths.is_remote(directory):
    return
  need = copies * size_bytes(abstract_state)
  free = shutil.disk_usage(directory).free
  if free < need:
    raise UserError(f"only {free / 2**20:.0f} MiB free under '{directory}' but {copies} "
                    f'checkpoints need about {need / 2**20:.0f} MiB; free disk space or pick '
                    'another --workdir')


def directory_of(workdir: str) -> str:
  return paths.join(paths.absolute(workdir), SUBDIR)


def step_folder(path: str) -> tuple[str, int] | None:
  """(WORKDIR, STEP) of a path shaped WORKDIR/checkpoints/STEP (a run's step folder where
  WORKDIR holds a run), else None."""
  path = paths.absolute(path)
  if paths.name(path).isdigit() and paths.name(paths.parent(path)) == SUBDIR:
    return paths.parent(paths.parent(path)), int(paths.name(path))
  return None


def _scan(directory: str) -> tuple[list[int], list[str]]:
  """A Checkpointer directory's complete steps, and the paths of the saves that did not finish:
  temporary directories, or on an object store step directories without their commit file."""
  names = paths.listdir(directory)
  steps = [n for n in names if n.isdigit()]
  if paths.is_remote(directory):
    complete = [n for n in steps if paths.exists(paths.join(directory, n, COMMIT_FILE))]
    unfinished = [n for n in steps if n not in complete]
  else:
    complete, unfinished = steps, [n for n in names if TMP_MARKER in n]
  return sorted(int(n) for n in complete), [paths.join(directory, n) for n in unfinished]


def complete_steps(directory: str) -> list[int]:
  """The steps a Checkpointer directory holds complete, read without opening a manager."""
  return _scan(directory)[0]


def has_steps(workdir: str) -> bool:
  """True if WORKDIR/checkpoints holds a complete step (a run there resumes rather than starts):
  a save cut short counts on no storage, a temporary directory locally, a step directory
  without its commit file on gs://."""
  return bool(complete_steps(directory_of(workdir)))


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager naming what we save and restore.

  keep: the newest `keep` steps are kept (None: every step, until delete()).
  """

  def __init__(self, directory: str, keep: int | None = 3, async_save: bool = True,
               read_only: bool = False):
    self.directory = paths.absolute(directory)
    if not read_only:
      for tmp in _scan(self.directory)[1]:
        _warn(f'ignoring half-written checkpoint {tmp} (a save was interrupted); Orbax '
              'removes it')
    policy = ocp.checkpoint_managers.LatestN(n=keep)
    handlers = {'state': ocp.StandardCheckpointHandler(), 'loop': ocp.JsonCheckpointHandler()}
    notices, absl_logger = _ReadOnlyNotices(), logging.getLogger('absl')
    absl_logger.addFilter(notices)
    try:
      options = ocp.CheckpointManagerOptions(
          preservation_policy=policy, enable_async_checkpointing=async_save,
          cleanup_tmp_directories=not read_only, create=not read_only, read_only=read_only)
      with paths.storage_errors(self.directory):
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_handlers=handlers)
    finally:
      absl_logger.removeFilter(notices)
    self._closed = False

  def step_path(self, step: int) -> str:
    return paths.join(self.directory, str(step))

  def latest_step(self):
    return self._manager.latest_step()

  def all_steps(self):
    return list(self._manager.all_steps())

  def delete(self, step: int):
    self._manager.delete(step)

  def save(self, step: int, state, force: bool = False, loop_state: dict | None = None) -> bool:
    """Starts an async save; UserError if the state is not finite or the write fails.

    loop_state: small JSON-able bookkeeping of the loop (data position, unlogged metric window).
    """
    if not all_finite(state):
      latest = self.latest_step()
      kept = (f'the last good checkpoint is step {latest} in {self.directory}'
              if latest is not None else f'{self.directory} holds no checkpoint yet')
      raise UserError(f'the train state at step {step} contains NaN/inf; not saving it: {kept}')
    items = {'state': ocp.args.StandardSave(state)}
    if loop_state is not None:
      items['loop'] = ocp.args.JsonSave(loop_state)
    try:
      return self._manager.save(step, args=ocp.args.Composite(**items), force=force)
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(e) from e

  def _save_error(self, error: Exception) -> UserError:
    # An async save fails at the next save() or close(): name the newest complete step.
    try:
      self._manager.reload()  # What the storage holds now, not the manager's memory.
      good = self._manager.all_steps()
    except Exception:  # pylint: disable=broad-except  # The storage itself is failing.
      good = []
    kept = (f'the newest complete checkpoint, step {max(good)}, is intact' if good
            else 'no complete checkpoint exists yet')
    return UserError(f'saving a checkpoint in {self.directory} failed ({_save_reason(error)}); '
                     f'{kept}. Free disk space or fix the directory, then re-run the same '
                     'command to resume')

  def restore(self, step: int, abstract_state, with_loop: bool = False):
    """Restores the state onto abstract_state's shardings (any mesh or process count).

    with_loop: return (state, loop_state or None) instead of the state alone.
    """
    items = {'state': ocp.args.StandardRestore(abstract_state)}
    has_loop = with_loop and paths.is_dir(paths.join(self.step_path(step), 'loop'))
    if has_loop:
      items['loop'] = ocp.args.JsonRestore()
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    if not with_loop:
      return restored['state']
    return restored['state'], (restored['loop'] if has_loop else None)

  def read_state(self, step: int, flag: str | None = None):
    """A step's saved state tree as arrays on this process's first device, whatever the
    device count it was saved from (Orbax refuses a restore without target shardings on other
    devices): for reading parameters outside the training mesh (export, fine-tuning, tests)."""
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    with self.reading(step, flag):
      metadata = self._manager.item_metadata(step)['state']
      target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                            metadata)
      return self._manager.restore(
          step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))['state']

  @contextlib.contextmanager
  def reading(self, step: int, flag: str | None = None, other_tree: str = ''):
    """A step that fails to read (a step directory missing its state, truncated files) is a
    UserError naming it and the steps to read instead (`flag`: the flag that picks one); a
    resumed run moves such steps aside instead (restore_latest_valid). `other_tree`: what to
    do where the caller's target may differ from the saved tree (another config)."""
    try:
      yield
    except UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      others = [s for s in sorted(self.all_steps()) if s != step]
      instead = (f'read one of its other steps, {others}' + (f' ({flag}=N)' if flag else '')
                 if others else 'it holds no other step')
      raise UserError(f'checkpoint step {step} in {self.directory} cannot be read '
                      f'({first_line(e)}); {other_tree}{instead}') from e

  def restore_latest_valid(self, abstract_state):
    """(step, state, loop_state) of the newest readable finite checkpoint; (None,)*3 if none.

    Steps that fail to restore are moved to WORKDIR/corrupt_checkpoints/ with a warning, but
    only once an older step restored fine (so a config mismatch that breaks every step is an
    error, not a silent fresh start).
    """
    failures = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        state, loop_state = self.restore(step, abstract_state, with_loop=True)
        ok, reason = all_finite(state), 'contains NaN/inf'
      except Exception as e:  # pylint: disable=broad-except
        ok, reason = False, first_line(e)
      if _all_processes_agree(ok):
        for bad_step, bad_reason in failures:
          self._move_aside(bad_step, bad_reason, step)
        if failures:
          self._manager.reload()
        return step, state, loop_state
      failures.append((step, reason))
    if failures:
      step, reason = failures[0]
      raise UserError(f'no checkpoint in {self.directory} can be restored (newest, step {step}: '
                      f'{reason}); they are left untouched. If the config changed, re-run with '
                      'the saved WORKDIR/config.json values; otherwise start a new --workdir')
    return None, None, None

  def _move_aside(self, step: int, reason: str, resume_step: int):
    target_dir = paths.join(paths.parent(self.directory), CORRUPT_SUBDIR)
    target, n = paths.join(target_dir, str(step)), 1
    while paths.exists(target):
      target, n = paths.join(target_dir, f'{step}.{n}'), n + 1
    if jax.process_index() == 0:
      paths.make_dirs(target_dir)
      paths.rename(self.step_path(step), target)
    _sync(f'move_aside_{step}')
    _warn(f'checkpoint step {step} is unreadable ({reason}); moved it to {target} and resuming '
          f'from step {resume_step}')

  def reached_preemption(self, step: int) -> bool:
    return self._manager.reached_preemption(step)

  def wait_until_finished(self):
    self._manager.wait_until_finished()

  def close(self):
    """Waits for pending saves; a failed async save becomes a UserError."""
    if self._closed:
      return
    self._closed = True
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(e) from e
    finally:
      self._manager.close()


def _all_processes_agree(ok: bool) -> bool:
  """True only if `ok` on every process (so all hosts restore the same step)."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return bool(np.min(multihost_utils.process_allgather(np.int32(ok))))


def _sync(name: str):
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices(name)


def steps(workdir: str) -> list[int]:
  """The complete checkpoint steps of a workdir, oldest first ([] if none)."""
  if not paths.is_dir(directory_of(workdir)):
    return []
  ckpt = Checkpointer(directory_of(workdir), read_only=True)
  try:
    return sorted(ckpt.all_steps())
  finally:
    ckpt.close()


def latest_step(workdir: str) -> int | None:
  """The newest complete checkpoint step of a workdir (None: none)."""
  return (steps(workdir) or [None])[-1]


def copy_step(workdir: str, step: int, target_workdir: str):
  """One checkpoint step of `workdir` copied into `target_workdir` (hard links on a local disk,
  so a later rotation of the original does not take it away)."""
  source = paths.join(directory_of(workdir), str(step))
  paths.copy_tree(source, paths.join(directory_of(target_workdir), str(step)), link=True)


def open_for_reading(workdir: str) -> tuple[Checkpointer, int]:
  """The workdir's checkpoints and latest step, or a UserError saying there are none."""
  directory = directory_of(workdir)
  if not paths.is_dir(directory):
    raise UserError(f"no checkpoints in workdir '{workdir}' ({directory} does not exist); "
                    'train first with python -m electra_jax.train --workdir=...')
  ckpt = Checkpointer(directory, read_only=True)
  step = ckpt.latest_step()
  if step is None:
    raise UserError(f"no complete checkpoint in '{directory}'; train (or resume) first")
  return ckpt, step


def check_step(ckpt: Checkpointer, step: int, flag: str | None = None):
  """UserError unless `step` is a complete checkpoint of `ckpt` (`flag`: the flag naming it)."""
  steps = sorted(ckpt.all_steps())
  if step not in steps:
    named = f'{flag}={step}' if flag else f'step {step}'
    raise UserError(f'{named} is not a checkpoint in {ckpt.directory}; available: {steps}')


def read_params(workdir: str, step: int | None = None,
                flag: str | None = None) -> tuple[dict, int]:
  """(parameters as numpy arrays, step) of a workdir's latest (or `step`, named by `flag`)
  checkpoint, read on one device whatever the mesh it was saved from (export, fine-tuning,
  init_from)."""
  ckpt, latest = open_for_reading(workdir)
  try:
    step = latest if step is None else step
    check_step(ckpt, step, flag)
    state = ckpt.read_state(step, flag)
  finally:
    ckpt.close()
  return jax.tree.map(np.asarray, jax.device_get(state['params'])), step
