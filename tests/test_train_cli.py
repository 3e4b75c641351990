"""End to end: the train and evaluate commands as a user runs them, in subprocesses (the loop
in-process where a test patches what it calls)."""
import concurrent.futures
import glob
import importlib.util
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

from electra_jax import checkpoint
from electra_jax import flops
from electra_jax import saved_config
from electra_jax import step_trace
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, saved_state

# A 1-layer model on a slice of the bundled corpus: the whole CLI path in a few seconds.
TINY_FLAGS = [
    '--config.num_layers=1', '--config.hidden_size=32', '--config.embedding_size=16',
    '--config.intermediate_size=64', '--config.num_heads=2', '--config.max_seq_length=32',
    '--config.train_batch_size=8', '--config.eval_batch_size=8', '--config.num_eval_steps=2',
    '--config.num_warmup_steps=2', '--config.log_every_steps=2', '--config.eval_every_steps=4',
    '--config.save_checkpoints_steps=3', '--config.progress_bar=false',
    '--config.steps_per_execution=1',
]


def run_cli(module, *flags, check=True, env=None, timeout=600):
  env = dict(env or os.environ, PYTHONUNBUFFERED='1', JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-m', module, *flags], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f'{module} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}')
  return proc


def last_json(stdout):
  return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def small_corpus(tmp_path_factory):
  """The first ~40 KB of two bundled training files, so data building takes no time."""
  root = tmp_path_factory.mktemp('corpus')
  src = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'train')
  for name in sorted(os.listdir(src))[:2]:
    with open(os.path.join(src, name), encoding='utf-8') as f:
      text = f.read(40_000)
    (root / name).write_text(text.rsplit('\n', 1)[0] + '\n', encoding='utf-8')
  return str(root / '*.txt')


def read_jsonl(path):
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope='module')
def trained(tmp_path_factory, small_corpus):
  """An 8-step run stopped after 5 steps then resumed by the same command; an uninterrupted 8."""
  base = tmp_path_factory.mktemp('runs')
  flags = ['--config=configs/demo.py', f'--config.train_files={small_corpus}', *TINY_FLAGS,
           '--config.num_train_steps=8']
  resumed, straight = str(base / 'resumed'), str(base / 'straight')
  # The uninterrupted run is independent of the other two: it runs alongside them (CI time).
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    # Tracing two steps must not change them (the exactness test below compares the states).
    third_future = pool.submit(run_cli, 'electra_jax.train', *flags, f'--workdir={straight}',
                               f'--profile_dir={base / "profile"}', '--profile_steps=3:4')
    # JAX logs each compile (stderr): the first call's must happen once, on its thread.
    logged = dict(os.environ, JAX_LOG_COMPILES='1')
    first = run_cli('electra_jax.train', *flags, f'--workdir={resumed}', '--stop_after_steps=5',
                    env=logged)
    checkpoints_after_first = sorted(os.listdir(os.path.join(resumed, 'checkpoints')), key=int)
    second = run_cli('electra_jax.train', *flags, f'--workdir={resumed}', env=logged)
    third = third_future.result()
  return dict(flags=flags, resumed=resumed, straight=straight, first=first, second=second,
              third=third, checkpoints_after_first=checkpoints_after_first,
              profile=str(base / 'profile'))


def test_train_writes_checkpoints_metrics_config_and_a_json_summary(trained):
  workdir = trained['resumed']
  first = last_json(trained['first'].stdout)
  assert first['status'] == 'interrupted' and first['step'] == 5
  assert 'Stopped at step 5' in trained['first'].stdout
  # The start-up line on the data: the corpus's examples, and 8 steps of 8 read over them.
  num_examples = int(re.search(r'^data: ([\d,]+) examples, ', trained['first'].stdout,
                               re.M)[1].replace(',', ''))
  assert 64 < num_examples  # Less than an epoch: a percentage.
  assert f'8 steps of 8 read {6400 / num_examples:.3g}% of them' in trained['first'].stdout
  done = last_json(trained['second'].stdout)
  assert (done['train_examples'], done['epochs']) == (num_examples, round(64 / num_examples, 4))
  # Every 3 steps plus the stop at 5; then 6 and the final 8, keeping the last 2 (demo config).
  assert trained['checkpoints_after_first'] == ['3', '5']
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints')), key=int) == ['6', '8']
  assert last_json(trained['second'].stdout)['status'] == 'completed'
  with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
    saved = json.load(f)
  assert saved['num_layers'] == 1 and saved['max_predictions_per_seq'] == 4
  rows = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  required = {'step', 'loss', 'mlm_loss', 'disc_loss', 'mlm_accuracy', 'sampled_accuracy',
              'disc_accuracy', 'disc_precision', 'disc_recall', 'disc_auc', 'learning_rate',
              'tokens_per_sec'}
  # The stop at 5 prints its partial window but leaves it to the resumed run to log at 6.
  assert [r['step'] for r in rows] == [2, 4, 6, 8]
  assert 'train step       5' in trained['first'].stdout
  for r in rows:
    assert required <= set(r)
    assert np.isfinite(r['loss'])
    # Window 5-6 holds only the resumed process's first call (step 6, compiling): no timing.
    assert r['tokens_per_sec'] is None if r['step'] == 6 else r['tokens_per_sec'] > 0
  assert [r['step'] for r in read_jsonl(os.path.join(workdir, 'eval_metrics.jsonl'))] == [4, 8]
  assert any(name.startswith('events.out.tfevents')
             for name in os.listdir(os.path.join(workdir, 'tensorboard')))


def test_throughput_leaves_out_the_compiling_first_step_and_gives_model_flops(trained):
  summary = last_json(trained['third'].stdout)
  assert 'first step 1: ' in trained['third'].stdout
  assert 'first step 6: ' in trained['second'].stdout  # Each process compiles its own step.
  first_step_sec = summary['first_step_sec']
  line = re.search(r'first step 1: [\d.]+s, after ([\d.]+)s of set-up \(data, initial or '
                   r'restored state\), the train step compiled \(or loaded\) in ([\d.]+)s '
                   r'alongside; peak memory [\d.]+ GB \(process RSS\)', trained['third'].stdout)
  # Set-up (the initial state's compile included) comes before the loop and within the run.
  assert line and 0 < summary['setup_sec'] < summary['wall_time_sec'] - first_step_sec
  assert abs(float(line[1]) - summary['setup_sec']) < 0.1
  assert abs(float(line[2]) - summary['train_compile_sec']) < 0.1
  assert summary['peak_memory_bytes'] > 50e6 and summary['memory_limit_bytes'] is None
  rows = read_jsonl(os.path.join(trained['straight'], 'metrics.jsonl'))
  # Window 1-2 times step 2 alone: far faster than its compiling first step (counted in, the
  # window would take 2 steps / (compile + a step) < 2 / first_step_sec).
  assert rows[0]['steps_per_sec'] > 4 / first_step_sec, (rows[0], first_step_sec)
  model_flops = flops.model_flops_per_step(saved_config.load(trained['straight']))
  assert summary['model_flops_per_step'] == model_flops
  assert summary['peak_tflops_per_device'] is None
  devices = int(re.search(r'(\d+) device\(s\)', trained['third'].stdout).group(1))
  for r in [*rows, summary]:
    assert r['mfu'] is None  # No peak is known for a CPU.
    assert np.isclose(r['model_tflops_per_sec_per_device'],
                      model_flops * r['steps_per_sec'] / devices / 1e12)
    assert np.isclose(r['tokens_per_sec'], r['steps_per_sec'] * 8 * 32)


@pytest.mark.parametrize('steps_per_execution', [1, 4])
def test_throughput_leaves_out_evaluations_checkpoint_saves_and_compiles(
    tmp_path, small_corpus, monkeypatch, steps_per_execution):
  """The loop in-process under a clock on which every save and evaluation, and every call of a
  length not run before (it compiles; the first call too), takes 1000 s: no window's
  throughput may count them (a save or evaluation mid-window or right after a log), and a
  window of compiling calls alone has none (null)."""
  # pylint: disable=import-outside-toplevel
  import time
  from electra_jax import checkpoint, eval_loop, experiment, train
  from tests.conftest import tiny_config
  offset = [0.0]

  class Clock:
    @staticmethod
    def time():
      return time.time() + offset[0]

  def slow(fn):
    def wrapped(*args, **kwargs):
      result = fn(*args, **kwargs)
      offset[0] += 1000.0
      return result
    return wrapped

  jit_train_steps = experiment.Experiment.jit_train_steps

  def compiling_slowly(self):
    train_steps, lengths = jit_train_steps(self), set()

    def call(state, window, batches, rng):
      result = train_steps(state, window, batches, rng)
      if batches['input_ids'].shape[0] not in lengths:
        offset[0] += 1000.0
      lengths.add(batches['input_ids'].shape[0])
      return result
    return call

  monkeypatch.setattr(train, 'time', Clock)
  monkeypatch.setattr(checkpoint.Checkpointer, 'save', slow(checkpoint.Checkpointer.save))
  monkeypatch.setattr(eval_loop, 'evaluate_params', slow(eval_loop.evaluate_params))
  monkeypatch.setattr(experiment.Experiment, 'jit_train_steps', compiling_slowly)
  # Logs at 2, 4, 6, 8; saves at 3 (inside window 3-4), 6 and 8; evaluations at 4 and 8.
  # At 4 steps a call these cut the calls to 1-2, 3 (a new length: compiles), 4, 5-6, 7-8.
  c = tiny_config(vocab_size=8000, num_layers=1, num_train_steps=8, log_every_steps=2,
                  save_checkpoints_steps=3, eval_every_steps=4, num_eval_steps=1,
                  progress_bar=False, train_files=small_corpus, eval_files=small_corpus,
                  steps_per_execution=steps_per_execution)
  workdir = str(tmp_path / 'run')
  summary = train.train_and_evaluate(c, workdir)
  # Three saves, two evaluations and the first call (and one compile of a second length).
  assert offset[0] == 6000.0 + (1000.0 if steps_per_execution == 4 else 0.0)
  rows = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  assert [r['step'] for r in rows] == [2, 4, 6, 8]
  if steps_per_execution == 4:  # Window 1-2 is the compiling first call alone.
    assert all(rows[0][key] is None for key in
               ('tokens_per_sec', 'steps_per_sec', 'model_tflops_per_sec_per_device', 'mfu'))
    rows = rows[1:]
  for r in rows:  # A window times at most its 2 steps: real training time only.
    assert 2 / r['steps_per_sec'] < 1000, r
  assert 7 / summary['steps_per_sec'] < 1000, summary  # Step 1 (or 3, compiling) left out.
  # The patched train_steps cannot be compiled ahead (no .lower): the loop's first call
  # compiled it, as it would without compile_ahead.py, and the run is otherwise the same.
  assert summary['train_compile_sec'] is None


def test_profile_dir_traces_exactly_the_chosen_steps(trained):
  assert f'profile of steps 3 to 4 written to {trained["profile"]}' in trained['third'].stdout
  events = read_trace(trained['profile'])
  assert executions(events) == 2  # One call per step (steps_per_execution=1).
  with open(os.path.join(trained['profile'], 'traced_steps.json'), encoding='utf-8') as f:
    assert json.load(f) == {'steps': 2}  # What benchmarks/profile_top_ops.py divides by.


def executions(events) -> int:
  """Host-side executions of the compiled train call in a trace ('[i] ...' are per device)."""
  return len([e for e in events if e.get('name', '').endswith('Execute (jit_train_steps)')
              and not e['name'].startswith('[')])


def read_trace(directory):
  [trace] = glob.glob(os.path.join(directory, 'plugins', 'profile', '*',
                                   'perfetto_trace.json.gz'))
  with gzip.open(trace, 'rt') as f:
    return json.load(f)['traceEvents']


@pytest.mark.parametrize('directory, steps, message', [
    ('/tmp/p', '4:2', '--profile_steps=4:2 must be FIRST:LAST'),
    ('/tmp/p', '3', '--profile_steps=3 must be FIRST:LAST'),
    (None, '3:4', '--profile_steps needs --profile_dir'),
    ('gs://bucket/profile', '', 'must be a local directory'),
])
def test_bad_profile_flags_are_refused(directory, steps, message):
  with pytest.raises(UserError, match=re.escape(message)):
    step_trace.StepTrace(directory, step_trace.parse_steps(steps))


def test_a_bad_profile_flag_stops_the_command_before_it_writes(tmp_path):
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', f'--workdir={tmp_path}/w',
                 '--profile_dir=gs://bucket/profile', check=False)
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith('error: --profile_dir=gs://bucket')
  assert not os.path.exists(tmp_path / 'w')
  # A run refused after the profile directory was made leaves neither behind.
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', f'--workdir={tmp_path}/w',
                 f'--profile_dir={tmp_path}/profile/sub', '--config.train_files=/nowhere/*.txt',
                 check=False)
  assert proc.returncode == 2 and 'no files match' in proc.stderr.lower(), proc.stderr
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('flags, message', [
    (['--dry_run', '--stop_after_steps=3'], '--stop_after_steps acts on a run that trains; '
     '--dry_run trains nothing: drop one or the other'),
    (['--dry_run', '--profile_dir=/tmp/p', '--profile_steps=2:3'], '--profile_dir and '
     '--profile_steps act on a run that trains'),
    (['--dry_run', '--sweep_remat=full'], '--sweep_remat chooses what --sweep tries; add --sweep'),
])
def test_flags_a_dry_run_or_a_run_without_sweep_never_reads_are_refused(flags, message):
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', *flags, check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
      f'error: {message}'), proc.stderr


def test_an_unwritable_profile_dir_is_refused_before_training(tmp_path):
  (tmp_path / 'file').write_text('')
  with pytest.raises(UserError, match="--profile_dir '.*file' is a file"):
    step_trace.StepTrace(str(tmp_path / 'file'), None)


def test_profile_steps_are_clipped_to_the_steps_this_run_takes(tmp_path):
  trace = step_trace.StepTrace(str(tmp_path), None)
  assert trace.plan(first_step=10, num_train_steps=100) is None
  assert (trace.first, trace.last) == (12, 14)  # Step 11 compiles; the three after it.
  trace = step_trace.StepTrace(str(tmp_path), (5, 50))
  assert trace.plan(first_step=10, num_train_steps=20) is None
  assert (trace.first, trace.last) == (11, 20)
  trace = step_trace.StepTrace(str(tmp_path), (1, 5))
  assert 'nothing traced' in trace.plan(first_step=10, num_train_steps=20)
  assert trace.directory is None  # before() and after() then do nothing.
  trace = step_trace.StepTrace(str(tmp_path), (1, 5))
  assert trace.plan(first_step=0, num_train_steps=20, enabled=False) is None
  assert trace.directory is None  # Processes other than 0 do not trace.
  # Calls of 4 steps from step 10: 11-12 (back onto multiples of 4, compiles), 13-16, ...
  trace = step_trace.StepTrace(str(tmp_path), None)
  assert trace.plan(first_step=10, num_train_steps=100, first_call_steps=2) is None
  assert (trace.first, trace.last) == (13, 15)


def test_calls_end_at_every_step_the_loop_acts_at_and_the_run_says_where_they_are_shorter(tiny):
  # pylint: disable=import-outside-toplevel
  from electra_jax import config as config_lib
  from electra_jax.data import prefetch
  # 4 steps a call; logs every 6, no evaluation, saves every 10, 20 steps.
  ends, step = [], 0
  while step < 20:
    step += prefetch.call_size(step, 4, (6, 0, 10, 20))
    ends.append(step)
  assert ends == sorted({s for s in range(1, 21) if s % 4 == 0 or s % 6 == 0 or s % 10 == 0})
  assert prefetch.call_size(3, 4) == 1  # Back onto multiples of 4 (e.g. a resumed run).
  # --stop_after_steps' step ends a call too (then nothing caps it).
  assert [prefetch.call_size(s, 10, (), stop_at=3) for s in (0, 2, 3)] == [3, 1, 7]
  aligned = tiny(steps_per_execution=5, num_train_steps=100, log_every_steps=10,
                 eval_every_steps=0, save_checkpoints_steps=50)
  assert config_lib.steps_per_execution_note(config_lib.resolve(aligned)) is None
  note = config_lib.steps_per_execution_note(config_lib.resolve(tiny(
      steps_per_execution=8, num_train_steps=96, log_every_steps=4, save_checkpoints_steps=48,
      eval_every_steps=0)))
  assert note.startswith('config.log_every_steps=4 is not a multiple of '
                         'config.steps_per_execution=8: calls also end there')


@pytest.fixture(scope='module')
def in_calls(tmp_path_factory, trained):
  """trained's 8 steps again: 3 one per call, then resumed at 4 steps a call, which the loop's
  logs every 2 and saves every 3 cut to 4, 5-6, 7-8; tracing the call that runs step 7 (5-6
  compiles).

  Twice in ~15 full-suite runs on the 2-core VM (sessions 22 and 30, never alone) the traced
  command died of SIGSEGV inside jax.profiler.stop_trace; that, and only that, is retried once
  from scratch (benchmarks/RESULTS.md)."""
  base = tmp_path_factory.mktemp('calls')
  for attempt in range(2):
    workdir = str(base / f'run{attempt}')
    flags = [*trained['flags'], f'--workdir={workdir}']
    profile = str(base / f'profile{attempt}')
    run_cli('electra_jax.train', *flags, '--stop_after_steps=3')
    resumed = run_cli('electra_jax.train', *flags, '--config.steps_per_execution=4',
                      f'--profile_dir={profile}', '--profile_steps=7:7', check=False)
    crashed = (resumed.returncode == -signal.SIGSEGV
               and 'in stop_trace' in resumed.stderr)
    if not (crashed and attempt == 0):
      break
    warnings.warn('the traced train command died of SIGSEGV in jax.profiler.stop_trace; '
                  'retrying once')
  assert resumed.returncode == 0, f'{resumed.returncode}:\n{resumed.stdout}\n{resumed.stderr}'
  return dict(workdir=workdir, resumed=resumed, profile=profile)


def test_steps_run_in_calls_match_one_step_a_call_exactly(trained, in_calls):
  stdout = in_calls['resumed'].stdout
  assert 'Resuming from step 3' in stdout and 'first step 4: ' in stdout
  assert ('note: config.log_every_steps=2 and config.save_checkpoints_steps=3 are not '
          'multiples of config.steps_per_execution=4') in stdout
  assert last_json(stdout)['status'] == 'completed'
  assert sorted(os.listdir(os.path.join(in_calls['workdir'], 'checkpoints')), key=int)[-2:] == \
      ['6', '8']
  calls, straight = saved_state(in_calls['workdir'], 8), saved_state(trained['straight'], 8)
  for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(calls),
                               jax.tree_util.tree_leaves_with_path(straight)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))
  by_step = lambda w: {r['step']: r for r in read_jsonl(os.path.join(w, 'metrics.jsonl'))}
  rows_calls, rows_straight = by_step(in_calls['workdir']), by_step(trained['straight'])
  assert sorted(rows_calls) == [2, 4, 6, 8]
  for step in (2, 4, 6, 8):
    for key in ('loss', 'disc_auc', 'grad_norm', 'learning_rate', 'skipped_steps'):
      assert rows_calls[step][key] == rows_straight[step][key], (step, key)
  # The trace holds the whole call that ran step 7: one execution for two steps.
  assert f'profile of steps 7 to 8 written to {in_calls["profile"]}' in stdout
  assert executions(read_trace(in_calls['profile'])) == 1
  with open(os.path.join(in_calls['profile'], 'traced_steps.json'), encoding='utf-8') as f:
    assert json.load(f) == {'steps': 2}


def test_the_first_call_compiles_once_beside_the_set_up(trained):
  """compile_ahead.py compiles the first call on a thread while the state initialises (the
  first run) or after the restore (the second); jit's call must then find that executable, not
  compile the step again (one call length here: one compile of train_steps per run)."""
  for run in (trained['first'], trained['second']):
    compiles = re.findall(r'Compiling jit\(train_steps\).*', run.stderr)
    assert len(compiles) == 1, compiles
    assert re.search(r'the train step compiled \(or loaded\) in [\d.]+s alongside', run.stdout)
  assert last_json(trained['second'].stdout)['train_compile_sec'] > 0


def test_the_first_call_compiles_while_the_state_initialises_and_the_eval_step_during_the_calls(
    tmp_path, small_corpus, monkeypatch, caplog):
  """The first call's compile runs beside the state's initialisation: a handshake (each side
  waits for the other to have begun) passes only if the compile thread starts before the
  initialisation and is not waited for before it (whatever the scheduling; the order of compile
  logs, which this test read before, was not, on a loaded machine).

  On a GPU or TPU compile_ahead.py also compiles the eval step on a thread once the loop starts
  (patched in here: on a CPU it would take the steps' cores, so the evaluation compiles it);
  the first evaluation must find it compiled and no evaluation compile it again."""
  # pylint: disable=import-outside-toplevel
  import logging
  import threading
  import types
  from electra_jax import compile_ahead, eval_loop, experiment, train
  from tests.conftest import tiny_config
  compile_began, init_began, met = threading.Event(), threading.Event(), []
  first_call_compile = compile_ahead.FirstCallCompile._compile
  init_state = experiment.Experiment.init_state

  def compiling(self, *args):
    compile_began.set()
    met.append(('init seen by the compile thread', init_began.wait(120)))
    return first_call_compile(self, *args)

  def initialising(self):
    met.append(('compile seen by the initialisation', compile_began.wait(120)))
    init_began.set()
    return init_state(self)

  monkeypatch.setattr(compile_ahead.FirstCallCompile, '_compile', compiling)
  monkeypatch.setattr(experiment.Experiment, 'init_state', initialising)
  assert not compile_ahead.compiles_eval_alongside(jax.devices()[0])
  assert compile_ahead.compiles_eval_alongside(types.SimpleNamespace(platform='gpu'))
  monkeypatch.setattr(compile_ahead, 'compiles_eval_alongside', lambda device: True)
  compiled = lambda: sum('Finished XLA compilation of jit(eval_step)' in r.getMessage()
                         for r in caplog.records)
  at_evaluations = []
  evaluate_params = eval_loop.evaluate_params

  def evaluating(*args, **kwargs):
    at_evaluations.append(compiled())
    return evaluate_params(*args, **kwargs)

  monkeypatch.setattr(eval_loop, 'evaluate_params', evaluating)
  c = tiny_config(vocab_size=8000, num_layers=1, train_files=small_corpus,
                  eval_files=small_corpus, num_train_steps=8, eval_every_steps=4,
                  num_eval_steps=1, log_every_steps=4,
                  save_checkpoints_steps=8, progress_bar=False)
  caplog.set_level(logging.WARNING)
  # Globally: `with jax.log_compiles()` would log this thread's compiles only.
  jax.config.update('jax_log_compiles', True)
  try:
    train.train_and_evaluate(c, str(tmp_path / 'run'))
  finally:
    jax.config.update('jax_log_compiles', False)
  assert sorted(met) == [('compile seen by the initialisation', True),
                         ('init seen by the compile thread', True)]
  first_call_compiles = sum('Finished XLA compilation of jit(train_steps)' in r.getMessage()
                            for r in caplog.records)
  assert first_call_compiles == 1  # The thread's executable served the first call.
  assert at_evaluations == [1, 1] and compiled() == 1
  rows = read_jsonl(str(tmp_path / 'run' / 'eval_metrics.jsonl'))
  assert [r['step'] for r in rows] == [4, 8] and all(r['disc_auc'] > 0 for r in rows)


def test_rerunning_the_same_command_resumes_where_it_stopped(trained):
  assert 'Resuming from step 5' in trained['second'].stdout
  assert last_json(trained['second'].stdout)['steps_run'] == 3


def test_resumed_run_matches_an_uninterrupted_run_exactly(trained):
  resumed, straight = saved_state(trained['resumed'], 8), saved_state(trained['straight'], 8)
  flat_resumed = jax.tree_util.tree_leaves_with_path(resumed)
  flat_straight = jax.tree_util.tree_leaves_with_path(straight)
  assert [p for p, _ in flat_resumed] == [p for p, _ in flat_straight]
  assert len(flat_resumed) > 20  # params and optimizer state
  for (path, a), (_, b) in zip(flat_resumed, flat_straight):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))
  # Every logged row is identical too (the window 5-6 straddles the stop).
  by_step = lambda w: {r['step']: r for r in read_jsonl(os.path.join(w, 'metrics.jsonl'))}
  rows_resumed, rows_straight = by_step(trained['resumed']), by_step(trained['straight'])
  assert sorted(rows_resumed) == sorted(rows_straight) == [2, 4, 6, 8]
  for step in (2, 4, 6, 8):
    for key in ('loss', 'disc_auc', 'grad_norm', 'learning_rate'):
      assert rows_resumed[step][key] == rows_straight[step][key], (step, key)


def test_a_dry_run_on_a_workdir_refuses_what_the_run_there_would(trained):
  """--dry_run --workdir=RUN plans that run: a config it would refuse is refused (the plan
  printed a model the real command then refused), and nothing is written."""
  workdir = trained['straight']
  before = sorted(os.listdir(workdir))
  proc = run_cli('electra_jax.train', *trained['flags'], f'--workdir={workdir}', '--dry_run',
                 '--config.hidden_size=64', check=False)
  assert proc.returncode == 2 and 'holds a model with different shapes (hidden_size: ' \
      in proc.stderr.strip().splitlines()[-1], proc.stderr
  proc = run_cli('electra_jax.train', *trained['flags'], f'--workdir={workdir}', '--dry_run',
                 '--config.learning_rate=0.5', check=False)
  assert proc.returncode == 2 and 'was trained with another config (learning_rate: ' \
      in proc.stderr, proc.stderr
  plan = last_json(run_cli('electra_jax.train', *trained['flags'], f'--workdir={workdir}',
                           '--dry_run').stdout)
  assert plan['num_params'] > 0 and sorted(os.listdir(workdir)) == before


def test_evaluate_restores_the_latest_checkpoint_and_reports_json(trained):
  proc = run_cli('electra_jax.evaluate', '--config=configs/demo.py',
                 f'--workdir={trained["resumed"]}', *trained['flags'][2:], '--num_batches=3')
  result = last_json(proc.stdout)
  assert result['step'] == 8 and result['num_batches'] == 3
  assert result['eval_files'] == 'data/demo_corpus/eval/*.txt'  # The run's own eval set.
  for key in ('loss', 'mlm_accuracy', 'disc_auc', 'disc_precision', 'unigram_baseline_accuracy'):
    assert key in result
  assert 0 < result['unigram_baseline_accuracy'] < 0.2
  assert re.search(r'evaluating: .*/3 ', proc.stderr)  # Its progress, as README promises.
  # Evaluation is deterministic: the same checkpoint gives the same numbers.
  again = last_json(run_cli('electra_jax.evaluate', '--config=configs/demo.py',
                            f'--workdir={trained["resumed"]}', *trained['flags'][2:],
                            '--num_batches=3').stdout)
  assert again['loss'] == result['loss']
  # On devices that do not divide eval_batch_size (8 on 3) it refused to run; all-zero rows
  # now fill each batch up: the same examples with the same masks, so training's metrics.
  three = last_json(run_cli('electra_jax.evaluate', f'--workdir={trained["resumed"]}',
                            '--num_batches=2', '--cpu_devices=3').stdout)
  at_training = read_jsonl(os.path.join(trained['resumed'], 'eval_metrics.jsonl'))[-1]
  assert at_training['step'] == three['step'] == 8
  for key in ('num_tokens', 'disc_accuracy', 'mlm_accuracy', 'disc_precision', 'disc_recall'):
    assert three[key] == at_training[key], key
  for key in ('loss', 'mlm_loss', 'disc_loss', 'disc_auc'):  # Float sums in another order.
    assert three[key] == pytest.approx(at_training[key], rel=1e-5), key
  # A --config with another optimizer (no clipping: another state tree) is named as the cause.
  proc = run_cli('electra_jax.evaluate', '--config=configs/demo.py',
                 f'--workdir={trained["resumed"]}', *trained['flags'][2:],
                 '--config.max_grad_norm=0', '--num_batches=1', check=False)
  assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert ("; if --config differs from the run's config in its optimizer, leave it out; else "
          'read one of its other steps') in proc.stderr
  # Training text evaluated is named as such (the run trained on the files of --eval_files).
  train_files = trained['flags'][1].split('=', 1)[1]
  proc = run_cli('electra_jax.evaluate', f'--workdir={trained["resumed"]}',
                 f'--eval_files={train_files}', '--num_batches=1')
  assert last_json(proc.stdout)['eval_files'] == train_files
  assert re.search(r"^note: \d+ of the eval set's \d+ file\(s\) are training files too",
                   proc.stdout, re.M)


def test_evaluate_names_its_own_flags_where_the_run_has_no_eval_set(trained, tmp_path):
  """Both hints named flags evaluate does not take as given (--config.eval_files: an unknown
  flag without --config=FILE)."""
  workdir = tmp_path / 'run'
  shutil.copytree(trained['resumed'], workdir)
  saved = json.loads((workdir / 'config.json').read_text())
  (workdir / 'config.json').write_text(json.dumps(dict(saved, eval_files='')))
  proc = run_cli('electra_jax.evaluate', f'--workdir={workdir}', check=False)
  assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [
      f"error: the run in '{workdir}' has no eval set (its eval_files is empty); pass "
      '--eval_files=GLOB'])
  proc = run_cli('electra_jax.evaluate', f'--workdir={workdir}', '--config.text_key=body',
                 check=False)
  assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [
      'error: --config.text_key overrides a key of a config file: pass the file too, '
      '--config=FILE'])
  # Its eval files on the machine that trained it: named as the run's, with the flag to pass.
  (workdir / 'config.json').write_text(json.dumps(dict(saved, eval_files='/old/eval/*.txt')))
  proc = run_cli('electra_jax.evaluate', f'--workdir={workdir}', check=False)
  assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [
      "error: the run's eval set (config.json): no files match '/old/eval/*.txt'; fix the glob "
      '(relative paths are tried from the current directory, then the repository root); or '
      'pass --eval_files=GLOB'])
  # The JSON line names the workdir as found (given relative to the current directory here).
  proc = run_cli('electra_jax.evaluate', f'--workdir={os.path.relpath(workdir, REPO_ROOT)}',
                 f'--eval_files={saved["eval_files"]}', '--num_batches=1')
  assert last_json(proc.stdout)['workdir'] == str(workdir)


def test_the_json_line_makes_every_nan_or_inf_null_inside_lists_and_dicts_too():
  """The summary line parses with any JSON parser (a diverged seed's [NaN] did not)."""
  from electra_jax import cli  # pylint: disable=import-outside-toplevel
  line = cli.json_line({'a': float('nan'), 'b': [1.5, float('inf')], 'c': {'d': (float('-inf'),)},
                        'e': 'x', 'f': 2})
  strict = lambda constant: pytest.fail(f'{constant} in {line}')
  assert json.loads(line, parse_constant=strict) == {
      'a': None, 'b': [1.5, None], 'c': {'d': [None]}, 'e': 'x', 'f': 2}


def test_a_run_keeps_its_vocabulary_and_resumes_with_it_wherever_the_file_went(
    tmp_path, small_corpus):
  """The vocabulary is copied into the workdir at the start and is what the saved config names
  (evaluate, export, detect and fine-tuning read it): another file at the path the run started
  with (a rebuilt vocabulary) is refused on resume, and a missing one does not stop it."""
  # pylint: disable=import-outside-toplevel
  import shutil
  from electra_jax import config as config_lib, experiment, train
  from tests.conftest import tiny_config
  demo_vocab = os.path.join(REPO_ROOT, 'data', 'demo_spm.model')
  vocab, workdir = tmp_path / 'mine.model', str(tmp_path / 'run')
  shutil.copy(demo_vocab, vocab)
  config = lambda steps: tiny_config(
      vocab_size=8000, vocab_file=str(vocab), train_files=small_corpus, num_train_steps=steps,
      eval_every_steps=0, save_checkpoints_steps=2, progress_bar=False,
      allow_config_change='num_train_steps,num_warmup_steps')
  train.train_and_evaluate(config(2), workdir)
  kept = os.path.join(workdir, 'spm.model')
  with open(kept, 'rb') as f, open(demo_vocab, 'rb') as g:
    assert f.read() == g.read()
  assert saved_config.load(workdir).vocab_file == kept
  # The same vocabulary elsewhere plans the same weights (compare's --pretrained).
  assert experiment.weight_changing_differences(
      saved_config.load(workdir).to_dict(),
      config_lib.resolve(config(2).copy_and_resolve_references())) == []
  vocab.write_bytes(b'another vocabulary')
  with pytest.raises(UserError, match=f"vocab_file '{vocab}' is not the vocabulary the run in "
                                      f"'{workdir}' was trained with"):
    train.train_and_evaluate(config(4), workdir)
  os.remove(vocab)
  assert train.train_and_evaluate(config(4), workdir)['step'] == 4
  assert saved_config.load(workdir).vocab_file == kept
  # evaluate --config=FILE reads the kept copy too, and refuses another file at vocab_file.
  config_file = tmp_path / 'tiny.py'
  config_file.write_text(
      'from tests.conftest import tiny_config\n\n\ndef get_config():\n  return tiny_config('
      f'vocab_size=8000, vocab_file={str(vocab)!r}, train_files={small_corpus!r})\n')
  evaluate = lambda: run_cli('electra_jax.evaluate', f'--config={config_file}',
                             f'--workdir={workdir}', '--num_batches=1', check=False)
  proc = evaluate()
  assert proc.returncode == 0, proc.stderr
  assert last_json(proc.stdout)['step'] == 4
  vocab.write_bytes(b'another vocabulary')
  proc = evaluate()
  assert proc.returncode == 2 and f"vocab_file '{vocab}' is not the vocabulary" in proc.stderr


def test_a_run_started_with_relative_paths_reads_the_same_files_from_any_directory(
    tmp_path, monkeypatch, small_corpus):
  """config.json keeps the data paths as found where training started: evaluate started in
  another directory reads the run's eval set, not other text at the same relative path there;
  resuming there with the same relative flags is refused instead of training on other text. An
  older workdir's relative paths still resume from the directory they were written in."""
  # pylint: disable=import-outside-toplevel
  import shutil
  from electra_jax import train
  from tests.conftest import tiny_config
  here, elsewhere = tmp_path / 'here', tmp_path / 'elsewhere'
  for directory in (here, elsewhere):
    (directory / 'text').mkdir(parents=True)
  for name in glob.glob(small_corpus):
    shutil.copy(name, here / 'text')
  (elsewhere / 'text' / 'other.txt').write_text('Other text entirely, in its own words.\n\n' * 300)
  workdir = str(tmp_path / 'run')
  config = lambda steps: tiny_config(
      vocab_size=8000, train_files='text/*.txt', eval_files='text/*.txt', num_train_steps=steps,
      eval_every_steps=0, save_checkpoints_steps=2, progress_bar=False,
      allow_config_change='num_train_steps,num_warmup_steps')
  monkeypatch.chdir(here)
  train.train_and_evaluate(config(2), workdir)
  saved_file = os.path.join(workdir, 'config.json')
  with open(saved_file, encoding='utf-8') as f:
    saved = json.load(f)
  assert saved['train_files'] == saved['eval_files'] == str(here / 'text' / '*.txt')
  assert saved['vocab_file'] == 'data/demo_spm.model'  # In the repository: wherever it moves.
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS='cpu')
  proc = subprocess.run([sys.executable, '-m', 'electra_jax.evaluate', f'--workdir={workdir}',
                         '--num_batches=1'], cwd=elsewhere, env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr
  assert last_json(proc.stdout)['eval_files'] == str(here / 'text' / '*.txt')
  monkeypatch.chdir(elsewhere)
  with pytest.raises(UserError, match=re.escape(
      f"trained with another config (train_files: '{here / 'text' / '*.txt'}' -> "
      f"'{elsewhere / 'text' / '*.txt'}')")):
    train.train_and_evaluate(config(4), workdir)
  # A workdir from before paths were saved absolute resumes where its paths name its files.
  saved.update(train_files='text/*.txt', eval_files='text/*.txt')
  with open(saved_file, 'w', encoding='utf-8') as f:
    json.dump(saved, f)
  monkeypatch.chdir(here)
  assert train.train_and_evaluate(config(4), workdir)['step'] == 4


def test_a_finished_run_re_run_keeps_one_final_evaluation_and_reports_it(tmp_path,
                                                                         small_corpus,
                                                                         monkeypatch):
  """Re-running a finished run trains nothing: eval_metrics.jsonl keeps one row per evaluated
  step (no second final row each time), the summary still reports the final rows (training's
  and evaluation's), and no evaluation is compiled ahead for an evaluation that never comes."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import compile_ahead, train
  from tests.conftest import tiny_config
  workdir = str(tmp_path / 'run')
  config = tiny_config(vocab_size=8000, train_files=small_corpus, num_train_steps=3,
                       eval_every_steps=2, num_eval_steps=1, save_checkpoints_steps=3,
                       log_every_steps=3, progress_bar=False)
  first = train.train_and_evaluate(config, workdir)
  # As on a GPU or TPU, where the first evaluation compiles alongside training.
  monkeypatch.setattr(compile_ahead, 'compiles_eval_alongside', lambda device: True)
  started = []
  monkeypatch.setattr(compile_ahead, 'FirstEvalCompile', lambda *a: started.append(a))
  again = train.train_and_evaluate(config, workdir)
  assert again['steps_run'] == 0 and not started
  rows = read_jsonl(os.path.join(workdir, 'eval_metrics.jsonl'))
  assert [r['step'] for r in rows] == [2, 3]
  evaluated = {k: v for k, v in first.items() if k.startswith('eval_')}
  assert 'eval_loss' in evaluated
  assert {k: v for k, v in again.items() if k.startswith('eval_')} == evaluated
  final_row = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))[-1]
  assert final_row['step'] == 3 and final_row['loss'] == first['loss']
  assert {k: again[k] for k in final_row if k != 'step'} == {
      k: v for k, v in final_row.items() if k != 'step'}
  # Shortened below its step, it is refused before config.json would say 2 beside step 3.
  saved = saved_config.load(workdir)
  with pytest.raises(UserError, match=re.escape(
      f'the run in {workdir} is at step 3, past --config.num_train_steps=2: a run cannot be '
      f'shortened; pass at least 3, or start a new --workdir with --config.init_from={workdir}/'
      'checkpoints/3')):
    train.train_and_evaluate(tiny_config(**dict(config, num_train_steps=2,
                                                allow_config_change='num_train_steps')), workdir)
  assert saved_config.load(workdir) == saved


def test_a_resume_at_a_longer_sequence_length_goes_on_at_the_new_length(tmp_path, small_corpus):
  """BERT's length schedule (README): refused until the length is allowed (the masking budget
  derived from it follows), then the run goes on from its step with batches of the new length."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import train
  from tests.conftest import tiny_config
  workdir = str(tmp_path / 'run')
  config = lambda length, allow='': tiny_config(
      vocab_size=8000, train_files=small_corpus, max_seq_length=length, num_train_steps=4,
      eval_every_steps=0, save_checkpoints_steps=2, log_every_steps=1, progress_bar=False,
      allow_config_change=allow)
  assert train.train_and_evaluate(config(16), workdir, stop_after_steps=2)['step'] == 2
  with pytest.raises(UserError, match=r'\(max_seq_length: 16 -> 32\).*'
                                      r'allow_config_change=max_seq_length$'):
    train.train_and_evaluate(config(32), workdir)
  summary = train.train_and_evaluate(config(32, 'max_seq_length'), workdir)
  assert (summary['step'], summary['steps_run']) == (4, 2)
  saved = saved_config.load(workdir)
  assert (saved.max_seq_length, saved.max_predictions_per_seq) == (32, 4)
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    rows = [json.loads(line) for line in f]
  assert [r['step'] for r in rows] == [1, 2, 3, 4]
  # Real tokens a step (timed steps: not the first of each run, which compiles): at most
  # 8 x 16 before, more than that after (the corpus packs full).
  tokens = {r['step']: r['tokens_per_sec'] / r['steps_per_sec'] for r in rows
            if r['tokens_per_sec'] is not None}
  assert sorted(tokens) == [2, 4] and tokens[2] <= 8 * 16 < tokens[4] <= 8 * 32


def test_only_a_masking_budget_both_runs_derived_follows_the_length(tmp_path):
  """A budget both runs left to its formula follows max_seq_length; one the user set (here 3,
  the formula giving 2 at 16 tokens) changes only when it is allowed itself."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import checkpoint, experiment
  from electra_jax import config as config_lib
  from tests.conftest import tiny_config

  def resume(saved_keys, **keys):
    workdir = str(tmp_path / str(len(os.listdir(tmp_path))))
    os.makedirs(os.path.join(checkpoint.directory_of(workdir), '2'))
    saved_config.write(workdir, config_lib.resolve(tiny_config(max_seq_length=16, **saved_keys)))
    return experiment.check_resume_config(workdir, config_lib.resolve(
        tiny_config(max_seq_length=32, allow_config_change='max_seq_length', **keys)))

  changed = ['allow_config_change', 'max_predictions_per_seq', 'max_seq_length']
  assert resume({}) == changed
  assert resume({'max_predictions_per_seq': 3}, max_predictions_per_seq=3) == changed[::2]
  with pytest.raises(UserError, match=r'\(max_predictions_per_seq: 3 -> 4\).*'
                                      r'allow_config_change=max_seq_length,'
                                      r'max_predictions_per_seq$'):
    resume({'max_predictions_per_seq': 3})
  # Its other source, mask_prob, is refused on its own account, and named alone.
  with pytest.raises(UserError, match=r'\(mask_prob: 0.15 -> 0.25\).*'
                                      r'allow_config_change=max_seq_length,mask_prob$'):
    resume({}, mask_prob=0.25)


def test_continuing_a_finished_run_as_its_last_line_says_goes_on_to_the_new_step(
    tmp_path, small_corpus, capsys):
  """A run shorter than its warmup warms up over the whole run (num_warmup_steps is cut to
  num_train_steps in config.json); continuing it as the finished run's line says, with
  num_train_steps alone allowed, is not refused for the warmup the cut changed."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import train
  from tests.conftest import tiny_config
  workdir = str(tmp_path / 'run')
  config = lambda steps, allow='', warmup=10: tiny_config(
      vocab_size=8000, train_files=small_corpus, max_seq_length=16, num_train_steps=steps,
      num_warmup_steps=warmup, eval_every_steps=0, save_checkpoints_steps=2, log_every_steps=1,
      progress_bar=False, allow_config_change=allow)
  assert train.train_and_evaluate(config(2), workdir)['step'] == 2
  assert saved_config.load(workdir).num_warmup_steps == 2
  train.train_and_evaluate(config(2), workdir)
  line = re.search(r'To continue, raise --config.num_train_steps and pass '
                   r'--config.allow_config_change=(\S+)\.', capsys.readouterr().out)
  summary = train.train_and_evaluate(config(4, line.group(1)), workdir)
  assert (summary['step'], summary['steps_run']) == (4, 2)
  assert saved_config.load(workdir).num_warmup_steps == 4
  # A warmup set below the first run's length was not cut: changing it is a change.
  with pytest.raises(UserError, match=r'\(num_warmup_steps: 4 -> 3\)'):
    train.train_and_evaluate(config(6, 'num_train_steps', warmup=3), workdir)


def test_stop_after_steps_stops_at_its_step_between_multiples_of_steps_per_execution(
    tmp_path, small_corpus):
  """compare's budget points stop runs at any step: a call ends there, not at the next
  multiple of steps_per_execution, and the resumed run goes back onto the multiples."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import train
  from tests.conftest import tiny_config
  workdir = str(tmp_path / 'run')
  config = tiny_config(vocab_size=8000, train_files=small_corpus, max_seq_length=16,
                       num_train_steps=10, steps_per_execution=5, eval_every_steps=0,
                       save_checkpoints_steps=10, log_every_steps=5, progress_bar=False)
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  assert train.train_and_evaluate(config, workdir, stop_after_steps=3)['step'] == 3
  # An in-process caller (a notebook) gets its Ctrl-C and SIGTERM handlers back.
  assert {s: signal.getsignal(s) for s in handlers} == handlers
  assert checkpoint.steps(workdir) == [3]
  assert train.train_and_evaluate(config, workdir, stop_after_steps=1)['step'] == 4
  summary = train.train_and_evaluate(config, workdir)
  assert (summary['step'], summary['steps_run']) == (10, 6)


@pytest.mark.parametrize('module, flags', [
    ('electra_jax.data.build_vocab', ['--vocab_size=300', '--output={tmp}/spm', '--input']),
    ('electra_jax.evaluate', ['--workdir={tmp}/w', '--eval_files']),
    ('electra_jax.train', ['--config=configs/demo.py', '--workdir={tmp}/w',
                           '--config.train_files']),
])
def test_a_glob_the_shell_expanded_is_refused_not_cut_to_its_first_file(module, flags, tmp_path):
  """`--input corpus/*.txt` (a space, no quotes): the shell passes the files as arguments and
  absl gives the flag only the first; every command refuses the rest, naming them."""
  files = sorted(glob.glob(os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'train', '*.txt')))
  proc = run_cli(module, *[f.format(tmp=tmp_path) for f in flags], *files, check=False)
  assert proc.returncode == 2, proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: unexpected arguments ['{files[1]}'") and 'quote a glob' in last
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('module, flags', [
    ('electra_jax.data.build_vocab', ['--input={repo}/data/demo_corpus/eval/*.txt',
                                      '--vocab_size=300', '--output=']),
    ('electra_jax.data.prepare', ['--config={repo}/configs/demo.py', '--output=']),
    ('electra_jax.finetune', ['--config={repo}/configs/finetune/files.py', '--workdir=']),
    ('electra_jax.detect', ['--workdir={repo}/nowhere', '--text=']),  # A repeatable flag.
])
def test_an_empty_path_flag_is_refused_not_read_as_the_current_directory(module, flags,
                                                                         tmp_path):
  """`--output=$UNSET`: build_vocab wrote its vocabulary at /, prepare and finetune their
  output into the directory the user stood in."""
  proc = subprocess.run(
      [sys.executable, '-m', module, *[f.format(repo=REPO_ROOT) for f in flags]], cwd=tmp_path,
      env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT), capture_output=True,
      text=True, timeout=600)
  flag = flags[-1].rstrip('=')
  assert (proc.returncode, proc.stderr.strip().splitlines()[-1]) == (
      2, f'error: {flag} is empty (an unset shell variable?); pass a value')
  assert not os.listdir(tmp_path)


def test_a_reader_that_leaves_early_ends_the_command_quietly():
  """`| head`: stdout's reader closes the pipe. The BrokenPipeError, a ConnectionError, was
  reported as a storage fault (exit 2); a shell reports SIGPIPE as 141."""
  proc = subprocess.Popen(
      [sys.executable, '-m', 'electra_jax.train', '--config=configs/demo.py', '--dry_run'],
      cwd=REPO_ROOT, env=dict(os.environ, JAX_PLATFORMS='cpu'), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  proc.stdout.close()  # Before the command prints anything: it starts up for seconds.
  stderr = proc.stderr.read()
  assert (proc.wait(timeout=600), stderr) == (141, '')


def test_unknown_config_key_is_an_error_naming_it(tmp_path):
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', f'--workdir={tmp_path}',
                 '--config.hiden_size=64', check=False)
  assert proc.returncode != 0
  assert 'hiden_size' in proc.stderr


def test_bad_value_is_a_one_line_error_without_traceback(tmp_path):
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', f'--workdir={tmp_path}',
                 '--config.max_seq_length=1024', check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith('error: config.max_seq_length=1024')
  assert 'Traceback' not in proc.stderr
  assert not os.listdir(tmp_path)  # nothing written


def test_missing_eval_files_fail_before_training_and_leave_no_new_workdir(tmp_path,
                                                                          small_corpus):
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', f'--workdir={tmp_path}/new/w',
                 f'--config.train_files={small_corpus}', '--config.eval_files=/nowhere/*.txt',
                 *TINY_FLAGS, check=False)
  assert proc.returncode == 2
  assert "error: no files match '/nowhere/*.txt'" in proc.stderr
  assert not os.path.exists(tmp_path / 'new')  # The folders it created are gone.
  (tmp_path / 'kept').mkdir()  # A folder the user made stays, empty or not.
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', f'--workdir={tmp_path}/kept',
                 f'--config.train_files={small_corpus}', '--config.eval_files=', *TINY_FLAGS,
                 check=False)
  assert proc.returncode == 2 and proc.stderr.splitlines() == [
      'error: config.eval_files is empty: there is no eval text to read; set '
      '--config.eval_files=GLOB (or --config.eval_every_steps=0 to train without evaluating)']
  assert os.path.isdir(tmp_path / 'kept') and not os.listdir(tmp_path / 'kept')


def test_resume_with_other_model_shapes_is_refused(trained):
  proc = run_cli('electra_jax.train', *trained['flags'], f'--workdir={trained["straight"]}',
                 '--config.hidden_size=64', check=False)
  assert proc.returncode == 2
  assert 'hidden_size: 32 -> 64' in proc.stderr
  proc = run_cli('electra_jax.train', *trained['flags'], f'--workdir={trained["straight"]}',
                 '--config.relative_attention_span=0', check=False)
  assert proc.returncode == 2 and 'relative_attention_span: 8 -> 0' in proc.stderr


def test_train_refuses_a_workdir_holding_another_kind_of_run_and_leaves_it_as_it_was(
    tmp_path, small_corpus):
  """A fine-tuning run's workdir, or a transformers directory (an easy slip for
  --config.init_from), holds a config.json that training there would replace."""
  for name, saved, message in [
      ('finetuned', {'task': 'files', 'model_size': 'demo'}, "finetuned' holds a fine-tuning run"),
      ('hf', {'model_type': 'electra'}, "hf' holds a config.json that python -m electra_jax.train "
       'did not write')]:
    workdir = tmp_path / name
    workdir.mkdir()
    (workdir / 'config.json').write_text(json.dumps(saved))
    proc = run_cli('electra_jax.train', '--config=configs/demo.py', *TINY_FLAGS,
                   f'--config.train_files={small_corpus}', f'--workdir={workdir}', check=False)
    assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
    assert message in proc.stderr and 'pass a new --workdir' in proc.stderr
    assert os.listdir(workdir) == ['config.json']
    assert json.loads((workdir / 'config.json').read_text()) == saved


def test_a_new_run_refuses_a_workdir_holding_files_it_would_write_over(tmp_path, small_corpus):
  """Without a run's config.json the folder is someone else's: the run's copy of its
  vocabulary (spm.model here) and its logs would replace files of those names."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import saved_config
  from tests.conftest import tiny_config
  workdir = tmp_path / 'mine'
  workdir.mkdir()
  (workdir / 'spm.model').write_bytes(b'my own model')
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', *TINY_FLAGS,
                 f'--config.train_files={small_corpus}', f'--workdir={workdir}', check=False)
  assert proc.returncode == 2 and proc.stderr.splitlines() == [
      f"error: --workdir '{workdir}' holds a spm.model other than the run's vocabulary, whose "
      'copy a new run writes under that name: pass a new --workdir or move that file away']
  assert os.listdir(workdir) == ['spm.model']
  assert (workdir / 'spm.model').read_bytes() == b'my own model'
  config = tiny_config(vocab_size=8000, train_files=small_corpus)
  # The same bytes (a first run killed before it wrote config.json) are its own copy.
  shutil.copy(config.vocab_file, workdir / 'spm.model')
  saved_config.check_trains_in(str(workdir), config)
  saved_config.check_trains_in(str(workdir), config, str(tmp_path))  # No file to compare.
  (workdir / 'eval_metrics.jsonl').write_text('{"step": 3}\n')
  with pytest.raises(UserError, match=re.escape(
      f"--workdir '{workdir}' holds eval_metrics.jsonl but no run's config.json")):
    saved_config.check_trains_in(str(workdir), config)
  saved_config.write(str(workdir), config)  # A run's workdir: it resumes there.
  saved_config.check_trains_in(str(workdir), config)


def test_a_runs_checkpoint_step_is_no_workdir_to_train_fine_tune_or_read(tmp_path):
  """A run written in RUN/checkpoints/8 goes when RUN's rotation deletes step 8; evaluate,
  detect and export read that step with --workdir=RUN --step=8."""
  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import progress
  from tests.conftest import tiny_config
  config = tiny_config()
  run = tmp_path / 'run'
  step = run / 'checkpoints' / '8'
  step.mkdir(parents=True)
  saved_config.write(str(run), config)
  for workdir in (step, step / 'new_run'):
    refused = (f"--workdir '{workdir}' lies in checkpoint step 8 of the run in '{run}', which "
               'deletes it with that step; pass a --workdir outside that run')
    with pytest.raises(UserError, match=re.escape(refused)):
      saved_config.check_trains_in(str(workdir), config)
    with pytest.raises(UserError, match=re.escape(refused)):
      progress.open_workdir(str(workdir), config)
  with pytest.raises(UserError, match=re.escape(
      f"'{step}' is checkpoint step 8 of the run in '{run}'; pass --workdir={run} --step=8")):
    saved_config.load(str(step))
  saved_config.check_trains_in(str(tmp_path / 'other' / 'checkpoints' / '8'), config)  # No run.


def test_a_folder_of_prepared_data_or_a_comparison_is_no_workdir_and_is_left_as_it_was(
    tmp_path, small_corpus):
  """--config.train_data_dir's folder passed as --workdir (or a comparison's --output) is
  refused by train and finetune before they write, and evaluate, export, detect and
  init_checkpoint, which read a run's config.json, say what the folder holds and how to use it."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import train
  from electra_jax.data import prepare
  from electra_jax.experiments import compare
  from electra_jax.finetune import progress
  from tests.conftest import tiny_config
  prepared, comparison = str(tmp_path / 'prepared'), str(tmp_path / 'comparison')
  prepare.prepare(tiny_config(vocab_size=8000, train_files=small_corpus), prepared,
                  progress=False)
  compare.prepare_output(comparison, {'configs': []}, [])
  holds = {prepared: 'prepared training data (python -m electra_jax.data.prepare); train on it '
                     f'with --config.train_data_dir={prepared}',
           comparison: 'a comparison (python -m electra_jax.experiments.compare); its runs are '
                       f'{comparison}/pretrain/NAME and {comparison}/finetune/NAME/STEP'}
  before = {d: sorted(os.listdir(d)) for d in holds}
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', *TINY_FLAGS,
                 f'--config.train_files={small_corpus}', f'--workdir={prepared}', check=False)
  assert proc.returncode == 2 and proc.stderr.splitlines() == [
      f"error: --workdir '{prepared}' holds {holds[prepared]}; pass a new --workdir"]
  for directory, what in holds.items():
    with pytest.raises(UserError, match=re.escape(f"--workdir '{directory}' holds {what}")):
      train.train_and_evaluate(tiny_config(vocab_size=8000, train_files=small_corpus), directory)
    with pytest.raises(UserError, match=re.escape(f"--workdir '{directory}' holds {what}")):
      progress.open_workdir(directory, None)
    with pytest.raises(UserError, match=re.escape(
        f"'{directory}' is not a training workdir: it holds {what}")):
      saved_config.load(directory)
    assert sorted(os.listdir(directory)) == before[directory]


@pytest.mark.parametrize('module, flags, message', [
    ('electra_jax.train', ['--config=configs/finetune/files.py', '--workdir=NEW'],
     "config file 'configs/finetune/files.py' is a fine-tuning config; pass a pretraining"),
    ('electra_jax.finetune', ['--config=configs/demo.py', '--workdir=NEW'],
     "config file 'configs/demo.py' is a pretraining config; fine-tuning takes one of"),
    ('electra_jax.train', ['--config=configs/demo.py', '--workdir=gs:/bucket/run'],
     "'gs:/bucket/run' is not a gs:// URL (a slash is missing); write gs://BUCKET/PATH"),
    ('electra_jax.train', ['--config=configs/demo.py', '--workdir=gs:///run'],
     "'gs:///run' names no bucket; write gs://BUCKET/PATH"),
    # Orbax globs in a checkpoint's folder: one named run[1] completed and never read back.
    ('electra_jax.train', ['--config=configs/demo.py', '--workdir=NEW[1]'],
     "--workdir 'NEW[1]' holds '[', which checkpointing and cloud storage read as a glob"),
    # The file is the mistake, not the key the other kind of config lacks.
    ('electra_jax.finetune', ['--config=configs/demo.py', '--workdir=NEW',
                              '--config.init_checkpoint=NEW'],
     "config file 'configs/demo.py' is a pretraining config; fine-tuning takes one of"),
    ('electra_jax.export', ['--workdir=NEW', '--learning_rate=1'],  # No --config to put it in.
     "error: Unknown command line flag 'learning_rate'; see --help"),
    ('electra_jax.train', ['--config=configs/demo.py', '--workdir=NEW', '--num_train_steps=5'],
     'unknown flag --num_train_steps; it is a config key: write --config.num_train_steps=...'),
    ('electra_jax.evaluate', ['--workdir=s3://bucket/run'],
     "'s3://bucket/run': s3:// paths are not supported; use a local path or gs://BUCKET/PATH"),
    ('electra_jax.train', ['--config=configs/demo.py', '--workdir=NEW',
                           '--config.train_files=https://example.com/a.txt'],
     "https:// paths are not supported"),
    ('electra_jax.export', ['--workdir=NEW', '--output=GS://somebkt'],
     "--output 'GS://somebkt' is a bucket's root; pass a folder in it, e.g. gs://somebkt/hf"),
    ('electra_jax.evaluate', ['--workdir=NEW', '--num_batches=-2'],
     '--num_batches=-2 must be >= 0'),
    ('electra_jax.evaluate', ['NEW'],
     "error: --workdir is required; pass --workdir=... ('NEW' has no flag name: write "
     '--workdir=NEW); see --help'),
    ('electra_jax.finetune', ['--workdir', 'NEW'], 'error: --config is required; pass '
     '--config=...; see --help'),
])
def test_command_line_mistakes_are_one_line_before_anything_is_written(module, flags, message,
                                                                       tmp_path):
  new = tmp_path / 'new'
  proc = run_cli(module, *[f.replace('NEW', str(new)) for f in flags], check=False)
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
  assert message.replace('NEW', str(new)) in proc.stderr
  assert not new.exists() and not os.path.exists(os.path.join(REPO_ROOT, 'gs:'))
  assert not os.path.exists(f'{new}[1]')


@pytest.mark.parametrize('bad', [b'\n\n', b'caf\xe9 au lait\n',
                                 b'A good document.\n\nAnother one.\ncaf\xe9 au lait\n'])
def test_an_eval_set_with_a_file_of_no_text_or_a_line_not_utf8_is_refused_before_training(
    tmp_path, small_corpus, bad):
  """Also after a good file, or a good document: only the first document was read, and the
  error came at the first evaluation, which also cost the checkpoint due at its step."""
  (tmp_path / 'a.txt').write_text('A good first file.\n')
  (tmp_path / 'b.txt').write_bytes(bad)
  proc = run_cli('electra_jax.train', '--config=configs/demo.py', *TINY_FLAGS,
                 f'--config.train_files={small_corpus}', f'--config.eval_files={tmp_path}/*.txt',
                 f'--workdir={tmp_path / "run"}', check=False)
  assert proc.returncode == 2 and 'b.txt' in proc.stderr, proc.stderr
  assert 'train step' not in proc.stdout and not os.path.exists(tmp_path / 'run' / 'config.json')


@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None, reason='needs libtpu installed')
def test_no_tpu_runtime_start_where_there_is_no_tpu():
  """With libtpu installed (the tpu and test extras) on a machine without a TPU, a command runs
  on the CPU without libtpu's start-up errors (libtpu 0.0.42 prints five lines)."""
  from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
  if hardware_utils.num_available_tpu_chips_and_device_id()[0]:
    pytest.skip('this machine has a TPU')
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  proc = subprocess.run([sys.executable, '-m', 'electra_jax.train', '--config=configs/demo.py',
                         '--dry_run', '--cpu_devices=1'], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=300, check=True)
  assert last_json(proc.stdout)['platform'] == 'cpu'
  assert 'TPU' not in proc.stderr, proc.stderr


@pytest.mark.parametrize('jax_platforms, libtpu, chips, plugins, cpu_only', [
    (None, True, 0, [], True),                # libtpu on a laptop: the CPU.
    (None, False, 0, [], False),              # No libtpu: nothing to skip.
    (None, True, 4, [], False),               # A TPU VM.
    (None, True, 0, ['xla_cuda13'], False),   # A GPU plugin: JAX chooses.
    ('cpu,tpu', True, 0, [], False),          # The user chose ($JAX_PLATFORMS).
])
def test_the_cpu_is_chosen_only_where_it_is_the_only_platform(jax_platforms, libtpu, chips,
                                                               plugins, cpu_only):
  from electra_jax import cli  # pylint: disable=import-outside-toplevel
  assert cli.cpu_is_the_only_platform(jax_platforms, libtpu, chips, plugins) == cpu_only


def test_jax_plugins_are_found_where_jax_looks(tmp_path, monkeypatch):
  from electra_jax import cli  # pylint: disable=import-outside-toplevel
  (tmp_path / 'jax_plugins' / 'fake_gpu').mkdir(parents=True)
  (tmp_path / 'jax_plugins' / 'fake_gpu' / '__init__.py').write_text('')
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, 'jax_plugins', raising=False)
  assert 'fake_gpu' in cli._jax_plugins()  # pylint: disable=protected-access


def test_a_checkpoint_whose_window_lacks_a_newer_metric_resumes(tmp_path, small_corpus):
  """A stop mid-window saves the window's sums; a checkpoint written before a sum existed
  (masked_count) resumes with that sum starting at 0, not a pytree-structure error."""
  workdir = str(tmp_path / 'run')
  flags = ['--config=configs/demo.py', f'--config.train_files={small_corpus}', *TINY_FLAGS,
           '--config.num_train_steps=6', '--config.eval_every_steps=0', f'--workdir={workdir}']
  run_cli('electra_jax.train', *flags, '--stop_after_steps=5')
  loop_file = os.path.join(workdir, 'checkpoints', '5', 'loop', 'metadata')  # Orbax's JSON
  with open(loop_file, encoding='utf-8') as f:
    loop = json.load(f)
  del loop['window']['masked_count']  # As an earlier version saved it.
  with open(loop_file, 'w', encoding='utf-8') as f:
    json.dump(loop, f)
  resumed = run_cli('electra_jax.train', *flags)
  assert last_json(resumed.stdout)['status'] == 'completed'
  [row] = [r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl')) if r['step'] == 6]
  # Step 5's sums carried over (two steps' tokens), step 6's predictions alone counted.
  assert np.isfinite(row['loss']) and 0.03 < row['masked_fraction'] < 0.1


def test_a_stopped_run_ended_or_resumed_with_other_sizes_logs_its_window_and_counts_epochs(
    tmp_path, small_corpus):
  """Stopped at step 3 between logs (every 2): ended there (num_train_steps lowered to 3), its
  checkpoint's window is step 3's row, as the step ending a run logs; resumed with a larger
  batch, the summary's epochs count the examples read (3 x 8 + 16), not step x batch."""
  flags = ['--config=configs/demo.py', f'--config.train_files={small_corpus}', *TINY_FLAGS]
  stopped = str(tmp_path / 'stopped')
  first = run_cli('electra_jax.train', *flags, '--config.num_train_steps=8',
                  f'--workdir={stopped}', '--stop_after_steps=3')
  assert last_json(first.stdout)['step'] == 3
  assert [r['step'] for r in read_jsonl(os.path.join(stopped, 'metrics.jsonl'))] == [2]
  resumed = str(tmp_path / 'resumed')
  shutil.copytree(stopped, resumed)
  ended = last_json(run_cli('electra_jax.train', *flags, '--config.num_train_steps=3',
                            '--config.allow_config_change=num_train_steps',
                            f'--workdir={stopped}').stdout)
  rows = read_jsonl(os.path.join(stopped, 'metrics.jsonl'))
  assert [r['step'] for r in rows] == [2, 3]
  assert ended['status'] == 'completed' and ended['loss'] == rows[-1]['loss'] > 0
  assert rows[-1]['tokens_per_sec'] is None  # No step of it was timed.
  done = last_json(run_cli('electra_jax.train', *flags, '--config.num_train_steps=4',
                           '--config.train_batch_size=16',
                           '--config.allow_config_change=num_train_steps,train_batch_size',
                           f'--workdir={resumed}').stdout)
  assert done['step'] == 4
  assert done['epochs'] == round((3 * 8 + 16) / done['train_examples'], 4)
