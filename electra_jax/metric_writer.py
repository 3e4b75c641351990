"""Metrics to WORKDIR/<name>.jsonl (one JSON object per line) and TensorBoard scalars."""
import os

from electra_jax import cli


class MetricWriter:
  """Appends records; only the chief process writes (others get a no-op writer)."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
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
      if isinstance(value, (int, float)):
        self._tb.add_scalar(f'{prefix}/{key}', value, step)

  def close(self):
    for f in self._files.values():
      f.close()
    if self._tb is not None:
      self._tb.close()
