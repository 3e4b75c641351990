"""Metrics to WORKDIR/<name>.jsonl (one JSON object per line) and TensorBoard scalars."""
import json
import math
import os

from electra_jax import atomic
from electra_jax import cli


NAMES = ('metrics', 'eval_metrics')


def truncate_after(path: str, step: int):
  """Drops the records of steps after `step` (and a half-written last line) from a JSONL file.

  A run killed after its last checkpoint has logged steps that the resumed run logs again;
  without this they would appear twice. Rewritten atomically, and only if something changes.
  """
  if not os.path.exists(path):
    return
  with open(path, encoding='utf-8', errors='replace') as f:
    lines = f.readlines()
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


class MetricWriter:
  """Appends records; only the chief process writes (others get a no-op writer).

  resume_step: the step training restarts from; records logged after it by an earlier,
  interrupted run are removed first (TensorBoard event files are only appended to).
  """

  def __init__(self, workdir: str, enabled: bool = True, resume_step: int | None = None):
    self.enabled = enabled
    if enabled and resume_step is not None:
      for name in NAMES:
        truncate_after(os.path.join(workdir, f'{name}.jsonl'), resume_step)
    self._files = {}
    self._tb = None
    if enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._tb = SummaryWriter(os.path.join(workdir, 'tensorboard'), flush_secs=30)
    self.workdir = workdir

  def write(self, name: str, step: int, record: dict):
    """name 'metrics' -> metrics.jsonl and TensorBoard tag prefix 'train/'."""
    if not self.enabled:
      return
    if name not in self._files:
      self._files[name] = open(os.path.join(self.workdir, f'{name}.jsonl'), 'a',
                               encoding='utf-8')
    f = self._files[name]
    f.write(cli.json_line(dict(step=step, **record)) + '\n')
    f.flush()
    prefix = 'train' if name == 'metrics' else name.replace('_metrics', '')
    for key, value in record.items():
      # Undefined ratios (e.g. precision with no positive prediction) are null in the JSONL
      # and left out of TensorBoard, which would otherwise warn on every one.
      if isinstance(value, (int, float)) and math.isfinite(value):
        self._tb.add_scalar(f'{prefix}/{key}', value, step)

  def close(self):
    for f in self._files.values():
      f.close()
    if self._tb is not None:
      self._tb.close()
