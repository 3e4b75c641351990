"""Runs on a bucket (issue 17): every command against a real GCS server (gcp-storage-emulator on
127.0.0.1, through STORAGE_EMULATOR_HOST / TENSORSTORE_GCS_HTTP_URL), end to end in
subprocesses, compared with the same run on local disk (tests/test_resilience.py's reference).

Items: a demo run on gs:// with corpus, vocabulary and compilation cache on the bucket, killed
and resumed bit-identically (2, 4, 6); two processes x two devices sharing a gs:// workdir,
resumed by one process (4, 5); evaluate, export and fine-tune from the bucket (2, 4); storage
faults as one-line errors, a transient outage retried, a save killed halfway never taken for a
checkpoint (7).
"""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import portpicker
import pytest

from electra_jax import checkpoint
from tests import gcs_emulator
from tests.conftest import REPO_ROOT
# small_corpus, cache_dir and reference are fixtures used here by name.
from tests.test_resilience import (  # pylint: disable=unused-import
    FLAGS, NUM_STEPS, TIMING_KEYS, assert_same_state, cache_dir, env_for, reference)
from tests.test_train_cli import last_json, small_corpus  # pylint: disable=unused-import

BUCKET = f'gs://{gcs_emulator.BUCKET}'
# Losses of runs on other device or process counts agree to float32 reduction order.
RTOL = 1e-5
LOSS_KEYS = ('loss', 'mlm_loss', 'disc_loss', 'mlm_accuracy', 'sampled_accuracy',
             'disc_accuracy', 'replaced_fraction')


@pytest.fixture(scope='module')
def gcs():
  """The emulator, this process pointed at it (for reading results), and the fault proxy."""
  emulator = gcs_emulator.Emulator()
  proxy = gcs_emulator.FaultProxy(emulator.port)
  saved = {k: os.environ.get(k) for k in gcs_emulator.env_for('')}
  os.environ.update(gcs_emulator.env_for(emulator.url))
  yield emulator, proxy
  proxy.stop()
  emulator.stop()
  for key, value in saved.items():
    if value is None:
      os.environ.pop(key, None)
    else:
      os.environ[key] = value


@pytest.fixture(scope='module')
def bucket_data(gcs, small_corpus):
  """The corpus, eval text, vocabulary and fine-tuning files copied into the bucket."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  del gcs
  local = os.path.dirname(small_corpus)
  for name in sorted(os.listdir(local)):
    epath.Path(f'{BUCKET}/corpus/{name}').write_bytes(
        open(os.path.join(local, name), 'rb').read())  # pylint: disable=consider-using-with
  copies = {'eval/persuasion.txt': 'data/demo_corpus/eval/persuasion.txt',
            'vocab/spm.model': 'data/demo_spm.model',
            'austen/train.tsv': 'data/austen_novels/train.tsv',
            'austen/eval.tsv': 'data/austen_novels/eval.tsv'}
  for target, source in copies.items():
    with open(os.path.join(REPO_ROOT, source), 'rb') as f:
      epath.Path(f'{BUCKET}/{target}').write_bytes(f.read())
  return dict(train_files=f'{BUCKET}/corpus/*.txt', eval_files=f'{BUCKET}/eval/*.txt',
              vocab_file=f'{BUCKET}/vocab/spm.model')


def bucket_env(cache_dir, url, **extra):
  return env_for(cache_dir, **gcs_emulator.env_for(url), **extra)


def gcs_train_command(data, workdir, *extra):
  return [sys.executable, '-m', 'electra_jax.train', *FLAGS, f'--workdir={workdir}',
          f"--config.train_files={data['train_files']}",
          f"--config.eval_files={data['eval_files']}",
          f"--config.vocab_file={data['vocab_file']}", *extra]


def run(command, env, check=True, timeout=600):
  proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f'failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}')
  return proc


def read_jsonl(path):
  from etils import epath  # pylint: disable=import-outside-toplevel
  return [json.loads(line) for line in epath.Path(path).read_text().splitlines()]


def without_timings(rows):
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def assert_close_losses(rows, reference_rows):
  assert [r['step'] for r in rows] == [r['step'] for r in reference_rows]
  for row, want in zip(rows, reference_rows):
    for key in LOSS_KEYS:
      assert row[key] == pytest.approx(want[key], rel=RTOL, abs=1e-7), (row['step'], key)


def kill_after(command, env, line_start, delay=0.0):
  """Starts `command`, SIGKILLs it `delay` seconds after a stdout line starts with
  `line_start`; returns its stdout."""
  proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if line.startswith(line_start):
      time.sleep(delay)
      proc.send_signal(signal.SIGKILL)
      break
  lines.extend(proc.stdout)
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, ''.join(lines)
  return ''.join(lines)


def test_demo_on_a_bucket_killed_and_resumed_equals_the_local_run(gcs, bucket_data, cache_dir,
                                                                  reference):
  """Workdir, corpus, eval text, vocabulary and compilation cache all on gs://; SIGKILL after
  step 8 (step 6's save waited for step 3's: 3 is complete, 6 may be); the re-run resumes
  bit-identically."""
  emulator, _ = gcs
  workdir, jax_cache = f'{BUCKET}/demo', f'{BUCKET}/jax_cache'
  command = gcs_train_command(bucket_data, workdir, f'--compilation_cache_dir={jax_cache}')
  # JAX's default threshold: Orbax's many tiny slicing programs stay out of the bucket.
  env = bucket_env(cache_dir, emulator.url, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='1')
  kill_after(command, env, 'train step       8')
  latest = checkpoint.latest_step(workdir)
  assert latest in (3, 6)
  resumed = run(command, env)
  assert f'Resuming from step {latest}' in resumed.stdout
  result = last_json(resumed.stdout)
  assert result['status'] == 'completed' and result['workdir'] == workdir
  assert result['checkpoint'] == f'{workdir}/checkpoints/{NUM_STEPS}'
  assert_same_state(workdir, reference)
  for name in ('metrics.jsonl', 'eval_metrics.jsonl'):  # Rows after the resume logged once.
    assert without_timings(read_jsonl(f'{workdir}/{name}')) == without_timings(
        read_jsonl(os.path.join(reference, name)))
  from etils import epath  # pylint: disable=import-outside-toplevel
  saved = json.loads(epath.Path(f'{workdir}/config.json').read_text())
  assert saved['train_files'] == bucket_data['train_files']
  assert list(epath.Path(f'{workdir}/tensorboard').glob('events.out.tfevents.*'))
  assert all((epath.Path(f'{workdir}/checkpoints/{s}') / checkpoint.COMMIT_FILE).exists()
             for s in checkpoint.steps(workdir))
  assert list(epath.Path(jax_cache).iterdir())  # The compiled steps are in the bucket.


def test_evaluate_export_and_finetune_read_and_write_the_bucket(gcs, bucket_data, cache_dir,
                                                                tmp_path):
  emulator, _ = gcs
  env = bucket_env(cache_dir, emulator.url)
  workdir = f'{BUCKET}/short'
  run(gcs_train_command(bucket_data, workdir, '--config.num_train_steps=3',
                        '--config.eval_every_steps=0'), env)
  evaluated = last_json(run([sys.executable, '-m', 'electra_jax.evaluate',
                             f'--workdir={workdir}', '--num_batches=1'], env).stdout)
  assert evaluated['step'] == 3 and evaluated['eval_files'] == bucket_data['eval_files']
  assert evaluated['mlm_accuracy'] >= 0
  exported = last_json(run([sys.executable, '-m', 'electra_jax.export', f'--workdir={workdir}',
                            f'--output={BUCKET}/hf', '--what=both'], env).stdout)
  assert exported['output'] == f'{BUCKET}/hf' and exported['step'] == 3
  from etils import epath  # pylint: disable=import-outside-toplevel
  hf = epath.Path(f'{BUCKET}/hf')
  assert {'config.json', 'model.safetensors', 'tokenizer.json', 'spm.model'} <= {
      p.name for p in hf.iterdir()}
  assert (hf / 'generator' / 'model.safetensors').exists()
  assert not [p for p in epath.Path(BUCKET).iterdir() if '.tmp-' in p.name]
  # The export reads back as this run's parameters: fine-tune from it and from the workdir.
  ft_flags = ['--config=configs/finetune/files.py', '--config.max_seq_length=32',
              '--config.num_epochs=1', '--config.max_train_examples=64',
              '--config.max_eval_examples=32', '--config.progress_bar=false',
              f'--config.train_file={BUCKET}/austen/train.tsv',
              f'--config.eval_file={BUCKET}/austen/eval.tsv']
  for source in (workdir, f'{BUCKET}/hf'):
    out = f'{BUCKET}/ft_{len(source)}'
    result = last_json(run([sys.executable, '-m', 'electra_jax.finetune', *ft_flags,
                            f'--config.init_checkpoint={source}', f'--workdir={out}'],
                           env).stdout)
    assert result['workdir'] == out and result['init_checkpoint'] == source
    results = json.loads(epath.Path(f'{out}/results.json').read_text())
    best = results['runs'][0]['checkpoint']
    assert best.startswith(f'{out}/seed_0/best/') and epath.Path(best).exists()
    assert len(read_jsonl(f'{out}/seed_0/metrics.jsonl')) == 1
  first, second = (json.loads(epath.Path(f'{BUCKET}/ft_{len(s)}/results.json').read_text())
                   for s in (workdir, f'{BUCKET}/hf'))
  # Same encoder weights either way (export is exact to float32 rounding).
  assert first['runs'][0]['final']['eval_loss'] == pytest.approx(
      second['runs'][0]['final']['eval_loss'], rel=1e-4)


def test_two_processes_share_a_bucket_workdir_and_one_process_resumes_it(gcs, bucket_data,
                                                                        cache_dir, reference):
  """A multi-host commit on gs:// (2 processes x 2 CPU devices), then the run continues on one
  process with another device count at the same data position: losses equal the local run's."""
  emulator, _ = gcs
  workdir = f'{BUCKET}/pod'
  env = bucket_env(cache_dir, emulator.url)
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen(
      gcs_train_command(bucket_data, workdir, '--stop_after_steps=6', '--cpu_devices=2',
                        f'--coordinator_address=localhost:{port}', '--num_processes=2',
                        f'--process_id={i}'),
      cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  outputs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outputs):
    assert p.returncode == 0, f'{out}\n{err[-4000:]}'
  assert last_json(outputs[0][0])['step'] == 6
  assert checkpoint.steps(workdir) == [3, 6]
  resumed = run(gcs_train_command(bucket_data, workdir, '--cpu_devices=1'), env)
  assert 'Resuming from step 6' in resumed.stdout
  rows = read_jsonl(f'{workdir}/metrics.jsonl')
  assert_close_losses(rows, read_jsonl(os.path.join(reference, 'metrics.jsonl')))


@pytest.mark.parametrize('fault', ['unreachable', 'credentials', 'permission', 'bucket',
                                   'glob'])
def test_storage_faults_are_one_line_errors_and_write_nothing(gcs, bucket_data, cache_dir,
                                                              fault):
  emulator, proxy = gcs
  url = proxy.url if fault == 'permission' else emulator.url
  env = bucket_env(cache_dir, url)
  workdir, data = f'{BUCKET}/fault_{fault}', dict(bucket_data)
  expected = {
      'unreachable': 'cannot reach http://127.0.0.1:',
      'credentials': 'no Google Cloud credentials for gs:// paths',
      'permission': f"permission denied for --workdir '{workdir}'",
      'bucket': "bucket gs://no-such-bucket of --workdir 'gs://no-such-bucket/run' does not "
                'exist',
      'glob': f"no files match '{BUCKET}/nothing/*.txt'",
  }[fault]
  if fault == 'unreachable':
    env.update(gcs_emulator.env_for(f'http://127.0.0.1:{portpicker.pick_unused_port()}'))
  elif fault == 'credentials':
    for key in gcs_emulator.env_for(''):
      env.pop(key)
    env['GOOGLE_APPLICATION_CREDENTIALS'] = '/nonexistent/key.json'
  elif fault == 'bucket':
    workdir = 'gs://no-such-bucket/run'
  elif fault == 'glob':
    data['train_files'] = f'{BUCKET}/nothing/*.txt'
  proxy.deny = fault == 'permission'
  try:
    proc = run(gcs_train_command(data, workdir), env, check=False, timeout=300)
  finally:
    proxy.deny = False
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith('error: ') and expected in lines[-1], proc.stderr[-3000:]
  assert not any(line.startswith('Traceback') for line in lines)
  assert checkpoint.steps(f'{BUCKET}/fault_{fault}') == []
  from etils import epath  # pylint: disable=import-outside-toplevel
  assert not list(epath.Path(f'{BUCKET}/fault_{fault}').glob('*'))


def test_a_save_killed_halfway_is_ignored_and_an_outage_while_saving_is_retried(
    gcs, bucket_data, cache_dir, reference):
  """Step 6's save is written but its commit file meets 503s, and the trainer is killed: the
  step directory lacks commit_success.txt, so the latest step stays 3. The re-run ignores it
  and survives a 3-second outage while saving step 9; the finished run equals the
  uninterrupted local one."""
  _, proxy = gcs
  workdir = f'{BUCKET}/outage'
  env = bucket_env(cache_dir, proxy.url)
  proxy.outage_after = 'outage/checkpoints/6/' + checkpoint.COMMIT_FILE
  proxy.outage_seconds, proxy.outage_started, proxy.failed_requests = 1e9, None, 0
  proc = subprocess.Popen(gcs_train_command(bucket_data, workdir), cwd=REPO_ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while proxy.failed_requests < 2 and time.time() < deadline and proc.poll() is None:
    time.sleep(0.2)
  proc.kill()
  proc.wait()
  proxy.outage_after, proxy.outage_seconds, proxy.outage_started = 'outage/checkpoints/9/', 3.0, None
  assert proxy.failed_requests >= 2
  from etils import epath  # pylint: disable=import-outside-toplevel
  step_6 = epath.Path(f'{workdir}/checkpoints/6')
  assert (step_6 / 'state').exists() and not (step_6 / checkpoint.COMMIT_FILE).exists()
  assert checkpoint.latest_step(workdir) == 3
  proxy.failed_requests = 0
  resumed = run(gcs_train_command(bucket_data, workdir), env)
  assert 'Resuming from step 3' in resumed.stdout
  assert f'ignoring half-written checkpoint {step_6}' in resumed.stderr
  assert proxy.failed_requests > 0  # The outage happened during this run's save of step 9.
  assert checkpoint.steps(workdir) == [3, 6, 9, 12]
  assert_same_state(workdir, reference)


def test_compare_keeps_its_points_results_and_plots_on_the_bucket(gcs):
  """experiments.compare's own files on gs:// (its train/finetune commands are the ones tested
  above): a budget point copied out of a run's checkpoints, the results, the table, the plots,
  and the command logs (appended to as the commands print)."""
  del gcs
  from electra_jax import atomic, saved_config  # pylint: disable=import-outside-toplevel
  from electra_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from electra_jax.experiments import report, runs  # pylint: disable=import-outside-toplevel
  from etils import epath  # pylint: disable=import-outside-toplevel
  from tests.conftest import tiny_config  # pylint: disable=import-outside-toplevel
  output = f'{BUCKET}/compare'
  workdir = f'{output}/pretrain/tiny'
  saved_config.write(workdir, config_lib.resolve(tiny_config()))
  ckpt = checkpoint.Checkpointer(checkpoint.directory_of(workdir))
  ckpt.save(4, {'w': jax.numpy.arange(6.0)}, force=True)
  ckpt.close()
  atomic.write_text(f'{workdir}/metrics.jsonl',
                    ''.join(json.dumps(dict(step=s, loss=10.0 - s)) + '\n' for s in (2, 4, 6)))
  point = runs._make_point(workdir, f'{output}/points/tiny/4', 4, 8e9)  # pylint: disable=protected-access
  assert point['train'] == dict(step=4, loss=6.0)
  assert checkpoint.steps(f'{output}/points/tiny/4') == [4]
  copied = checkpoint.Checkpointer(f'{output}/points/tiny/4/checkpoints', read_only=True)
  np.testing.assert_array_equal(copied.read_state(4)['w'], np.arange(6.0))
  copied.close()
  results = dict(flops_budget=1e10, finetune_task='files', main_metric='accuracy', num_seeds=2,
                 configs=[dict(name='tiny', objective='electra', flops_per_step=2e9,
                               num_warmup_steps=0, config_warmup_steps=10, points=[dict(
                                   step=4, flops=8e9,
                                   finetune=dict(median=0.5, seeds=[0.4, 0.6]))])])
  written = report.write_all(results, output)
  assert json.loads(epath.Path(written['results_json']).read_text()) == results
  assert '| tiny | electra |' in epath.Path(written['results_md']).read_text()
  for plot in ('downstream_plot', 'curves_plot'):
    assert epath.Path(written[plot]).read_bytes()[:4] == b'\x89PNG'
  log = f'{output}/logs/echo.log'
  appended = atomic.AppendFile(log, interval=0)
  appended.write('first\n')
  appended.write('second\n')
  appended.close()
  assert epath.Path(log).read_text() == 'first\nsecond\n'
  again = atomic.AppendFile(log, interval=3600)
  again.write('third\n')
  assert epath.Path(log).read_text() == 'first\nsecond\n'  # Not yet uploaded ...
  again.close()
  assert epath.Path(log).read_text() == 'first\nsecond\nthird\n'  # ... until closed.
