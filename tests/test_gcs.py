"""Runs on a bucket (issue 17): every command against a real GCS server (fake-gcs-server on
127.0.0.1, tests/gcs_emulator.py, through STORAGE_EMULATOR_HOST / TENSORSTORE_GCS_HTTP_URL),
end to end in subprocesses, compared with the same run on local disk (tests/test_resilience.py's
reference).

Items: a demo run on gs:// with corpus, vocabulary and compilation cache on the bucket, killed
and resumed bit-identically (2, 4, 6); two processes x two devices sharing a gs:// workdir,
moved to one process and back (4, 5); evaluate, export and fine-tune from the bucket (2, 4);
shards prepared into the bucket, an unreadable step moved aside there, compare's files (1, 2);
a compilation cache on the bucket read by a restarted process (6); storage faults as one-line
errors, a transient outage retried, a save killed halfway never taken for a checkpoint (7).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import portpicker
import pytest

from electra_jax import checkpoint
from electra_jax.data import sources
from electra_jax.errors import UserError
from tests import gcs_emulator
from tests.conftest import REPO_ROOT
# small_corpus, cache_dir and reference are fixtures used here by name.
from tests.test_resilience import (  # pylint: disable=unused-import
    FLAGS, NUM_STEPS, TIMING_KEYS, assert_same_state, cache_dir, env_for, reference)
from tests.test_data import PERSUASION, write_records
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
  # The paper's absolute positions, so that the run exports to transformers.
  run(gcs_train_command(bucket_data, workdir, '--config.num_train_steps=3',
                        '--config.eval_every_steps=0', '--config.relative_attention_span=0'),
      env)
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
  # Predictions from a run in the bucket (its network/ copied the export's spm.model there).
  out = f'{BUCKET}/ft_{len(BUCKET) + 3}'
  assert epath.Path(f'{out}/network/spm.model').exists()
  predicted = last_json(run([sys.executable, '-m', 'electra_jax.predict', f'--workdir={out}',
                             f'--input={BUCKET}/austen/eval.tsv', '--max_examples=32',
                             f'--output={BUCKET}/predictions'], env).stdout)
  assert predicted['parts'][0]['metrics']['accuracy'] == pytest.approx(
      second['runs'][0]['best']['eval_accuracy'])
  assert len(epath.Path(f'{BUCKET}/predictions/eval.tsv').read_text().splitlines()) == 33
  # The fine-tuned classifier, from the bucket to the bucket, as transformers loads it.
  classifier = last_json(run([sys.executable, '-m', 'electra_jax.export', f'--workdir={out}',
                              f'--output={BUCKET}/hf_classifier'], env).stdout)
  assert classifier['what'] == 'ElectraForSequenceClassification'
  local = tmp_path / 'hf_classifier'
  local.mkdir()
  for path in epath.Path(f'{BUCKET}/hf_classifier').iterdir():
    (local / path.name).write_bytes(path.read_bytes())
  import transformers  # pylint: disable=import-outside-toplevel
  model = transformers.ElectraForSequenceClassification.from_pretrained(str(local))
  assert model.config.id2label == dict(enumerate(results['label_names']))


def run_two_processes(data, workdir, env, *extra):
  """The train command as 2 processes x 2 CPU devices on one host (a pod's workers); returns
  process 0's stdout."""
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen(
      gcs_train_command(data, workdir, '--cpu_devices=2',
                        f'--coordinator_address=localhost:{port}', '--num_processes=2',
                        f'--process_id={i}', *extra),
      cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for i in range(2)]
  outputs = [p.communicate(timeout=600) for p in procs]
  for p, (out, err) in zip(procs, outputs):
    assert p.returncode == 0, f'{out}\n{err[-4000:]}'
  return outputs[0][0]


@pytest.mark.parametrize('and_back', [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_bucket_workdir_moves_from_two_processes_to_one(gcs, bucket_data, cache_dir, reference,
                                                          and_back):
  """Multi-host commits on gs:// (2 processes x 2 CPU devices share the workdir), and elastic
  resume: steps 1-6 on 2 processes, then 7-12 on 1 process with 1 device; `and_back`: 1-4, 5-8
  on 1 process, 9-12 on 2 processes again. Each part reads on at the data position the last
  one reached: losses equal the uninterrupted local run's to float32 reduction order."""
  emulator, _ = gcs
  workdir = f'{BUCKET}/pod_{and_back}'
  env = bucket_env(cache_dir, emulator.url)
  no_eval = '--config.eval_every_steps=0'  # Train losses only: fewer compilations.
  part = 4 if and_back else 6
  first = run_two_processes(bucket_data, workdir, env, no_eval, f'--stop_after_steps={part}')
  assert last_json(first)['step'] == part and '| 4 device(s) cpu |' in first
  assert checkpoint.steps(workdir) == ([3, 4] if and_back else [3, 6])
  single = run(gcs_train_command(bucket_data, workdir, no_eval, '--cpu_devices=1',
                                 *(['--stop_after_steps=4'] if and_back else [])), env)
  assert f'Resuming from step {part}' in single.stdout
  assert '| 1 device(s) cpu |' in single.stdout
  if and_back:
    assert last_json(single.stdout)['step'] == 8
    again = run_two_processes(bucket_data, workdir, env, no_eval)
    assert 'Resuming from step 8' in again and last_json(again)['status'] == 'completed'
  assert checkpoint.steps(workdir) == ([6, 8, 9, 12] if and_back else [3, 6, 9, 12])
  rows = read_jsonl(f'{workdir}/metrics.jsonl')
  assert_close_losses(rows, read_jsonl(os.path.join(reference, 'metrics.jsonl')))


def test_shards_prepared_into_the_bucket_give_the_streamed_batches(gcs, bucket_data, tmp_path,
                                                                  monkeypatch):
  """prepare --output=gs://... uploads the shards; a gs:// train_data_dir is copied once into
  the local cache (ArrayRecord reads local files) and yields the batches streaming gives."""
  del gcs
  from electra_jax import paths  # pylint: disable=import-outside-toplevel
  from electra_jax.data import pipeline, prepare  # pylint: disable=import-outside-toplevel
  from electra_jax.data import tokenizer as tok  # pylint: disable=import-outside-toplevel
  from tests.conftest import tiny_config  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(paths, 'CACHE_DIR', str(tmp_path / 'cache'))
  config = tiny_config(vocab_file=bucket_data['vocab_file'], vocab_size=8000,
                       train_files=bucket_data['train_files'], seed=5)
  output = f'{BUCKET}/prepared'
  summary = prepare.prepare(config, output, examples_per_shard=100, progress=False)
  assert summary['num_shards'] >= 2
  assert not os.path.exists(paths.CACHE_DIR)  # Written locally only while uploading.
  from electra_jax.errors import UserError  # pylint: disable=import-outside-toplevel
  from tests.test_prepare import failing_after  # pylint: disable=import-outside-toplevel
  with monkeypatch.context() as patch, pytest.raises(UserError, match='the corpus broke'):
    failing_after(250, patch)  # Two full shards uploaded, then the corpus fails.
    prepare.prepare(config, f'{BUCKET}/broken', examples_per_shard=100, progress=False)
  assert paths.files_under(f'{BUCKET}/broken') == []  # The uploaded shards were removed.
  tokenizer = tok.load_tokenizer(config.vocab_file, 8000)
  streamed = pipeline.make_train_iterator(config, tokenizer, start=16)
  config.train_data_dir = output
  from_bucket = pipeline.make_train_iterator(config, tokenizer, start=16)
  for _ in range(3):
    want, got = next(streamed), next(from_bucket)
    for name in pipeline.FEATURES:
      np.testing.assert_array_equal(want[name], got[name])
  cached = [os.path.join(d, f) for d, _, fs in os.walk(paths.CACHE_DIR) for f in fs
            if not f.endswith('.versions.json')]
  assert len(cached) == summary['num_shards']  # The shards only, each copied once.


def test_a_remote_file_rewritten_in_place_is_copied_again(gcs, tmp_path, monkeypatch):
  """The local copy of a bucket folder (ArrayRecord shards, TFDS files) follows the objects:
  one re-prepared with the same size is fetched again; an unchanged one is not."""
  del gcs
  from electra_jax import paths  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(paths, 'CACHE_DIR', str(tmp_path / 'cache'))
  folder = f'{BUCKET}/rewritten'
  paths.get(f'{folder}/shard-0').write_bytes(b'AAAA')
  local = os.path.join(paths.local_copy(folder), 'shard-0')
  with open(local, 'rb') as f:
    assert f.read() == b'AAAA'
  first = os.stat(local).st_ino
  assert os.path.join(paths.local_copy(folder), 'shard-0') == local
  assert os.stat(local).st_ino == first  # Unchanged: not copied again.
  paths.get(f'{folder}/shard-0').write_bytes(b'BBBB')
  with open(os.path.join(paths.local_copy(folder), 'shard-0'), 'rb') as f:
    assert f.read() == b'BBBB'


def test_folder_markers_are_no_entries_and_odd_output_names_are_refused(gcs, tmp_path,
                                                                       monkeypatch):
  """The Cloud Console's folders (and tf.io.gfile.makedirs's) are 'dir/' objects: they listed
  as entries, an empty folder was no export target, and copying a folder holding one failed.
  An output holding '[' (a glob to Orbax and gcsfs) is refused before anything is written;
  GS:// is gs://."""
  import urllib.parse  # pylint: disable=import-outside-toplevel
  import urllib.request  # pylint: disable=import-outside-toplevel
  from electra_jax import paths  # pylint: disable=import-outside-toplevel
  emulator, _ = gcs

  def put(name, data=b''):  # As the Console writes a folder: a zero-byte object 'name/'.
    url = (f'{emulator.url}/upload/storage/v1/b/{gcs_emulator.BUCKET}/o?uploadType=media&name='
           + urllib.parse.quote(name, safe=''))
    urllib.request.urlopen(urllib.request.Request(url, data=data, method='POST')).close()

  for name in ('markers/ds/', 'markers/ds/sub/', 'markers/empty/'):
    put(name)
  put('markers/ds/sub/a.txt', b'A')
  put('markers/ds/b.txt', b'B')
  assert paths.files_under(f'{BUCKET}/markers/ds') == ['b.txt', 'sub/a.txt']
  assert paths.listdir(f'{BUCKET}/markers/ds') == ['b.txt', 'sub']
  assert paths.listdir(f'{BUCKET}/markers/empty') == []
  monkeypatch.setattr(paths, 'CACHE_DIR', str(tmp_path / 'cache'))
  local = paths.local_copy(f'{BUCKET}/markers/ds')
  with open(os.path.join(local, 'sub', 'a.txt'), 'rb') as f:
    assert f.read() == b'A'
  with pytest.raises(UserError, match=r"--workdir 'gs://.*/run\[1\]' holds '\['"):
    paths.check_writable_dir(f'{BUCKET}/run[1]', '--workdir')
  assert not [n for n in paths.listdir(BUCKET) if n.startswith('run[')]
  assert paths.absolute(f'GS://{gcs_emulator.BUCKET}/x/') == f'{BUCKET}/x'
  assert paths.listdir(f'GS://{gcs_emulator.BUCKET}/markers/ds') == ['b.txt', 'sub']
  upper = f'GS://{gcs_emulator.BUCKET}/markers/ds'
  assert paths.glob(f'{upper}/*.txt') == [f'{BUCKET}/markers/ds/b.txt']
  # fsspec's other name for the scheme, which epath does not know (a KeyError).
  assert paths.absolute(f'gcs://{gcs_emulator.BUCKET}/x/') == f'{BUCKET}/x'
  assert paths.listdir(f'gcs://{gcs_emulator.BUCKET}/markers/ds') == ['b.txt', 'sub']
  assert paths.glob(f'gcs://{gcs_emulator.BUCKET}/markers/ds/*.txt') == [
      f'{BUCKET}/markers/ds/b.txt']
  # Walks up from a path stop at the bucket (a model at its root is an init_checkpoint).
  assert paths.parent(paths.parent(f'{BUCKET}/x')) == BUCKET and paths.is_dir(BUCKET)


def test_record_corpora_on_the_bucket_read_as_local_files(gcs, tmp_path):
  """JSON Lines (gzip) and Parquet (read by ranges through the bucket's file object, several
  row groups) from gs:// give the documents of the local files."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  del gcs
  docs = list(sources.read_documents([PERSUASION]))
  for name in ('c.jsonl.gz', 'c.parquet'):
    write_records(tmp_path / name, docs, key='body')
    epath.Path(f'{BUCKET}/records/{name}').write_bytes((tmp_path / name).read_bytes())
  files = sources.list_files(f'{BUCKET}/records/*')
  assert files == [f'{BUCKET}/records/c.jsonl.gz', f'{BUCKET}/records/c.parquet']
  assert list(sources.read_documents(files, text_key='body')) == docs + docs


def test_a_tfds_dataset_prepared_on_the_bucket_reads_as_the_local_one(gcs, tmp_path,
                                                                     monkeypatch):
  """ArrayRecord reads local files: the dataset's own directory (not its neighbours') is
  copied from the bucket once and gives the local records."""
  from electra_jax import paths  # pylint: disable=import-outside-toplevel
  from electra_jax.data import tfds_source  # pylint: disable=import-outside-toplevel
  from tests import tfds_text  # pylint: disable=import-outside-toplevel
  del gcs
  monkeypatch.setattr(paths, 'CACHE_DIR', str(tmp_path / 'cache'))
  local = tmp_path / 'tfds'
  tfds_text.prepare(str(local))
  remote = f'{BUCKET}/tfds'
  for path in local.rglob('*'):
    if path.is_file():
      paths.get(f'{remote}/{path.relative_to(local)}').write_bytes(path.read_bytes())
  paths.get(f'{remote}/other_dataset/1.0.0/big.array_record').write_bytes(b'x' * 1000)
  want = list(tfds_source.open_text_source('electra_test_text', 'train', 'text',
                                           str(local)).texts())
  got = tfds_source.open_text_source('electra_test_text:1.0.0', 'train', 'text', remote)
  assert list(got.texts()) == want and len(want) > 1
  copied = {os.path.relpath(d, paths.CACHE_DIR) for d, _, fs in os.walk(paths.CACHE_DIR) if fs}
  assert not [d for d in copied if 'other_dataset' in d], copied
  with pytest.raises(UserError, match=r"TFDS dataset 'no_such' is not prepared in gs://"):
    tfds_source.open_text_source('no_such', 'train', 'text', remote)


def test_an_unreadable_step_on_the_bucket_is_moved_aside_and_the_previous_one_restored(gcs):
  """Move-aside on an object store (a copy, then a delete): garbage metadata in the newest
  step; the restore falls back to the one before, and the bad step lands in
  corrupt_checkpoints/, out of the way of the steps saved next."""
  del gcs
  from etils import epath  # pylint: disable=import-outside-toplevel
  directory = f'{BUCKET}/corrupt/checkpoints'
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  ckpt = checkpoint.Checkpointer(directory, keep=3)
  for step in (1, 2):
    ckpt.save(step, {'w': jax.numpy.full(4, float(step))}, force=True)
  ckpt.close()
  epath.Path(f'{directory}/2/state/_METADATA').write_text('{"tree_metadata": garbage')
  ckpt = checkpoint.Checkpointer(directory, keep=3)
  abstract = {'w': jax.ShapeDtypeStruct((4,), np.float32, sharding=device)}
  step, state, _ = ckpt.restore_latest_valid(abstract)
  assert step == 1
  np.testing.assert_array_equal(state['w'], np.ones(4))
  assert ckpt.all_steps() == [1]
  ckpt.save(2, {'w': jax.numpy.zeros(4)}, force=True)
  ckpt.close()
  moved = epath.Path(f'{BUCKET}/corrupt/corrupt_checkpoints/2')
  assert (moved / 'state' / '_METADATA').read_text() == '{"tree_metadata": garbage'
  assert (moved / checkpoint.COMMIT_FILE).exists()
  assert checkpoint.steps(f'{BUCKET}/corrupt') == [1, 2]


_CACHE_PROBE = """
import sys
import jax, jax.numpy as jnp, numpy as np
from electra_jax import cli
events = []
jax.monitoring.register_event_listener(lambda event, **kwargs: events.append(event))
cli.use_compilation_cache(sys.argv[1])
jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(np.ones((16, 16), np.float32)).block_until_ready()
print(events.count('/jax/compilation_cache/cache_hits'),
      events.count('/jax/compilation_cache/cache_misses'))
"""


def test_a_compilation_cache_on_the_bucket_spares_a_restarted_process_the_compile(gcs,
                                                                                  cache_dir):
  """--compilation_cache_dir=gs://...: the first process compiles and writes the program to
  the bucket, a new one (a restarted pod job) loads it from there."""
  emulator, _ = gcs
  env = bucket_env(cache_dir, emulator.url, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  command = [sys.executable, '-c', _CACHE_PROBE, f'{BUCKET}/probe_cache']
  first, second = (run(command, env).stdout.split() for _ in range(2))
  assert first == ['0', '1'] and second == ['1', '0']
  from etils import epath  # pylint: disable=import-outside-toplevel
  assert len(list(epath.Path(f'{BUCKET}/probe_cache').iterdir())) >= 1


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
  assert "'gs://" in lines[-1]  # It names the path it could not use.
  assert not any(line.startswith('Traceback') for line in lines)
  assert checkpoint.steps(f'{BUCKET}/fault_{fault}') == []
  from etils import epath  # pylint: disable=import-outside-toplevel
  assert not list(epath.Path(f'{BUCKET}/fault_{fault}').glob('*'))


@pytest.mark.parametrize('absent', [('gcsfs',), ('gcsfs', 'google.auth')])
def test_gs_paths_without_gcsfs_are_one_line_errors(monkeypatch, tmp_path, absent):
  """An image without gcsfs (the GPU machine's) names the missing packages before any read."""
  from electra_jax import paths  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(paths, '_USABLE_SCHEMES', set())
  for module in absent:
    monkeypatch.setitem(sys.modules, module, None)  # find_spec() then reports it missing.
  with pytest.raises(UserError) as error:
    paths.get('gs://some-bucket/run')
  message = str(error.value)
  assert '\n' not in message and message.startswith("'gs://some-bucket/run': gs:// paths need ")
  assert ('google-auth' in message.split('(')[0]) == ('google.auth' in absent)
  assert "pip install 'gcsfs" in message and not paths._USABLE_SCHEMES
  assert str(paths.get(tmp_path)) == str(tmp_path)  # Local paths still work.


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
  proxy.outage_after, proxy.outage_seconds = 'outage/checkpoints/9/', 3.0
  proxy.outage_started = None
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


def test_an_init_from_run_killed_in_its_first_save_starts_again_from_init_from(
    gcs, bucket_data, cache_dir, tmp_path):
  """On gs:// a save cut short leaves checkpoints/0/ without commit_success.txt (locally: a
  temporary directory): the re-run counts no checkpoint, so it starts from init_from again
  rather than taking the half-written step for a run to resume."""
  pytest.importorskip('torch')
  pytest.importorskip('transformers')
  from tests import hf_pair  # pylint: disable=import-outside-toplevel
  from etils import epath  # pylint: disable=import-outside-toplevel
  emulator, _ = gcs
  disc = str(tmp_path / 'disc')
  hf_pair.save_pair(disc, str(tmp_path / 'gen'), hf_pair.wordpiece_vocab(str(tmp_path / 'v')))
  workdir = f'{BUCKET}/init_from_cut'
  command = [sys.executable, '-m', 'electra_jax.train', '--config=configs/demo.py',
             '--config.max_seq_length=32', '--config.train_batch_size=8',
             '--config.num_train_steps=2', '--config.eval_every_steps=0',
             '--config.progress_bar=false', f"--config.train_files={bucket_data['train_files']}",
             f'--config.init_from={disc}', f'--workdir={workdir}', '--stop_after_steps=0']
  env = bucket_env(cache_dir, emulator.url)
  run(command, env)
  (epath.Path(f'{workdir}/checkpoints/0') / checkpoint.COMMIT_FILE).unlink()
  assert checkpoint.latest_step(workdir) is None
  again = run(command, env, check=False)
  assert again.returncode == 0, again.stderr[-2000:]
  assert 'Resuming' not in again.stdout and 'init_from is ignored' not in again.stdout
  assert "parameter arrays from init_from '" in again.stdout
  assert checkpoint.latest_step(workdir) == 0


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
  make_point = runs._make_point  # pylint: disable=protected-access
  point = make_point(workdir, f'{output}/points/tiny/4', 4, 8e9)
  assert point['train'] == dict(step=4, loss=6.0)
  assert checkpoint.steps(f'{output}/points/tiny/4') == [4]
  copied = checkpoint.Checkpointer(f'{output}/points/tiny/4/checkpoints', read_only=True)
  np.testing.assert_array_equal(copied.read_state(4)['w'], np.arange(6.0))
  copied.close()
  results = dict(flops_budget=1e10, finetune_task='files', main_metric='accuracy', num_seeds=2,
                 configs=[dict(name='tiny', objective='electra', flops_per_step=2e9,
                               flops_stages=[[0, 2e9]],
                               pretrain_workdir=workdir, num_warmup_steps=0,
                               config_warmup_steps=10, points=[dict(
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


def test_a_killed_test_process_leaves_no_emulator_behind():
  """The server dies with the process that started it, even one killed with SIGKILL."""
  code = ('import sys, time; from tests import gcs_emulator; '
          'e = gcs_emulator.Emulator(); print(e.port, flush=True); time.sleep(600)')
  proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                          text=True)
  port = int(proc.stdout.readline())
  socket.create_connection(('127.0.0.1', port), timeout=5).close()  # It was serving.
  proc.kill()
  proc.wait()
  deadline = time.time() + 30
  while time.time() < deadline:
    try:
      socket.create_connection(('127.0.0.1', port), timeout=1).close()
    except OSError:
      return  # Nothing listens any more.
    time.sleep(0.2)
  pytest.fail(f'fake-gcs-server still listens on port {port} 30 s after its parent was killed')
