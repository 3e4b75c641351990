"""Metrics to WORKDIR/<name>.jsonl (one JSON object per line) and TensorBoard scalars.

On an object store (gs://) the JSONL files are uploaded whole (atomic.AppendFile): at most
every FLUSH_SECONDS, at every checkpoint (flush(), before the save starts) and at the end. Rows
after the last checkpoint are the ones a resumed run removes anyway, so "resume truncates to
the checkpoint step" stays exact. TensorBoard event files go straight to the bucket
(tensorboardX's own gs:// writer, which uploads the event file whole every 30 s).
"""
import json
import math
import sys

from electra_jax import atomic
from electra_jax import cli
from electra_jax import paths

NAMES = ('metrics', 'eval_metrics')
FLUSH_SECONDS = 60.0


def truncate_after(path: str, step: int):
  """Drops the records of steps after `step` (and a half-written last line) from a JSONL file.

  A run killed after its last checkpoint has logged steps that the resumed run logs again;
  without this they would appear twice. Rewritten atomically, and only if something changes.
  """
  if not paths.is_file(path):
    return
  lines = paths.read_bytes(path).decode('utf-8', errors='replace').splitlines(keepends=True)
  kept = []
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      break  # A line cut short by the kill: it and anything after it are dropped.
    if not line.endswith('\n') or record.get('step', 0) > step:
      break
    kept.append(line)
  if len(kept) != len(lines):
    atomic.write_text(path, ''.join(kept))


def summary_writer_class():
  """tensorboardX's SummaryWriter, imported without torch.

  tensorboardX's writer module imports torch whenever it is installed, only to accept torch
  tensors: 2 s and a few hundred MB in every train process (benchmarks/RESULTS.md, session 16)
  for scalars that are Python floats here. While it is imported, `import torch` fails (an
  ImportError tensorboardX catches); torch stays importable afterwards.
  """
  # pylint: disable=import-outside-toplevel
  if 'torch' in sys.modules or 'tensorboardX.writer' in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules['torch'] = None
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules['torch']
  return SummaryWriter


class MetricWriter:
  """Appends records; only the chief process writes (others get a no-op writer).

  resume_step: the step training restarts from; records logged after it by an earlier,
  interrupted run are removed first (TensorBoard event files are only appended to).
  """

  def __init__(self, workdir: str, enabled: bool = True, resume_step: int | None = None):
    self.enabled = enabled
    self.workdir = paths.absolute(workdir)
    if enabled and resume_step is not None:
      for name in NAMES:
        truncate_after(paths.join(self.workdir, f'{name}.jsonl'), resume_step)
    self._files = {}
    self._tb = None
    if enabled:
      with paths.storage_errors(self.workdir):
        self._tb = summary_writer_class()(paths.join(self.workdir, 'tensorboard'), flush_secs=30)

  def write(self, name: str, step: int, record: dict):
    """name 'metrics' -> metrics.jsonl and TensorBoard tag prefix 'train/'."""
    if not self.enabled:
      return
    if name not in self._files:
      self._files[name] = atomic.AppendFile(paths.join(self.workdir, f'{name}.jsonl'),
                                            FLUSH_SECONDS)
    self._files[name].write(cli.json_line(dict(step=step, **record)) + '\n')
    prefix = 'train' if name == 'metrics' else name.replace('_metrics', '')
    for key, value in record.items():
      # Undefined ratios (e.g. precision with no positive prediction) are null in the JSONL
      # and left out of TensorBoard, which would otherwise warn on every one.
      if isinstance(value, (int, float)) and math.isfinite(value):
        self._tb.add_scalar(f'{prefix}/{key}', value, step)

  def flush(self):
    """Everything logged so far reaches the workdir (called before each checkpoint)."""
    for f in self._files.values():
      f.flush()

  def close(self):
    for f in self._files.values():
      f.close()
    if self._tb is not None:
      self._tb.close()
