"""Metrics to WORKDIR/<name>.jsonl (one JSON object per line) and TensorBoard scalars.

On an object store (gs://) the JSONL files are uploaded whole (atomic.AppendFile): at most
every FLUSH_SECONDS, at every checkpoint (flush(), before the save starts) and at the end. Rows
after the last checkpoint are the ones a resumed run removes anyway, so "resume truncates to
the checkpoint step" stays exact. TensorBoard event files go straight to the bucket
(tensorboardX's own gs:// writer, which uploads the event file whole at each flush).
"""
import importlib
import json
import math
import os
import sys
import time

from electra_jax import atomic
from electra_jax import cli
from electra_jax import paths

NAMES = ('metrics', 'eval_metrics')
FLUSH_SECONDS = 60.0


def _rows(path: str, step: int) -> tuple[list[str], list[tuple[str, dict]]]:
  """A JSONL file's lines, and its whole (line, record) pairs of steps up to `step`."""
  if not paths.is_file(path):
    return [], []
  lines = paths.read_bytes(path).decode('utf-8', errors='replace').splitlines(keepends=True)
  kept = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      break  # A line cut short by the kill: it and anything after it are dropped.
    if not line.endswith('\n') or record.get('step', 0) > step:
      break
    kept.append((line, record))
  return lines, kept


def truncate_after(path: str, step: int):
  """Drops the records of steps after `step` (and a half-written last line) from a JSONL file.

  A run killed after its last checkpoint has logged steps that the resumed run logs again;
  without this they would appear twice. Rewritten atomically, and only if something changes.
  """
  lines, kept = _rows(path, step)
  if len(kept) != len(lines):
    atomic.write_text(path, ''.join(line for line, _ in kept))


def record_at(workdir: str, name: str, step: int) -> dict | None:
  """The record of `step` in WORKDIR/<name>.jsonl (without its step), as truncate_after would
  keep it; None if there is none."""
  _, kept = _rows(paths.join(paths.absolute(workdir), f'{name}.jsonl'), step)
  found = [r for _, r in kept if r.get('step') == step]
  return {k: v for k, v in found[-1].items() if k != 'step'} if found else None


def _tensorboardx():
  """(tensorboardX's EventsWriter, its event and Summary protos), imported without torch.

  tensorboardX's package imports torch whenever it is installed, only to accept torch tensors:
  2 s and a few hundred MB in every train process (benchmarks/RESULTS.md, session 16) for
  scalars that are Python floats here. While it is imported, `import torch` fails (an
  ImportError tensorboardX catches); torch stays importable afterwards.
  """
  # pylint: disable=import-outside-toplevel
  if 'torch' not in sys.modules and 'tensorboardX' not in sys.modules:
    sys.modules['torch'] = None
    try:
      importlib.import_module('tensorboardX')
    finally:
      del sys.modules['torch']
  from tensorboardX.event_file_writer import EventsWriter
  from tensorboardX.proto import event_pb2
  from tensorboardX.proto.summary_pb2 import Summary
  return EventsWriter, event_pb2, Summary


class TensorBoardEvents:
  """Scalars in a TensorBoard event file, written in the caller's thread and flushed at most
  every `interval` seconds, at flush() and at close(). tensorboardX's SummaryWriter writes
  from a thread of its own: when a write there failed (a full disk, a failed upload) the
  thread died and the next add_scalar that found its queue full waited forever, so the run
  hung; here the failure is one line naming the directory."""

  def __init__(self, directory: str, interval: float = 30.0):
    events_writer, self._event_pb2, self._summary = _tensorboardx()
    self.directory, self._interval = directory, interval
    with paths.storage_errors(directory, 'TensorBoard directory'):
      if not paths.is_remote(directory):
        paths.make_dirs(directory)
      # The file is named by the second it opens in. TensorBoard reads a directory's files in
      # name order, so a writer opened in the same second (a quick resume) needs a suffix
      # that sorts after the first one's, not one that replaces or precedes its file.
      self._writer = events_writer(paths.join(directory, 'events'),
                                   filename_suffix=f'.{time.time_ns():020d}.{os.getpid()}')
    self._flushed_at = time.monotonic()

  def add_scalars(self, step: int, scalars: dict):
    values = [self._summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
    with paths.storage_errors(self.directory, 'TensorBoard directory'):
      self._writer.write_event(self._event_pb2.Event(wall_time=time.time(), step=step,
                                                     summary=self._summary(value=values)))
    if time.monotonic() - self._flushed_at >= self._interval:
      self.flush()

  def purge_from(self, step: int):
    """TensorBoard drops the points the directory's earlier event files hold at `step` and
    after: a SessionLog.START event, what SummaryWriter(purge_step=...) writes for the same
    purpose. A resumed run's re-logged steps are then shown once, not twice."""
    start = self._event_pb2.SessionLog(status=self._event_pb2.SessionLog.START)
    with paths.storage_errors(self.directory, 'TensorBoard directory'):
      self._writer.write_event(self._event_pb2.Event(wall_time=time.time(), step=step,
                                                     session_log=start))

  def flush(self):
    with paths.storage_errors(self.directory, 'TensorBoard directory'):
      self._writer.flush()
    self._flushed_at = time.monotonic()

  def close(self):
    with paths.storage_errors(self.directory, 'TensorBoard directory'):
      self._writer.close()


class MetricWriter:
  """Appends records; only the chief process writes (others get a no-op writer).

  resume_step: the step training restarts from; records logged after it by an earlier,
  interrupted run are removed first. TensorBoard event files are only appended to: the new
  file tells TensorBoard to drop the earlier files' points after it instead.
  """

  def __init__(self, workdir: str, enabled: bool = True, resume_step: int | None = None):
    self.enabled = enabled
    self.workdir = paths.absolute(workdir)
    self._files = {}
    self._tb = TensorBoardEvents(paths.join(self.workdir, 'tensorboard')) if enabled else None
    if enabled and resume_step is not None:
      for name in NAMES:
        truncate_after(paths.join(self.workdir, f'{name}.jsonl'), resume_step)
      self._tb.purge_from(resume_step + 1)

  def write(self, name: str, step: int, record: dict):
    """name 'metrics' -> metrics.jsonl and TensorBoard tag prefix 'train/'."""
    if not self.enabled:
      return
    if name not in self._files:
      self._files[name] = atomic.AppendFile(paths.join(self.workdir, f'{name}.jsonl'),
                                            FLUSH_SECONDS)
    self._files[name].write(cli.json_line(dict(step=step, **record)) + '\n')
    prefix = 'train' if name == 'metrics' else name.replace('_metrics', '')
    # Undefined ratios (e.g. precision with no positive prediction) are null in the JSONL and
    # left out of TensorBoard, as are values that are not numbers.
    self._tb.add_scalars(step, {f'{prefix}/{key}': value for key, value in record.items()
                                if isinstance(value, (int, float)) and math.isfinite(value)})
    if name == 'eval_metrics':  # Rare; a resume reads the row back instead of evaluating
      self.flush()              # again, so TensorBoard must have it too, killed or not.

  def flush(self):
    """Everything logged so far reaches the workdir (called before each checkpoint)."""
    for f in self._files.values():
      f.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self):
    for f in self._files.values():
      f.close()
    if self._tb is not None:
      self._tb.close()
