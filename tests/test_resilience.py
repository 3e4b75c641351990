"""A run survives SIGKILL, SIGTERM, corrupt checkpoints, NaN steps and a full disk; bad input
fails with one line. End to end through the train CLI in subprocesses (README: "What happens
when a run dies").

Every subprocess shares one JAX compilation cache, so only the first one pays for compiling.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import portpicker
import pytest

from electra_jax import checkpoint, experiment, metric_writer, optim, parallel, saved_config
from electra_jax import config as config_lib
from electra_jax import train_state as ts
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, saved_state, tiny_config, tiny_trainer, xla_flags_with
from tests.nan_steps import NaNAtSteps
from tests.test_metric_writer import read_scalars
from tests.test_model_objective import toy_batch
# small_corpus is a fixture used here by name.
from tests.test_train_cli import (  # pylint: disable=unused-import
    TINY_FLAGS, last_json, read_jsonl, small_corpus)

NUM_STEPS = 12
# Checkpoints at 3, 6, 9, 12 (all kept), metrics every 2 steps, evaluation every 4.
FLAGS = ['--config=configs/demo.py', *TINY_FLAGS, f'--config.num_train_steps={NUM_STEPS}',
         '--config.keep_checkpoint_max=4']
TIMING_KEYS = ('tokens_per_sec', 'steps_per_sec', 'model_tflops_per_sec_per_device', 'mfu')


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('jax_cache'))


def env_for(cache_dir, **extra):
  env = dict(os.environ, PYTHONUNBUFFERED='1', JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT,
             JAX_COMPILATION_CACHE_DIR=cache_dir,
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='-1')
  env.update(extra)
  return env


def train_command(corpus, workdir, *extra):
  return [sys.executable, '-m', 'electra_jax.train', *FLAGS, f'--config.train_files={corpus}',
          f'--workdir={workdir}', *extra]


def train(cache_dir, corpus, workdir, *extra, check=True, env=None, max_file_kb=None):
  command = train_command(corpus, workdir, *extra)
  if max_file_kb:  # No file may grow past this: a disk that fills up.
    command = ['bash', '-c', f'ulimit -f {max_file_kb} && exec "$@"', '--', *command]
  proc = subprocess.run(command, cwd=REPO_ROOT, env=env or env_for(cache_dir),
                        capture_output=True, text=True, timeout=600)
  if check and proc.returncode != 0:
    raise AssertionError(f'train failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}')
  return proc


def start_and_signal(cache_dir, corpus, workdir, sig, after_line, delay):
  """Starts training, sends `sig` `delay` seconds after stdout shows `after_line`."""
  with open(os.path.join(os.path.dirname(workdir), 'stderr.txt'), 'w', encoding='utf-8') as err:
    proc = subprocess.Popen(train_command(corpus, workdir), cwd=REPO_ROOT, env=env_for(cache_dir),
                            stdout=subprocess.PIPE, stderr=err, text=True)
    lines = []
    for line in proc.stdout:
      lines.append(line)
      if line.startswith(after_line):
        time.sleep(delay)
        proc.send_signal(sig)
        break
    lines.extend(proc.stdout)
    proc.wait(timeout=300)
  return proc.returncode, ''.join(lines)


def assert_same_state(workdir_a, workdir_b, step=NUM_STEPS):
  a = jax.tree_util.tree_leaves_with_path(
      saved_state(workdir_a, step))
  b = jax.tree_util.tree_leaves_with_path(
      saved_state(workdir_b, step))
  assert [p for p, _ in a] == [p for p, _ in b]
  assert len(a) > 20  # parameters and optimizer state
  for (path, x), (_, y) in zip(a, b):
    assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)


def assert_same_metrics(workdir_a, workdir_b):
  """metrics.jsonl and eval_metrics.jsonl hold the same rows, up to wall-clock timings."""
  for name in ('metrics.jsonl', 'eval_metrics.jsonl'):
    rows = [[{k: v for k, v in r.items() if k not in TIMING_KEYS}
             for r in read_jsonl(os.path.join(w, name))] for w in (workdir_a, workdir_b)]
    assert rows[0] == rows[1], name


@pytest.fixture(scope='module')
def reference(tmp_path_factory, cache_dir, small_corpus):
  """An uninterrupted run: what every interrupted run must end up identical to."""
  workdir = str(tmp_path_factory.mktemp('reference') / 'w')
  train(cache_dir, small_corpus, workdir)
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints')), key=int) == ['3', '6', '9',
                                                                                '12']
  return workdir


@pytest.mark.parametrize('seed', [0, 1])
def test_sigkill_at_a_random_point_then_rerun_equals_an_uninterrupted_run(
    seed, tmp_path, cache_dir, small_corpus, reference):
  rng = random.Random(seed)
  after_step, delay = rng.choice([2, 4]), rng.uniform(0.0, 0.15)
  workdir = str(tmp_path / 'w')
  returncode, _ = start_and_signal(cache_dir, small_corpus, workdir, signal.SIGKILL,
                                   f'train step {after_step:>7d}', delay)
  assert returncode == -signal.SIGKILL  # killed, not finished
  assert not os.path.exists(os.path.join(workdir, 'checkpoints', str(NUM_STEPS)))
  resumed = train(cache_dir, small_corpus, workdir)
  assert last_json(resumed.stdout)['status'] == 'completed'
  assert_same_state(workdir, reference)
  assert_same_metrics(workdir, reference)


def test_a_second_ctrl_c_quits_at_once_and_says_so_in_one_line(capsys):
  """The first Ctrl-C (or SIGTERM) asks for a stop after the step; a second Ctrl-C quits now
  (a compile may take minutes): KeyboardInterrupt, which a command reports as one line, 130.
  A SIGINT within a second of the first is the same Ctrl-C, forwarded (compare's children get
  the terminal's and compare's own)."""
  from electra_jax import stop_request  # pylint: disable=import-outside-toplevel
  stop = stop_request.StopRequest()
  stop(signal.SIGTERM, None)
  stop(signal.SIGTERM, None)  # A scheduler's repeated SIGTERM still waits for the step.
  assert stop.signal == signal.SIGTERM
  stop = stop_request.StopRequest()
  stop(signal.SIGINT, None)
  assert 'SIGINT: stopping after the current step, then saving; Ctrl-C again to quit at ' \
      'once' in capsys.readouterr().err
  stop(signal.SIGINT, None)  # Right after: the same Ctrl-C forwarded by a wrapper (compare).
  assert stop.signal == signal.SIGINT
  stop._first_sigint_at -= 2  # pylint: disable=protected-access  # Two seconds later:
  with pytest.raises(KeyboardInterrupt):
    stop(signal.SIGINT, None)
  command = ('from electra_jax import cli\n'
             'def main(argv):\n  raise KeyboardInterrupt\n'
             'cli.run(main)\n')
  proc = subprocess.run([sys.executable, '-c', command], cwd=REPO_ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert (proc.returncode, proc.stderr.strip().splitlines()) == (130, ['interrupted'])


def test_a_failing_run_reports_its_own_error_after_every_cleanup_ran(tmp_path, monkeypatch):
  """A run that fails closes its checkpointer, writer, ... newest first; a cleanup that fails
  too (a pending save on the same full disk) neither hides the run's error nor skips the
  cleanups after it."""
  from electra_jax import train  # pylint: disable=import-outside-toplevel
  ran = []

  def failing_cleanup():
    ran.append('failing')
    raise OSError('No space left on device')

  def fake_run(config, workdir, stop_after_steps, on_error, *args):
    del config, workdir, stop_after_steps, args
    on_error.extend([lambda: ran.append('first'), failing_cleanup, lambda: ran.append('last')])
    raise ValueError('the run diverged')

  monkeypatch.setattr(train, '_train_and_evaluate', fake_run)
  with pytest.raises(ValueError, match='the run diverged') as raised:
    train.train_and_evaluate(None, str(tmp_path / 'run'))
  assert ran == ['last', 'failing', 'first']
  assert raised.value.__context__ is None  # Not "during handling of ... OSError".


def test_an_evaluation_that_fails_costs_no_training_and_the_rerun_evaluates_its_step(
    tmp_path, small_corpus, monkeypatch):
  """A save and an evaluation due at one step: the save comes first, so an evaluation that
  fails (out of memory, say) leaves that step's checkpoint; the re-run evaluates the step
  before training on, and its rows and state are an uninterrupted run's."""
  from electra_jax import eval_loop, train  # pylint: disable=import-outside-toplevel
  config = lambda: tiny_config(train_files=small_corpus, eval_files=small_corpus, vocab_size=8000,
                               num_layers=1, num_train_steps=8, num_warmup_steps=2,
                               log_every_steps=2, eval_every_steps=4, num_eval_steps=1,
                               save_checkpoints_steps=4, progress_bar=False)
  reference = str(tmp_path / 'reference')
  train.train_and_evaluate(config(), reference)
  workdir = str(tmp_path / 'w')
  evaluate = eval_loop.evaluate_params
  def out_of_memory(*args, **kwargs):
    del args, kwargs
    raise RuntimeError('RESOURCE_EXHAUSTED: out of memory while evaluating')
  monkeypatch.setattr(eval_loop, 'evaluate_params', out_of_memory)
  with pytest.raises(RuntimeError, match='RESOURCE_EXHAUSTED'):
    train.train_and_evaluate(config(), workdir)
  assert checkpoint.steps(workdir) == [4]
  assert not os.path.exists(os.path.join(workdir, 'eval_metrics.jsonl'))
  monkeypatch.setattr(eval_loop, 'evaluate_params', evaluate)
  summary = train.train_and_evaluate(config(), workdir)
  assert summary['status'] == 'completed'
  assert [r['step'] for r in read_jsonl(os.path.join(workdir, 'eval_metrics.jsonl'))] == [4, 8]
  assert_same_metrics(workdir, reference)
  assert_same_state(workdir, reference, 8)


def test_ctrl_c_in_one_of_two_processes_stops_both_at_one_saved_step(tmp_path, cache_dir,
                                                                     small_corpus):
  """With several processes Ctrl-C raised KeyboardInterrupt in its process alone: no
  checkpoint, and the other process waited in the next collective. It now goes to JAX's
  preemption service, as SIGTERM does: both save the same step and exit 0."""
  workdir = str(tmp_path / 'w')
  port = portpicker.pick_unused_port()
  with open(tmp_path / 'stderr_0', 'w', encoding='utf-8') as err_0, \
       open(tmp_path / 'stderr_1', 'w', encoding='utf-8') as err_1:
    procs = [subprocess.Popen(
        train_command(small_corpus, workdir, '--config.num_train_steps=2000',
                      '--config.eval_every_steps=0', '--cpu_devices=1',
                      f'--coordinator_address=localhost:{port}', '--num_processes=2',
                      f'--process_id={i}'),
        cwd=REPO_ROOT, env=env_for(cache_dir), stdout=subprocess.PIPE, stderr=err, text=True)
        for i, err in enumerate((err_0, err_1))]
    lines = []
    for line in procs[0].stdout:
      lines.append(line)
      if line.startswith('train step'):
        procs[1].send_signal(signal.SIGINT)
        break
    lines.extend(procs[0].stdout)
    for proc in procs:
      proc.wait(timeout=300)
  stderr = [(tmp_path / f'stderr_{i}').read_text(encoding='utf-8') for i in range(2)]
  assert [p.returncode for p in procs] == [0, 0], stderr
  assert 'SIGINT: every process stops after the current step, then saving' in stderr[1]
  result = last_json(''.join(lines))
  assert result['status'] == 'interrupted' and 2 <= result['step'] < 2000, result
  assert checkpoint.steps(workdir)[-1] == result['step']


def test_sigterm_saves_exits_0_and_resumes_exactly_after_a_failed_save(
    tmp_path, cache_dir, small_corpus, reference):
  workdir = str(tmp_path / 'w')
  returncode, stdout = start_and_signal(cache_dir, small_corpus, workdir, signal.SIGTERM,
                                        'train step       4', 0.0)
  assert returncode == 0
  with open(tmp_path / 'stderr.txt', encoding='utf-8') as f:
    assert 'SIGTERM: stopping after the current step, then saving\n' in f.read()
  result = last_json(stdout)
  stopped = result['step']
  assert result['status'] == 'interrupted' and 4 <= stopped < NUM_STEPS
  saved = os.path.join(workdir, 'checkpoints', str(stopped))
  assert f'checkpoint saved in {saved}' in stdout and result['checkpoint'] == saved
  assert os.path.isdir(saved)

  # Disk full on the next save (files limited to 100 KB): one line, the checkpoint kept.
  # (On a copy of the compilation cache: an entry cut short there would not be reused.)
  cache_copy = str(tmp_path / 'cache')
  shutil.copytree(cache_dir, cache_copy)
  full = train(cache_dir, small_corpus, workdir, check=False, max_file_kb=100,
               env=env_for(cache_copy))
  assert full.returncode == 2
  error = full.stderr.strip().splitlines()[-1]
  assert error.startswith('error: saving a checkpoint in') and 'Free disk space' in error, (
      full.stderr[-3000:])
  assert f'failed (File too large); the newest complete checkpoint, step {stopped}, is ' \
      'intact' in error
  # Orbax's background threads log each failed write: a line each, no tracebacks.
  assert 'Traceback' not in full.stderr and len(full.stderr.splitlines()) < 10, full.stderr
  assert os.path.isdir(saved)

  resumed = train(cache_dir, small_corpus, workdir)
  assert f'Resuming from step {stopped}' in resumed.stdout
  assert_same_state(workdir, reference)
  assert_same_metrics(workdir, reference)


def test_corrupt_checkpoints_are_moved_aside_and_training_resumes_from_the_newest_good_one(
    tmp_path, cache_dir, small_corpus, reference):
  workdir = str(tmp_path / 'w')
  shutil.copytree(reference, workdir)
  ckpts = os.path.join(workdir, 'checkpoints')

  def biggest_array_file(step):
    d = os.path.join(ckpts, str(step), 'state', 'ocdbt.process_0', 'd')
    return max((os.path.join(d, n) for n in os.listdir(d)), key=os.path.getsize)

  truncated = biggest_array_file(12)
  os.truncate(truncated, os.path.getsize(truncated) // 2)
  os.remove(biggest_array_file(9))
  with open(os.path.join(ckpts, '6', 'state', '_METADATA'), 'w', encoding='utf-8') as f:
    f.write('{"tree_metadata": garbage')
  os.makedirs(os.path.join(ckpts, '15.orbax-checkpoint-tmp-1234', 'state'))
  # Rows logged after step 3 are rewritten by the resumed run.
  proc = train(cache_dir, small_corpus, workdir)
  assert 'Resuming from step 3' in proc.stdout
  warnings = [l for l in proc.stderr.splitlines() if l.startswith('warning: ')]
  assert any('half-written checkpoint' in w and '15.orbax-checkpoint-tmp' in w for w in warnings)
  for step in (12, 9, 6):
    assert any(f'checkpoint step {step} is unreadable' in w for w in warnings), step
  # The bad checkpoints are kept for the user, out of the way of the new saves at 6, 9, 12.
  assert sorted(os.listdir(os.path.join(workdir, 'corrupt_checkpoints'))) == ['12', '6', '9']
  assert sorted(os.listdir(ckpts), key=int) == ['3', '6', '9', '12']
  assert_same_state(workdir, reference)
  assert_same_metrics(workdir, reference)


def test_nonfinite_steps_are_skipped_counted_never_saved_and_too_many_stop_the_run(
    tmp_path, cache_dir, small_corpus):
  workdir = str(tmp_path / 'w')
  command = train_command(small_corpus, workdir, '--config.log_every_steps=1',
                          '--config.max_consecutive_nonfinite=3')
  # The train command with steps 3, 5, 6, 7 and 8 made NaN (tests/nan_steps.py).
  command[1:3] = ['-m', 'tests.nan_steps', '3,5,6,7,8']
  proc = subprocess.run(command, cwd=REPO_ROOT, env=env_for(cache_dir), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 2
  error = proc.stderr.strip().splitlines()[-1]
  assert error.startswith('error: 3 consecutive steps (up to step 7) had a non-finite loss')
  assert 'config.max_consecutive_nonfinite=3' in error and 'Traceback' not in proc.stderr
  rows = {r['step']: r for r in read_jsonl(os.path.join(workdir, 'metrics.jsonl'))}
  assert [rows[s]['skipped_steps'] for s in range(1, 8)] == [0, 0, 1, 1, 2, 3, 4]
  assert [rows[s]['loss'] is None for s in range(1, 8)] == [False, False, True, False, True,
                                                           True, True]
  # TensorBoard gets the rows up to the stop too (its writer is closed on the way out).
  logged = {step for tag, step, _ in read_scalars(os.path.join(workdir, 'tensorboard'))
            if tag == 'train/skipped_steps'}
  assert logged == set(range(1, 8))
  # Saved at 3 (after a skipped step) and 6; every checkpoint is finite, with the skip count.
  steps = sorted(os.listdir(os.path.join(workdir, 'checkpoints')), key=int)
  assert steps == ['3', '6']
  for step in steps:
    state = saved_state(workdir, step)
    for leaf in jax.tree.leaves(state):
      assert np.all(np.isfinite(np.asarray(leaf, np.float64)))
  assert int(saved_state(workdir, 6)
             ['opt_state']['total_notfinite']) == 3


def test_the_nonfinite_stop_names_the_same_step_with_several_steps_a_call(
    tmp_path, cache_dir, small_corpus):
  """NaN at steps 3-5, then finite: at 4 steps a call (1-4, 5-8; the run of skips spans both)
  the stop names step 5, as at 1 step a call, not the call's last step (8)."""
  errors = []
  for steps_per_execution in (1, 4):
    command = train_command(small_corpus, str(tmp_path / str(steps_per_execution)),
                            '--config.log_every_steps=4', '--config.save_checkpoints_steps=12',
                            '--config.eval_every_steps=0', '--config.max_consecutive_nonfinite=3',
                            f'--config.steps_per_execution={steps_per_execution}')
    command[1:3] = ['-m', 'tests.nan_steps', '3,4,5']
    proc = subprocess.run(command, cwd=REPO_ROOT, env=env_for(cache_dir), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    errors.append(proc.stderr.strip().splitlines()[-1])
  assert errors[0].startswith('error: 3 consecutive steps (up to step 5) had a non-finite loss')
  assert errors[1] == errors[0]


# slow: the default run resumes a bucket workdir from 2 processes x 2 devices on 1 device
# (test_gcs.py) and restores an 8-device checkpoint on 1 and on 2 x 4 (test_scale.py).
@pytest.mark.slow
def test_a_run_resumes_on_other_device_counts_at_the_same_data_position(
    tmp_path, cache_dir, small_corpus, reference):
  """8 devices -> 4 -> 8 (issue 17, elastic resume): the checkpoint holds the global data
  position, so each resumed part reads on where the last stopped; losses equal the
  uninterrupted run's to float32 reduction order."""
  workdir = str(tmp_path / 'w')
  for devices, stop in ((8, 4), (4, 4), (8, None)):
    extra = [f'--cpu_devices={devices}'] + ([f'--stop_after_steps={stop}'] if stop else [])
    proc = train(cache_dir, small_corpus, workdir, *extra)
    assert f'{devices} device(s)' in proc.stdout
  rows = read_jsonl(os.path.join(workdir, 'metrics.jsonl'))
  want = read_jsonl(os.path.join(reference, 'metrics.jsonl'))
  assert [r['step'] for r in rows] == [r['step'] for r in want] == list(range(2, 13, 2))
  for row, ref in zip(rows, want):
    for key in ('loss', 'mlm_loss', 'disc_loss', 'mlm_accuracy', 'disc_accuracy'):
      assert row[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), (row['step'], key)


def test_a_skipped_step_leaves_params_and_optimizer_state_unchanged():
  c, objective, state, _, mesh = tiny_trainer(num_layers=1)
  tx, _ = optim.make_optimizer(c)
  step = ts.jit_train_step(ts.make_train_step(NaNAtSteps(objective, (2,)), tx), mesh)
  batch = parallel.global_batch(jax.device_get(toy_batch(c)), mesh)
  state, sums = step(state, batch, jax.random.key(0))
  assert int(sums['consecutive_nonfinite']) == 0 and float(sums['num_steps']) == 1
  before = jax.device_get((state.params, state.opt_state.inner_state))
  state, sums = step(state, batch, jax.random.key(0))
  assert int(sums['consecutive_nonfinite']) == 1 and float(sums['num_steps']) == 0
  assert all(np.isfinite(float(v)) for v in jax.device_get(sums).values())
  jax.tree.map(np.testing.assert_array_equal, before,
               jax.device_get((state.params, state.opt_state.inner_state)))
  assert int(state.step) == 2 and int(state.opt_state.total_notfinite) == 1


@pytest.mark.parametrize('objective', ['electra', 'two_stage'])
def test_after_skipped_steps_the_learning_rate_is_the_run_steps(objective):
  """A skipped step keeps the optimizer state, the schedule's count too: the rate must follow
  the run's step, or warmup and decay shift by every skip and the run ends above 0."""
  stages = (dict(two_stage_generator_steps=4, generator_hidden_size=1.0, tie='none')
            if objective == 'two_stage' else {})
  c = config_lib.resolve(tiny_config(objective=objective, num_train_steps=20,
                                     num_warmup_steps=0, learning_rate=1.0,
                                     weight_decay_rate=0.0, max_grad_norm=0.0, **stages))
  tx, schedule = optim.make_optimizer(c)
  params = {'discriminator': {'w': jnp.zeros(())}}
  state = tx.init(params)
  for step in range(20):
    grads = {'discriminator': {'w': jnp.float32(np.nan if step < 7 else 1.0)}}
    updates, state = tx.update(grads, state, params, step=jnp.int32(step))
    params = optax.apply_updates(params, updates)
  # The discriminator's moments (two_stage also keeps the generator group's, masked here).
  mu, nu = ([float(m['discriminator']['w']) for _, m in
             optax.tree_utils.tree_get_all_with_path(state, key)
             if isinstance(m['discriminator']['w'], jax.Array)][0] for key in ('mu', 'nu'))
  if c.adam_bias_correction:  # 13 finite steps moved the moments (the 7 skipped did not).
    mu, nu = mu / (1 - c.adam_b1 ** 13), nu / (1 - c.adam_b2 ** 13)
  direction = mu / (np.sqrt(nu) + c.adam_epsilon)
  assert float(schedule(19)) == pytest.approx(1 / 16 if objective == 'two_stage' else 1 / 20)
  assert float(updates['discriminator']['w']) == pytest.approx(-float(schedule(19)) * direction,
                                                               rel=1e-5)


def test_skip_if_nonfinite_matches_optax_apply_if_finite_step_for_step():
  """Same updates and state, bit for bit, through finite steps and an inf or a NaN in one
  element of one array (apply_if_finite told never to give up, as the loop stops first). In a
  whole compiled step XLA may fuse the two differently and move a last bit."""
  rng = np.random.default_rng(0)
  params = {'w': jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
            'b': jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
  inner = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.01))
  ours, ref = optim.skip_if_nonfinite(inner), optax.apply_if_finite(inner, 2**31 - 1)
  ours_state, ref_state = ours.init(params), ref.init(params)
  jax.tree.map(np.testing.assert_array_equal, ours_state, ref_state)
  for bad in (None, ('w', np.inf), ('b', np.nan), ('w', -np.inf), None, None):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    if bad:
      grads[bad[0]] = grads[bad[0]].at[(0,) * grads[bad[0]].ndim].set(bad[1])
    ours_updates, ours_state = jax.jit(ours.update)(grads, ours_state, params)
    ref_updates, ref_state = jax.jit(ref.update)(grads, ref_state, params)
    jax.tree.map(np.testing.assert_array_equal, (ours_updates, ours_state),
                 (ref_updates, ref_state))
    params = optax.apply_updates(params, ours_updates)
  assert int(ours_state.total_notfinite) == 3 and int(ours_state.notfinite_count) == 0


def test_the_train_step_checks_finiteness_on_the_global_norm_not_once_per_array():
  """The skip reads the gradients' global norm; a per-array isfinite (one more reduction of
  each gradient, optax.apply_if_finite's) would show in the compiled program."""
  c, objective, state, step, mesh = tiny_trainer(num_layers=1)
  batch = parallel.global_batch(jax.device_get(toy_batch(c)), mesh)
  program = step.lower(state, batch, jax.random.key(0)).compile().as_text()
  array_isfinite = re.findall(r'= pred\[\d[^\]]*\][^=]* is-finite\(', program)
  assert len(jax.tree.leaves(state.params)) > 40 > 10 > len(array_isfinite)


# --- Bad input: one line naming the value and the fix, exit 2, nothing overwritten ----------

# Runs several command lines in forked children of one process that has imported the CLI
# already (saves a second of imports per case); prints one JSON result per case.
DRIVER = r'''
import json, os, sys
from electra_jax import train
results = []
for case in json.loads(sys.argv[1]):
  out, err = case['out'], case['err']
  pid = os.fork()
  if pid == 0:
    for fd, path in ((1, out), (2, err)):
      os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = ['train'] + case['argv']
    code = 0
    try:
      train.run()
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else 1
    except BaseException:
      import traceback; traceback.print_exc(); code = 99
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)
  _, status = os.waitpid(pid, 0)
  results.append(os.waitstatus_to_exitcode(status))
print(json.dumps(results))
'''


def _bad_input_cases(tmp, corpus, reference):
  """(name, argv, expected text of the error line, workdir whose files must stay unchanged)."""
  files = {'empty.txt': b'\n  \n', 'binary.txt': b'hello\nwo\x00rld\n',
           'latin1.txt': b'hello\nna\xefve caf\xe9\n', 'not_spm.model': b'[PAD]\n[UNK]\n'}
  for name, data in files.items():
    with open(os.path.join(tmp, name), 'wb') as f:
      f.write(data)
  a_file = os.path.join(tmp, 'empty.txt')
  typo = os.path.join(tmp, 'typo.py')  # A key misspelt in a config file, not on the line.
  with open(typo, 'w', encoding='utf-8') as f:
    f.write('from configs import demo\n\n\ndef get_config():\n  c = demo.get_config()\n'
            '  c.learning_rat = 1e-5\n  return c\n')
  changed = os.path.join(tmp, 'changed')
  shutil.copytree(reference, changed)
  base = ['--config=configs/demo.py', *TINY_FLAGS, f'--config.train_files={corpus}']
  t = lambda name: f'--config.train_files={os.path.join(tmp, name)}'
  return [
      ('corpus_missing', [t('missing.txt')], f"no files match '{tmp}/missing.txt'"),
      ('glob_matches_nothing', [t('nothing/*.txt')], 'no files match'),
      ('corpus_empty', [t('empty.txt')], f"'{tmp}/empty.txt' is empty"),
      ('corpus_binary', [t('binary.txt')], 'looks binary (NUL byte at byte offset 8)'),
      ('corpus_not_utf8', [t('latin1.txt')], 'is not UTF-8 (invalid byte at byte offset 8)'),
      ('vocab_missing', ['--config.vocab_file=/nowhere/spm.model'],
       "vocab_file '/nowhere/spm.model' not found"),
      ('vocab_not_sentencepiece', [f'--config.vocab_file={tmp}/not_spm.model'],
       'is not a sentencepiece model'),
      ('vocab_size_mismatch', ['--config.vocab_size=100'],
       'config.vocab_size=100 but vocab_file'),
      ('unknown_key', ['--config.hiden_size=3'],
       'unknown config key --config.hiden_size (did you mean --config.hidden_size?)'),
      ('wrong_type', ['--config.learning_rate=abc'],
       "--config.learning_rate=abc: could not convert string to float: 'abc'"),
      ('seq_above_positions', ['--config.max_seq_length=1024'],
       'config.max_seq_length=1024 exceeds config.max_position_embeddings=512'),
      ('batch_not_divisible', ['--config.train_batch_size=7'],
       'config.train_batch_size=7 is not divisible by the 2 devices'),
      ('workdir_is_a_file', [f'--workdir={a_file}'], f"--workdir '{a_file}' is a file"),
      ('config_file_missing', ['--config=configs/nope.py'],
       "cannot load config file 'configs/nope.py'"),
      ('config_without_get_config', ['--config=electra_jax/errors.py'],
       "config file 'electra_jax/errors.py' has no get_config()"),
      ('config_file_unknown_key', [f'--config={typo}'],
       f"config file '{typo}' sets unknown key 'learning_rat' (did you mean 'learning_rate'?)"),
      ('config_changed_on_resume', [f'--workdir={changed}', '--config.learning_rate=0.002'],
       'learning_rate: 0.001 -> 0.002'),
  ], base, changed


@pytest.fixture(scope='module')
def bad_inputs(tmp_path_factory, cache_dir, small_corpus, reference):
  tmp = str(tmp_path_factory.mktemp('bad_inputs'))
  cases, base, changed = _bad_input_cases(tmp, small_corpus, reference)
  runs, snapshots = [], {}
  for name, argv, _ in cases:
    workdir = next((a.split('=', 1)[1] for a in argv if a.startswith('--workdir=')), None)
    if workdir is None:  # A workdir holding a previous run's files that must stay as they are.
      workdir = os.path.join(tmp, f'work_{name}')
      os.makedirs(workdir)
      for f in ('config.json', 'metrics.jsonl'):  # config.json: a pretraining run's (a size).
        with open(os.path.join(workdir, f), 'w', encoding='utf-8') as fh:
          fh.write(f'{{"model_size": "demo", "previous": "{name}"}}\n')
      argv = argv + [f'--workdir={workdir}']
    if os.path.isdir(workdir):
      snapshots[name] = {f: open(os.path.join(workdir, f), 'rb').read()
                         for f in ('config.json', 'metrics.jsonl')}
    if any(a.startswith('--config=') for a in argv):  # Its own config file, before overrides.
      full_argv = argv + [a for a in base if not a.startswith('--config=')]
    else:
      full_argv = base + argv
    runs.append(dict(argv=full_argv, out=os.path.join(tmp, f'{name}.out'),
                     err=os.path.join(tmp, f'{name}.err'), workdir=workdir))
  # --verbose: the same mistake with its traceback.
  runs.append(dict(argv=base + ['--config.max_seq_length=1024', '--verbose',
                                f'--workdir={tmp}/verbose'],
                   out=os.path.join(tmp, 'verbose.out'), err=os.path.join(tmp, 'verbose.err')))
  env = env_for(cache_dir, XLA_FLAGS=xla_flags_with('--xla_force_host_platform_device_count=2'))
  proc = subprocess.run([sys.executable, '-c', DRIVER, json.dumps(runs)], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr
  codes = json.loads(proc.stdout.strip().splitlines()[-1])
  read = lambda p: open(p, encoding='utf-8', errors='replace').read()
  results = {}
  for (name, _, expected), run, code in zip(cases + [('verbose', None, None)], runs, codes):
    results[name] = dict(code=code, stderr=read(run['err']), expected=expected,
                         workdir=run.get('workdir'), before=snapshots.get(name))
  return results


BAD_INPUTS = ['corpus_missing', 'glob_matches_nothing', 'corpus_empty', 'corpus_binary',
              'corpus_not_utf8', 'vocab_missing', 'vocab_not_sentencepiece',
              'vocab_size_mismatch', 'unknown_key', 'wrong_type', 'seq_above_positions',
              'batch_not_divisible', 'workdir_is_a_file', 'config_file_missing',
              'config_without_get_config', 'config_changed_on_resume']


@pytest.mark.parametrize('name', BAD_INPUTS)
def test_bad_input_is_one_error_line_naming_the_value_and_nothing_is_overwritten(
    name, bad_inputs):
  r = bad_inputs[name]
  assert r['code'] == 2, r['stderr']
  assert 'Traceback' not in r['stderr']
  lines = [l for l in r['stderr'].splitlines() if l.strip()]
  assert lines[-1].startswith('error: ') and r['expected'] in lines[-1], lines[-1]
  assert sum(l.startswith('error: ') for l in lines) == 1
  if r['before'] is not None:
    for f, content in r['before'].items():
      with open(os.path.join(r['workdir'], f), 'rb') as fh:
        assert fh.read() == content, f
    assert not os.path.exists(os.path.join(r['workdir'], 'checkpoints')) or name.startswith(
        'config_changed')


def test_config_change_error_names_the_flag_that_allows_it(bad_inputs):
  line = bad_inputs['config_changed_on_resume']['stderr'].strip().splitlines()[-1]
  assert '--config.allow_config_change=learning_rate' in line


def test_verbose_shows_the_traceback(bad_inputs):
  r = bad_inputs['verbose']
  assert r['code'] != 0 and 'Traceback' in r['stderr'] and 'max_seq_length=1024' in r['stderr']


# --- Units: pieces that need no training -----------------------------------------------------

def test_resume_accepts_harmless_and_allowed_changes_and_refuses_others(tmp_path):
  workdir = str(tmp_path)
  saved_config.write(workdir, config_lib.resolve(tiny_config()))
  changed = lambda **kw: experiment.check_resume_config(workdir, config_lib.resolve(
      tiny_config(**kw)))
  # No checkpoint yet: nothing to resume, any change is fine.
  assert changed(learning_rate=0.1) == []
  os.makedirs(os.path.join(workdir, 'checkpoints', '3'))
  assert changed(log_every_steps=7, save_checkpoints_steps=9, num_data_workers=2) == [
      'log_every_steps', 'num_data_workers', 'save_checkpoints_steps']
  with pytest.raises(UserError) as e:
    changed(learning_rate=0.1, num_train_steps=200)
  assert 'learning_rate: 0.001 -> 0.1' in str(e.value) and 'num_train_steps: 100 -> 200' in str(
      e.value)
  assert '--config.allow_config_change=learning_rate,num_train_steps' in str(e.value)
  assert changed(learning_rate=0.1, allow_config_change='learning_rate') == [
      'allow_config_change', 'learning_rate']
  with pytest.raises(UserError, match='hidden_size: 32 -> 64'):  # shapes: never
    changed(hidden_size=64, allow_config_change='hidden_size')
  with pytest.raises(UserError, match='names unknown keys'):
    changed(allow_config_change='learning_rat')


@pytest.mark.parametrize('key, saved_value, kept, refused, message', [
    ('max_grad_norm', 1.0, 0.5, 0.0, 'max_grad_norm 1.0 -> 0.0 removes a step of the '
     'optimizer, so its saved state cannot be restored; resume with max_grad_norm > 0, or use a '
     'new --workdir'),
    ('max_grad_norm', 0.0, 0.0, 1.0, 'max_grad_norm 0.0 -> 1.0 adds a step of the optimizer, '
     'so its saved state cannot be restored; resume with max_grad_norm 0, or'),
    ('generator_lr_multiplier', 2.0, 0.5, 1.0, 'generator_lr_multiplier 2.0 -> 1.0 removes a '
     'step of the optimizer, so its saved state cannot be restored; resume with '
     'generator_lr_multiplier != 1.0, or'),
    ('uniform_generator', False, False, True, 'holds a model with different shapes '
     '(uniform_generator: False -> True)')])
def test_resume_refuses_allowed_changes_that_change_the_saved_states_layout(
    tmp_path, key, saved_value, kept, refused, message):
  """Such a change would be accepted, and then no checkpoint could be restored; other values
  of the key (the same layout) resume."""
  workdir = str(tmp_path)
  run = lambda value, **kw: config_lib.resolve(tiny_config(**{key: value}, **kw))
  saved_config.write(workdir, run(saved_value))
  os.makedirs(os.path.join(workdir, 'checkpoints', '3'))
  layout = lambda c: jax.tree.structure(
      experiment.Experiment.create(c, read_vocab=False).abstract_state())
  assert layout(run(refused)) != layout(run(saved_value))
  with pytest.raises(UserError, match=re.escape(message)):
    experiment.check_resume_config(workdir, run(refused, allow_config_change=key))
  if kept != saved_value:
    assert layout(run(kept)) == layout(run(saved_value))
    assert experiment.check_resume_config(workdir, run(kept, allow_config_change=key)) == [
        'allow_config_change', key]


def test_disk_check_refuses_a_workdir_without_room_for_two_checkpoints(tmp_path, monkeypatch):
  state = {'w': jax.ShapeDtypeStruct((1024, 1024), np.float32)}  # 4 MiB
  assert checkpoint.size_bytes(state) == 4 * 2**20
  checkpoint.check_disk(str(tmp_path / 'ok'), state)
  monkeypatch.setattr(shutil, 'disk_usage', lambda _: types.SimpleNamespace(free=5 * 2**20))
  with pytest.raises(UserError, match='only 5 MiB free .* 2 checkpoints need about 8 MiB'):
    checkpoint.check_disk(str(tmp_path / 'full'), state)


def test_metrics_after_the_resume_step_and_a_torn_last_line_are_dropped(tmp_path):
  path = str(tmp_path / 'metrics.jsonl')
  rows = ''.join(json.dumps({'step': s, 'loss': 1.0}) + '\n' for s in (2, 4, 6))
  with open(path, 'w', encoding='utf-8') as f:
    f.write(rows + '{"step": 8, "lo')
  metric_writer.truncate_after(path, 4)
  assert [r['step'] for r in read_jsonl(path)] == [2, 4]
  metric_writer.truncate_after(path, 6)
  assert [r['step'] for r in read_jsonl(path)] == [2, 4]
