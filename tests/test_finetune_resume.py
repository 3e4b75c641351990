"""Fine-tuning resumes: a run killed anywhere and run again on the same workdir ends with the
results, metrics rows and best checkpoints of a run never interrupted; SIGTERM saves and exits
0; another config, finished results and a pretraining workdir are refused."""
import json
import os
import signal
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from configs.finetune import files as files_config
from electra_jax import checkpoint
from electra_jax.errors import UserError
from electra_jax.finetune import loop, progress
from tests.conftest import REPO_ROOT

# 64 rows in batches of 16: 4 steps an epoch; a periodic save every 3 steps lands mid-epoch.
SETTINGS = dict(random_init=True, model_size='demo', max_train_examples=64, max_eval_examples=32,
                max_seq_length=32, train_batch_size=16, eval_batch_size=32, num_epochs=2,
                num_seeds=2, save_checkpoints_steps=3, progress_bar=False)


def config(**overrides):
  c = files_config.get_config()
  c.update(dict(SETTINGS, train_file=os.path.join(REPO_ROOT, c.train_file),
                eval_file=os.path.join(REPO_ROOT, c.eval_file)))
  c.update(overrides)
  return c


class Killed(BaseException):
  """What a kill -9 leaves: nothing after the point it strikes runs (no handler, no close)."""


def _read(workdir):
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  rows, best = {}, {}
  for run in results['runs']:
    seed_dir = os.path.join(workdir, f'seed_{run["seed"]}')
    with open(os.path.join(seed_dir, 'metrics.jsonl'), encoding='utf-8') as f:
      rows[run['seed']] = f.read()
    assert sorted(os.listdir(seed_dir)) == ['best', 'metrics.jsonl', 'run.json']  # no resume/
    assert os.listdir(os.path.join(seed_dir, 'best')) == [str(run['best']['step'])]
    ckpt = checkpoint.Checkpointer(os.path.join(seed_dir, 'best'), read_only=True)
    best[run['seed']] = jax.tree.map(np.asarray, ckpt.read_state(run['best']['step']))
    ckpt.close()
  assert os.path.exists(os.path.join(workdir, 'network', 'config.json'))
  with open(os.path.join(workdir, 'init.json'), encoding='utf-8') as f:
    assert json.load(f) == {'init_checkpoint': None, 'step': None}  # random weights
  runs = json.loads(json.dumps(results['runs']).replace(workdir, 'WORKDIR'))
  return runs, rows, best


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('ft') / 'uninterrupted')
  loop.finetune(config(), workdir)
  return _read(workdir)


def _kill_before_the_config_is_written(monkeypatch):
  """network/ and init.json written, config.json (what marks a started run) not."""
  def write(workdir, c):
    raise Killed
  monkeypatch.setattr(loop.saved_config, 'write', write)


def _kill_in_train_batches(monkeypatch):
  """Seed 1, epoch 2, before its 4th batch: steps 5-7 trained, the save of step 6 the last."""
  original = loop.train_batches

  def batches(features, batch_size, seed, epoch, mesh):
    for i, batch in enumerate(original(features, batch_size, seed, epoch, mesh)):
      if (seed, epoch, i) == (1, 2, 3):
        raise Killed
      yield batch
  monkeypatch.setattr(loop, 'train_batches', batches)


def _kill_before_the_epoch_commits(monkeypatch):
  """Seed 1's first epoch end: its best checkpoint written, its resume state not."""
  original = checkpoint.Checkpointer.save

  def save(self, step, state, force=False, loop_state=None):
    if 'seed_1' in self.directory and loop_state is not None and step == 4:
      raise Killed
    return original(self, step, state, force=force, loop_state=loop_state)
  monkeypatch.setattr(checkpoint.Checkpointer, 'save', save)


def _kill_after_the_epoch_commits(monkeypatch):
  """Seed 1's first epoch end: committed, its metrics row and best pruning not done."""
  original = progress.write_metrics

  def write(seed_dir, history):
    if seed_dir.endswith('seed_1') and len(history) == 1:
      raise Killed
    original(seed_dir, history)
  monkeypatch.setattr(progress, 'write_metrics', write)


def _kill_before_the_seed_is_recorded(monkeypatch):
  """Seed 0's last epoch: trained, evaluated and its best saved, run.json not written."""
  def finish(seed_dir, run):
    raise Killed
  monkeypatch.setattr(progress, 'finish_seed', finish)


def _kill_after_the_seed_is_recorded(monkeypatch):
  """Seed 0's run.json written, its resume state not yet removed."""
  def drop(seed_dir):
    raise Killed
  monkeypatch.setattr(progress, '_drop_resume_state', drop)


@pytest.mark.parametrize('kill', [_kill_before_the_config_is_written, _kill_in_train_batches, _kill_before_the_epoch_commits,
                                  _kill_after_the_epoch_commits,
                                  _kill_before_the_seed_is_recorded,
                                  _kill_after_the_seed_is_recorded])
def test_a_killed_run_resumed_ends_as_the_uninterrupted_run(kill, uninterrupted, tmp_path,
                                                             monkeypatch):
  workdir = str(tmp_path / 'killed')
  with monkeypatch.context() as patch:
    kill(patch)
    with pytest.raises(Killed):
      loop.finetune(config(), workdir)
  assert not os.path.exists(os.path.join(workdir, 'results.json'))
  summary = loop.finetune(config(), workdir)
  runs, rows, best = _read(workdir)
  expected_runs, expected_rows, expected_best = uninterrupted
  assert runs == expected_runs  # every epoch's losses and metrics, best epoch and step
  assert rows == expected_rows
  for seed, params in best.items():
    jax.tree.map(np.testing.assert_array_equal, params, expected_best[seed])
  assert summary['best_accuracy_per_seed'] == [r['best']['eval_accuracy'] for r in runs]


def test_a_new_seed_count_or_learning_rate_is_refused_on_resume(tmp_path, monkeypatch):
  workdir = str(tmp_path / 'ft')
  with monkeypatch.context() as patch:
    _kill_in_train_batches(patch)
    with pytest.raises(Killed):
      loop.finetune(config(), workdir)
  with pytest.raises(UserError, match=r"holds an unfinished fine-tuning run with another config "
                                      r'\(learning_rate: 0.001 -> 0.002, num_seeds: 2 -> 3\)'):
    loop.finetune(config(learning_rate=2e-3, num_seeds=3), workdir)
  # Keys that change neither numbers nor files may differ, and keys another kind of task reads
  # (a run saved before tag_head existed, resumed with configs/finetune/official.py's).
  summary = loop.finetune(config(progress_bar=True, save_checkpoints_steps=0, tag_head='official',
                                 span_head='bert'), workdir)
  assert summary['num_seeds'] == 2
  with pytest.raises(UserError, match='already holds fine-tuning results'):
    loop.finetune(config(), workdir)


def test_an_unreadable_resume_state_is_one_line_naming_it_and_how_to_start_the_seed_over(
    tmp_path, monkeypatch):
  workdir = str(tmp_path / 'ft')
  with monkeypatch.context() as patch:
    _kill_in_train_batches(patch)
    with pytest.raises(Killed):
      loop.finetune(config(), workdir)
  step_dir = os.path.join(workdir, 'seed_1', progress.RESUME, '6')
  with open(os.path.join(step_dir, 'state', '_METADATA'), 'w', encoding='utf-8') as f:
    f.write('{"tree_metadata": garbage')
  with pytest.raises(UserError, match=rf'checkpoint step 6 in .*seed_1/resume cannot be read '
                                      rf'\(.*\); remove {step_dir} to train seed 1 again from '
                                      'its start'):
    loop.finetune(config(), workdir)


def test_a_run_killed_before_its_first_save_may_start_again_with_another_config(tmp_path,
                                                                               monkeypatch):
  workdir = str(tmp_path / 'ft')
  original = loop.train_batches

  def batches(*args):
    raise Killed
    yield from original(*args)  # pylint: disable=unreachable
  with monkeypatch.context() as patch:
    patch.setattr(loop, 'train_batches', batches)
    with pytest.raises(Killed):
      loop.finetune(config(), workdir)
  summary = loop.finetune(config(num_seeds=1, num_epochs=1, learning_rate=2e-3), workdir)
  assert summary['num_seeds'] == 1
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    assert json.load(f)['learning_rate'] == 2e-3


def test_resumed_seeds_start_from_the_pretraining_step_the_first_ones_did(tmp_path):
  pretraining = tmp_path / 'pretrain'
  ckpt = checkpoint.Checkpointer(str(pretraining / 'checkpoints'), keep=None, async_save=False)
  ckpt.save(7, {'w': np.zeros(2, np.float32)}, force=True)
  c = config(random_init=False, init_checkpoint=str(pretraining))
  workdir = str(tmp_path / 'ft')
  os.makedirs(workdir)
  assert progress.init_step(workdir, c, resuming=False) == 7
  progress.write_init(workdir, c, 7)
  ckpt.save(9, {'w': np.ones(2, np.float32)}, force=True)  # pretraining went on meanwhile
  assert progress.init_step(workdir, c, resuming=True) == 7
  assert progress.init_step(workdir, c, resuming=False) == 9
  # config.init_step picks an earlier one; a step that is not there lists those that are.
  assert progress.init_step(workdir, config(random_init=False, init_checkpoint=str(pretraining),
                                            init_step=7), resuming=False) == 7
  with pytest.raises(UserError, match=r'config.init_step=8 is not a checkpoint of .*; its '
                                      r'steps: \[7, 9\]'):
    progress.init_step(workdir, config(random_init=False, init_checkpoint=str(pretraining),
                                       init_step=8), resuming=False)
  with pytest.raises(UserError, match='config.init_step=7 picks a checkpoint of a pretraining'):
    progress.init_step(workdir, config(init_step=7), resuming=False)  # random weights
  ckpt.delete(7)
  ckpt.close()
  with pytest.raises(UserError, match=r'started from step 7 of .* which no longer holds it '
                                      r'\(steps: \[9\]\)'):
    progress.init_step(workdir, c, resuming=True)
  assert progress.init_step(workdir, config(), resuming=False) is None  # random weights


def test_a_pretraining_workdir_is_never_overwritten(tmp_path):
  workdir = tmp_path / 'pretrain'
  (workdir / 'checkpoints' / '5').mkdir(parents=True)
  (workdir / 'config.json').write_text('{"model_size": "demo"}\n')
  with pytest.raises(UserError, match='holds a pretraining run; fine-tune into a new'):
    loop.finetune(config(), str(workdir))
  assert (workdir / 'config.json').read_text() == '{"model_size": "demo"}\n'
  # Someone else's config.json was called a pretraining run, with advice that would fail.
  other = tmp_path / 'bert'
  other.mkdir()
  (other / 'config.json').write_text('{"architectures": ["BertModel"]}\n')
  with pytest.raises(UserError, match=re.escape(
      f"--workdir '{other}' holds a config.json that python -m electra_jax.finetune did not "
      'write (a transformers model directory?')):
    loop.finetune(config(), str(other))
  assert (other / 'config.json').read_text() == '{"architectures": ["BertModel"]}\n'


def test_sigterm_saves_exits_0_and_the_same_command_finishes(tmp_path):
  workdir = str(tmp_path / 'ft')
  flags = ['--config=configs/finetune/files.py', *[f'--config.{k}={v}' for k, v in
                                                   SETTINGS.items() if k != 'num_epochs'],
           '--config.num_epochs=15', '--config.num_seeds=1', f'--workdir={workdir}']
  env = dict(os.environ, PYTHONUNBUFFERED='1', JAX_PLATFORMS='cpu',
             PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  command = [sys.executable, '-m', 'electra_jax.finetune', *flags]
  proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  metrics = os.path.join(workdir, 'seed_0', 'metrics.jsonl')
  deadline = time.time() + 300
  while not os.path.exists(metrics) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  stopped = json.loads(out.strip().splitlines()[-1])
  assert stopped['status'] == 'interrupted' and stopped['seed'] == 0, out
  assert 'Re-run the same command to resume' in out
  saved = os.listdir(os.path.join(workdir, 'seed_0', 'resume'))
  assert len(saved) == 1
  done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr
  assert f'Resuming in {workdir}' in done.stdout
  assert 'seed 0: resuming at epoch ' in done.stdout and f'step {saved[0]}' in done.stdout
  with open(metrics, encoding='utf-8') as f:
    assert [json.loads(line)['epoch'] for line in f] == list(range(1, 16))
  assert json.loads(done.stdout.strip().splitlines()[-1])['num_seeds'] == 1
