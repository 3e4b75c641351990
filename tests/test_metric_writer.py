"""metric_writer: JSONL rows and TensorBoard scalars, written without importing torch."""
import glob
import json
import os
import struct
import subprocess
import sys
import types

import pytest

from electra_jax import metric_writer
from tests.conftest import REPO_ROOT

_WRITE = """
import importlib.util, json, sys
from electra_jax import metric_writer
writer = metric_writer.MetricWriter(sys.argv[1])
writer.write('metrics', 2, {'loss': 1.5, 'disc_auc': float('nan'), 'examples': 3})
writer.write('eval_metrics', 4, {'loss': 1.25, 'precision': None})
writer.close()
torch_imported = 'torch' in sys.modules
torch_installed = importlib.util.find_spec('torch') is not None
if torch_installed:
  import torch  # Still importable after the writer's import.
print(json.dumps(dict(torch_imported=torch_imported, torch_installed=torch_installed)))
"""


def read_events(path):
  """The Events of one event file (TFRecord framing: length, its CRC, the serialized Event, its
  CRC)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  with open(path, 'rb') as f:
    data = f.read()
  events, position = [], 0
  while position < len(data):
    (length,) = struct.unpack('<Q', data[position:position + 8])
    events.append(event_pb2.Event.FromString(data[position + 12:position + 12 + length]))
    position += 12 + length + 4
  return events


def read_scalars(directory):
  """(tag, step, value) of every scalar in the event files."""
  return [(v.tag, event.step, v.simple_value)
          for path in glob.glob(os.path.join(directory, 'events.out.tfevents.*'))
          for event in read_events(path) for v in event.summary.value]


def test_scalars_reach_jsonl_and_tensorboard_and_torch_is_never_imported(tmp_path):
  """With torch installed (the test extra), tensorboardX would import it in every train
  process; the writer's import keeps it out, and writes the same scalars."""
  proc = subprocess.run([sys.executable, '-c', _WRITE, str(tmp_path)], cwd=REPO_ROOT,
                        env=dict(os.environ, PYTHONPATH=REPO_ROOT), capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result['torch_installed'] or os.environ.get('CI') != 'true'  # CI installs [test].
  assert not result['torch_imported']
  # Non-finite and non-numeric values stay out of TensorBoard.
  assert sorted(read_scalars(tmp_path / 'tensorboard')) == [
      ('eval/loss', 4, 1.25), ('train/examples', 2, 3.0), ('train/loss', 2, 1.5)]
  with open(tmp_path / 'metrics.jsonl', encoding='utf-8') as f:
    (row,) = [json.loads(line) for line in f]
  assert row == dict(step=2, loss=1.5, disc_auc=None, examples=3)  # NaN is null in JSONL.
  with open(tmp_path / 'eval_metrics.jsonl', encoding='utf-8') as f:
    assert [json.loads(line) for line in f] == [dict(step=4, loss=1.25, precision=None)]


def test_writers_opened_in_the_same_second_keep_each_others_scalars(tmp_path, monkeypatch):
  """Event files are named by the second they open in: a run stopped and resumed within it
  replaced the first writer's file, and its scalars were gone."""
  metric_writer.TensorBoardEvents(str(tmp_path))  # Imports tensorboardX.
  from tensorboardX import event_file_writer  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(event_file_writer, 'time', types.SimpleNamespace(time=lambda: 1.7e9))
  for step in (1, 2):
    events = metric_writer.TensorBoardEvents(str(tmp_path))
    events.add_scalars(step, {'train/loss': float(step)})
    events.close()
  assert sorted(read_scalars(tmp_path)) == [('train/loss', 1, 1.0), ('train/loss', 2, 2.0)]


@pytest.mark.parametrize('seconds_apart', [1, 0])
def test_a_resumed_run_has_tensorboard_drop_the_steps_it_logs_again(tmp_path, monkeypatch,
                                                                     seconds_apart):
  """Killed after its checkpoint at 3, a run had logged 4-6; resumed from 3 it logs them again.
  TensorBoard reads a run's event files in name order and, at a SessionLog.START event, drops
  the points read so far at its step and after: each step is then shown once, as resumed.
  Files are named by the second they open in; a resume within the same second must sort after
  the first run's file too (a random suffix put it first half the time: 8 tries)."""
  metric_writer.TensorBoardEvents(str(tmp_path / 'unused'))  # Imports tensorboardX.
  from tensorboardX import event_file_writer  # pylint: disable=import-outside-toplevel
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  for attempt in range(8 if seconds_apart == 0 else 1):
    workdir = tmp_path / str(attempt)
    for run, (resume_step, steps) in enumerate(((0, range(1, 7)), (3, range(4, 9)))):
      monkeypatch.setattr(event_file_writer, 'time', types.SimpleNamespace(
          time=lambda run=run: 1.7e9 + seconds_apart * run))
      writer = metric_writer.MetricWriter(str(workdir), resume_step=resume_step)
      for step in steps:
        writer.write('metrics', step, {'loss': 100.0 * run + step})
      writer.close()
    shown = []
    for path in sorted(glob.glob(str(workdir / 'tensorboard' / 'events.out.tfevents.*'))):
      for event in read_events(path):
        if event.session_log.status == event_pb2.SessionLog.START:
          shown = [point for point in shown if point[1] < event.step]
        shown += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    assert shown == [('train/loss', step, step + (100.0 if step > 3 else 0.0))
                     for step in range(1, 9)], attempt


_KILLED_AFTER_AN_EVALUATION = """
import os, sys
from electra_jax import metric_writer
writer = metric_writer.MetricWriter(sys.argv[1], resume_step=0)
writer.write('metrics', 4, {'loss': 4.0})
writer.flush()  # As train's save() before the checkpoint of step 4.
writer.write('eval_metrics', 4, {'loss': 3.0})  # The evaluation after it.
writer.write('metrics', 6, {'loss': 6.0})
os.kill(os.getpid(), 9)
"""


def test_an_evaluation_reaches_tensorboard_before_a_kill(tmp_path):
  """A resume from step 4 reads the evaluation's row back from eval_metrics.jsonl instead of
  evaluating again: TensorBoard must have it too, or it never shows eval/* at that step."""
  proc = subprocess.run([sys.executable, '-c', _KILLED_AFTER_AN_EVALUATION, str(tmp_path)],
                        cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=REPO_ROOT),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == -9, proc.stderr[-3000:]
  assert metric_writer.record_at(str(tmp_path), 'eval_metrics', 4) == {'loss': 3.0}
  assert ('eval/loss', 4, 3.0) in read_scalars(tmp_path / 'tensorboard')


_FILL = """
import sys
from electra_jax import atomic, metric_writer
from electra_jax.errors import UserError
try:
  atomic.write_bytes(sys.argv[1] + '/big.bin', b'x' * 200_000)
except UserError as e:
  print(e)
log = atomic.AppendFile(sys.argv[1] + '/log.jsonl')
try:
  for _ in range(2000):
    log.write('y' * 99 + '\\n')
except UserError as e:
  print(e)
# tensorboardX's SummaryWriter hung here: its writer thread died, its queue filled.
events = metric_writer.TensorBoardEvents(sys.argv[1] + '/tensorboard', interval=0)
try:
  for step in range(2000):
    events.add_scalars(step, {'train/loss': 1.0, 'train/disc_auc': 0.5})
except UserError as e:
  print(e)
"""


def test_a_full_disk_is_one_line_naming_the_file_leaves_no_half_written_file_and_no_hang(
    tmp_path):
  proc = subprocess.run(['bash', '-c', 'ulimit -f 100 && exec "$@"', '--', sys.executable, '-c',
                         _FILL, str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=120, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
      f"writing {what}'{tmp_path}/{name}' failed (File too large); free disk space (or raise "
      'the quota or file size limit), then re-run the same command'
      for what, name in (('', 'big.bin'), ('', 'log.jsonl'),
                         ('TensorBoard directory ', 'tensorboard'))]
  # No big.bin, and no big.bin.tmp.
  assert sorted(os.listdir(tmp_path)) == ['log.jsonl', 'tensorboard']
