"""Orbax checkpoints of the train state plus the data-iterator position, async and atomic.

Layout: WORKDIR/checkpoints/<step>/{state,data}. Orbax writes each step to a temporary
directory and renames it when complete, so a crash mid-save never hides the previous one.
"""
import os

import grain
import orbax.checkpoint as ocp

from electra_jax.errors import UserError


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager naming what we save and restore."""

  def __init__(self, directory: str, keep: int = 3, async_save: bool = True,
               read_only: bool = False):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(n=keep),
        enable_async_checkpointing=async_save, cleanup_tmp_directories=not read_only,
        create=not read_only, read_only=read_only)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=('state', 'data'))

  def latest_step(self):
    return self._manager.latest_step()

  def all_steps(self):
    return list(self._manager.all_steps())

  def save(self, step: int, state, data_iterator=None, force: bool = False) -> bool:
    items = {'state': ocp.args.StandardSave(state)}
    if data_iterator is not None:
      items['data'] = grain.checkpoint.CheckpointSave(data_iterator)
    return self._manager.save(step, args=ocp.args.Composite(**items), force=force)

  def restore(self, step: int, abstract_state, data_iterator=None):
    """Restores the state (onto abstract_state's shardings) and, if given, the iterator."""
    items = {'state': ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      items['data'] = grain.checkpoint.CheckpointRestore(data_iterator)
    return self._manager.restore(step, args=ocp.args.Composite(**items))['state']

  def reached_preemption(self, step: int) -> bool:
    return self._manager.reached_preemption(step)

  def wait_until_finished(self):
    self._manager.wait_until_finished()

  def close(self):
    self._manager.wait_until_finished()
    self._manager.close()


def open_for_reading(workdir: str) -> tuple[Checkpointer, int]:
  """The workdir's checkpoints and latest step, or a UserError saying there are none."""
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    raise UserError(f"no checkpoints in workdir '{workdir}' ({directory} does not exist); "
                    'train first with python -m electra_jax.train --workdir=...')
  ckpt = Checkpointer(directory, read_only=True)
  step = ckpt.latest_step()
  if step is None:
    raise UserError(f"no complete checkpoint in '{directory}'; train (or resume) first")
  return ckpt, step
