"""Prepared ArrayRecord shards (prepare.py, train_data_dir) and the device prefetcher."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from electra_jax import parallel
from electra_jax.data import pipeline
from electra_jax.data import prefetch
from electra_jax.data import prepare
from electra_jax.data import shards
from electra_jax.data import sources
from electra_jax.data import tokenizer as tok
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, tiny_config, under_ulimit
from tests.test_data import assert_well_formed, build_examples, held_out_note

DEMO_MODEL = os.path.join(REPO_ROOT, 'data', 'demo_spm.model')
PERSUASION = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'eval', 'persuasion.txt')
SEQ = 32


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """Six chapters of Persuasion in two files (about 700 examples of 32 tokens)."""
  root = tmp_path_factory.mktemp('corpus')
  docs = list(sources.read_documents([PERSUASION]))
  for name, part in (('a.txt', docs[:3]), ('b.txt', docs[3:6])):
    (root / name).write_text('\n\n'.join('\n'.join(d) for d in part) + '\n', encoding='utf-8')
  return str(root / '*.txt')


def config_for(corpus, **overrides):
  keys = dict(vocab_file=DEMO_MODEL, vocab_size=8000, train_files=corpus, max_seq_length=SEQ,
              short_seq_prob=0.1, seed=5)
  return tiny_config(**{**keys, **overrides})


@pytest.fixture(scope='module')
def tokenizer():
  return tok.load_tokenizer(DEMO_MODEL, 8000)


@pytest.fixture(scope='module')
def prepared(corpus, tmp_path_factory):
  out = str(tmp_path_factory.mktemp('prepared') / 'out')
  summary = prepare.prepare(config_for(corpus), out, examples_per_shard=150, progress=False)
  return out, summary


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def assert_batches_equal(want, got):
  assert len(want) == len(got)
  for x, y in zip(want, got):
    assert set(x) == set(y) == set(pipeline.FEATURES)
    for name in pipeline.FEATURES:
      np.testing.assert_array_equal(np.asarray(x[name]), np.asarray(y[name]))


def test_slow_packing_at_start_up_earns_a_hint_to_prepare_and_prepared_shards_none(
    corpus, prepared, tokenizer):
  examples = pipeline.open_train_examples(config_for(corpus), tokenizer)
  assert pipeline.packing_note(examples, pipeline.SLOW_PACKING_SECONDS - 1) is None
  rows = len(examples)
  assert examples.nbytes == 3 * 4 * rows * SEQ
  assert pipeline.packing_note(examples, 75.4).startswith(
      f'packing the corpus took 75 s ({rows:,} examples, 0.0 GiB held in memory), and every '
      'start and resume pays it again; pack it once with `python -m electra_jax.data.prepare')
  shards_config = config_for(corpus, train_data_dir=prepared[0])
  assert pipeline.packing_note(pipeline.open_train_examples(shards_config, tokenizer),
                               1000.0) is None


def test_the_data_line_counts_shards_as_text_and_notes_a_corpus_read_too_many_times(
    corpus, prepared, tokenizer):
  streamed = pipeline.open_train_examples(config_for(corpus), tokenizer)
  n, num_tokens = len(streamed), streamed.num_tokens
  assert num_tokens == prepared[1]['num_tokens'] > 0.8 * n * SEQ
  lines = []
  for steps in (pipeline.MANY_EPOCHS, pipeline.MANY_EPOCHS + 1):  # Batch n: an epoch a step.
    for data_dir in ('', prepared[0]):
      c = config_for(corpus, train_data_dir=data_dir, num_train_steps=steps, train_batch_size=n)
      line, notes = pipeline.data_summary(pipeline.open_train_examples(c, tokenizer), c)
      lines.append(line)
      assert notes == ([] if steps == pipeline.MANY_EPOCHS else [
          f'the run reads its {n:,} training examples {steps} times: it will memorise them '
          'long before the end, and held-out metrics stall; train on more text (train_files, '
          'tfds_name or train_data_dir) or lower num_train_steps'])
  assert lines[0] == lines[1] == (
      f'data: {n:,} examples, {num_tokens:,} tokens ({num_tokens / (n * SEQ):.0%} of their '
      f'{SEQ} positions); {pipeline.MANY_EPOCHS} steps of {n} read them '
      f'{pipeline.MANY_EPOCHS:.1f} times')


def test_prepare_round_trip_writes_the_streamed_examples_in_order(corpus, prepared, tokenizer):
  out, summary = prepared
  streamed = pipeline.build_train_examples(config_for(corpus), tokenizer)
  n = len(streamed['input_ids'])
  metadata = shards.read_metadata(out)
  assert summary['num_examples'] == metadata['num_examples'] == n > 600
  assert summary['num_shards'] == len(metadata['shards']) == -(-n // 150)
  assert [s['num_examples'] for s in metadata['shards']] == [150] * (n // 150) + [n % 150]
  assert metadata['num_tokens'] == int(streamed['input_mask'].sum())
  assert metadata['vocab_sha256'] == shards.file_sha256(DEMO_MODEL)
  assert (metadata['vocab_size'], metadata['max_seq_length'], metadata['short_seq_prob'],
          metadata['seed'], metadata['record_dtype']) == (8000, SEQ, 0.1, 5, '<u2')
  assert not [f for f in os.listdir(out) if f.endswith('.tmp')]
  examples = pipeline.open_train_examples(config_for(corpus, train_data_dir=out), tokenizer)
  assert len(examples) == n
  assert examples.source == metadata['source'] == sources.training_source(config_for(corpus))
  read_back = examples.gather(np.arange(n))
  for name in pipeline.FEATURES:
    np.testing.assert_array_equal(read_back[name], streamed[name])
  assert_well_formed(read_back, SEQ)


def test_prepared_data_of_the_eval_files_earns_the_held_out_note(corpus, prepared):
  prepared_config = lambda eval_files: config_for(corpus, train_data_dir=prepared[0],
                                                  train_files='/moved/*.txt',
                                                  eval_files=eval_files)
  note = held_out_note(prepared_config(corpus))
  assert note.startswith("2 of the eval set's 2 file(s) are training files too")
  assert held_out_note(prepared_config(PERSUASION)) is None


def test_prepared_data_in_the_repository_is_read_from_any_directory(corpus, prepared, tmp_path,
                                                                  monkeypatch):
  """A train_data_dir inside the repository is saved relative to it (the clone may move):
  training and evaluate's held-out check read it from there, whatever the cwd."""
  from electra_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from electra_jax import paths  # pylint: disable=import-outside-toplevel
  repo = tmp_path / 'repo'
  shutil.copytree(prepared[0], repo / 'prepared')
  monkeypatch.setattr(paths, 'REPO_ROOT', str(repo))
  monkeypatch.chdir(tmp_path)
  config = config_lib.resolve(config_for(corpus, train_data_dir=str(repo / 'prepared')))
  assert config.train_data_dir == 'prepared'
  source = shards.read_metadata(prepared[0])['source']
  assert sources.training_source(config) == source
  examples = pipeline.open_train_examples(config, tok.load_tokenizer(DEMO_MODEL, 8000))
  assert examples.source == source


def test_training_batches_from_shards_equal_streamed_batches_across_epochs(corpus, prepared,
                                                                           tokenizer):
  out, summary = prepared
  steps = 2 * summary['num_examples'] // 8 + 3  # Two epochs and a bit.
  streamed = take(pipeline.make_train_iterator(config_for(corpus), tokenizer), steps)
  from_shards = take(pipeline.make_train_iterator(config_for(corpus, train_data_dir=out),
                                                  tokenizer), steps)
  assert_batches_equal(streamed, from_shards)


@pytest.mark.parametrize('source', ['raw', 'prepared'])
def test_two_hosts_read_disjoint_rows_that_make_up_the_single_host_batch(corpus, prepared,
                                                                         tokenizer, source):
  config = config_for(corpus, train_data_dir=prepared[0] if source == 'prepared' else '')
  single = take(pipeline.make_train_iterator(config, tokenizer), 5)
  hosts = [take(pipeline.make_train_iterator(config, tokenizer, rows), 5)
           for rows in np.arange(8).reshape(2, 4)]
  for step in range(5):
    for name in pipeline.FEATURES:
      assert hosts[0][step][name].shape == (4, SEQ)
      merged = np.concatenate([hosts[0][step][name], hosts[1][step][name]])
      np.testing.assert_array_equal(merged, single[step][name])


@pytest.mark.parametrize('source', ['raw', 'prepared'])
def test_a_global_position_resumes_on_any_process_count_past_prefetched_batches(
    corpus, prepared, tokenizer, source):
  """A checkpoint stores examples consumed; the batches the prefetcher made ahead are not a
  position, and a resumed run with another number of processes reads on from there."""
  config = config_for(corpus, train_data_dir=prepared[0] if source == 'prepared' else '')
  mesh = parallel.make_mesh()
  uninterrupted = take(pipeline.make_train_iterator(config, tokenizer), 8)
  it = prefetch.to_mesh(pipeline.make_train_iterator(config, tokenizer), mesh, buffer_size=3)
  first = take(it, 5)
  time.sleep(0.3)  # Let the thread fill its buffer: the parent is now 3 batches further.
  assert it._queue.full()  # pylint: disable=protected-access
  assert isinstance(first[0]['input_ids'], jax.Array)
  it.close()
  position = 5 * config.train_batch_size
  resumed = prefetch.to_mesh(pipeline.make_train_iterator(config, tokenizer, start=position),
                             mesh)
  assert_batches_equal(uninterrupted, first + take(resumed, 3))
  resumed.close()
  hosts = [take(pipeline.make_train_iterator(config, tokenizer, rows, start=position), 3)
           for rows in np.arange(8).reshape(2, 4)]
  merged = [{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in zip(*hosts)]
  assert_batches_equal(uninterrupted[5:], merged)


def test_step_chunks_stack_the_batches_of_each_call_on_a_global_steps_axis():
  """Calls of 4 steps from step 3: step 4 alone (back onto multiples of 4), then 5-8, 9-12;
  the rows of each batch stay sharded over the mesh after the steps axis."""
  batches = ({'input_ids': np.full((8, 2), i)} for i in range(100))
  mesh = parallel.make_mesh()
  it = prefetch.to_mesh(prefetch.StepChunks(batches, 3, 4), mesh, steps_axis=True)
  calls = [jax.device_get(next(it)['input_ids']) for _ in range(3)]
  it.close()
  assert [c.shape for c in calls] == [(1, 8, 2), (4, 8, 2), (4, 8, 2)]
  assert [c[:, 0, 0].tolist() for c in calls] == [[0], [1, 2, 3, 4], [5, 6, 7, 8]]


def test_peek_shows_the_next_item_without_taking_it():
  it = prefetch.DevicePrefetcher(iter(range(5)), lambda x: x * 10)
  assert it.peek() == 0 and it.peek() == 0
  assert [next(it), next(it)] == [0, 10]
  assert it.peek() == 20 and next(it) == 20
  it.close()
  failing = prefetch.DevicePrefetcher(iter([1]), lambda b: 1 / 0)
  assert failing.peek() is None  # The error is the next item's: __next__ raises it.
  with pytest.raises(ZeroDivisionError):
    next(failing)


def test_prefetcher_passes_errors_on(corpus, tokenizer):
  config = config_for(corpus)
  failing = prefetch.DevicePrefetcher(pipeline.make_train_iterator(config, tokenizer),
                                      lambda b: 1 / 0)
  with pytest.raises(ZeroDivisionError):
    next(failing)


def test_shards_prepared_for_another_vocab_or_length_are_refused(corpus, prepared, tokenizer,
                                                                 tmp_path):
  out = prepared[0]
  with pytest.raises(UserError, match=r"prepared with max_seq_length=32 but "
                     r'config.max_seq_length=64; set --config.max_seq_length=32'):
    pipeline.make_train_iterator(config_for(corpus, train_data_dir=out, max_seq_length=64),
                                 tokenizer)
  with pytest.raises(UserError, match=r'prepared with pack_across_documents=False but '
                     r'config.pack_across_documents=True; set '):
    pipeline.make_train_iterator(config_for(corpus, train_data_dir=out,
                                            pack_across_documents=True), tokenizer)
  with pytest.raises(UserError, match=r'prepared with short_seq_prob=0.1 but '
                     r'config.short_seq_prob=0.5; set --config.short_seq_prob=0.1'):
    pipeline.make_train_iterator(config_for(corpus, train_data_dir=out, short_seq_prob=0.5),
                                 tokenizer)
  # Another seed (a second pretraining seed on the same shards) is noted, not refused.
  examples = pipeline.open_train_examples(config_for(corpus, train_data_dir=out), tokenizer)
  assert not pipeline.data_summary(examples, config_for(corpus))[1]
  notes = pipeline.data_summary(examples, config_for(corpus, seed=6))[1]
  assert [n for n in notes if n.startswith('train_data_dir was packed with seed=5, so ')]
  # Data prepared before the key existed ended its examples with their documents.
  metadata = shards.read_metadata(out)
  assert metadata['pack_across_documents'] is False
  del metadata['pack_across_documents']
  shards.check_compatible(metadata, out, config_for(corpus), tokenizer)
  with pytest.raises(UserError, match=r'prepared with pack_across_documents=False but '):
    shards.check_compatible(metadata, out, config_for(corpus, pack_across_documents=True),
                            tokenizer)
  other_vocab = tmp_path / 'other.model'
  shutil.copy(DEMO_MODEL, other_vocab)
  with open(other_vocab, 'ab') as f:
    f.write(b'\x00')  # Same vocabulary size, different file: its hash differs.
  with pytest.raises(UserError, match=r'prepared with vocabulary .*differs from '
                     r'config.vocab_file'):
    shards.check_compatible(shards.read_metadata(out), out,
                            config_for(corpus, vocab_file=str(other_vocab)),
                            type('Tok', (), {'vocab_file': str(other_vocab)})())
  with pytest.raises(UserError, match=r"holds no prepared train data .*electra_jax.data.prepare"):
    pipeline.make_train_iterator(config_for(corpus, train_data_dir=str(tmp_path)), tokenizer)
  with pytest.raises(UserError, match=r'already holds prepared data'):
    prepare.prepare(config_for(corpus), out, progress=False)
  run = tmp_path / 'a_run'  # Shards never go in among a run's files.
  run.mkdir()
  (run / 'config.json').write_text('{}')
  with pytest.raises(UserError, match=r"a_run' holds a run \(.*config.json\); pick a new"):
    prepare.prepare(config_for(corpus), str(run), progress=False)
  assert os.listdir(run) == ['config.json']


def test_a_damaged_copy_of_prepared_data_is_one_error_line_naming_the_file(corpus, prepared,
                                                                          tokenizer, tmp_path):
  """A copy cut short: its metadata (a JSONDecodeError, or an AttributeError for valid JSON
  that is no object) or a shard (array_record's RuntimeError, no message) is named."""
  copy = tmp_path / 'copy'
  shutil.copytree(prepared[0], copy)
  metadata_file = copy / 'train_metadata.json'
  whole = metadata_file.read_bytes()
  for damaged, message in ((whole[:100], 'is not readable prepared data'),
                           (b'[]', "is not prepared data's metadata")):
    metadata_file.write_bytes(damaged)
    with pytest.raises(UserError, match=re.escape(f"'{metadata_file}' {message}")):
      shards.read_metadata(str(copy))
  metadata_file.write_bytes(whole)
  shard = copy / shards.read_metadata(str(copy))['shards'][-1]['file']
  shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
  with pytest.raises(UserError, match=re.escape(f"'{copy}' holds a damaged or incomplete shard "
                                                f'({shard.name})')):
    pipeline.open_train_examples(config_for(corpus, train_data_dir=str(copy)), tokenizer)


READ_ALL_SHARDS = """
import resource, sys
from electra_jax.data import shards
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[3])))
examples = shards.PreparedExamples(sys.argv[1], shards.read_metadata(sys.argv[1]))
print(len(examples.examples(range(len(examples)))))
"""


def test_more_shards_than_the_soft_limit_on_open_files_are_read(corpus, tmp_path):
  """ArrayRecord keeps each shard open: thousands (C4) passed `ulimit -n` 1024 and training died
  of 'Too many open files'. The soft limit is raised to fit; a hard limit too low is one line."""
  import resource  # pylint: disable=import-outside-toplevel
  hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
  out = str(tmp_path / 'many')
  summary = prepare.prepare(config_for(corpus), out, examples_per_shard=4, progress=False)
  num_shards = len(shards.read_metadata(out)['shards'])
  assert num_shards > 150

  def read_all(soft, hard):
    return subprocess.run([sys.executable, '-c', READ_ALL_SHARDS, out, str(soft), str(hard)],
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS='cpu'),
                          capture_output=True, text=True, timeout=300)
  proc = read_all(100, hard)
  assert proc.returncode == 0, proc.stderr
  assert int(proc.stdout) == summary['num_examples']
  proc = read_all(100, num_shards)
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == (
      f"electra_jax.errors.UserError: train_data_dir '{out}' has {num_shards} shards, which "
      f'ArrayRecord keeps open, but this process may open at most {num_shards} files; raise the '
      f'limit (ulimit -n {num_shards + 1024}, as root or in limits.conf) or re-run prepare with '
      'a larger --examples_per_shard')


def run_prepare(*flags, ulimit=()):
  """`ulimit`: bash's ulimit flags for the command, e.g. ('-f', '16')."""
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS='cpu')
  limits = under_ulimit(*ulimit) if ulimit else []
  return subprocess.run([*limits, sys.executable, '-m', 'electra_jax.data.prepare', *flags],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_full_disk_under_a_shard_is_one_error_line_and_leaves_no_folder(corpus, tmp_path):
  """ArrayRecord reports a failed write as a RuntimeError: it was a traceback (exit 1). A file
  size limit (EFBIG; Python ignores SIGXFSZ) fails the shard's write as a full disk would."""
  out = tmp_path / 'new' / 'out'
  proc = run_prepare('--config=configs/demo.py', f'--config.train_files={corpus}',
                     f'--config.max_seq_length={SEQ}', f'--output={out}',
                     '--examples_per_shard=100000', ulimit=('-f', '16'))  # 16 KiB.
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      f"error: writing --output '{out}' failed (File too large); free disk space (or raise the "
      'quota or file size limit), then re-run the same command')
  assert not (tmp_path / 'new').exists()
  (tmp_path / 'latin1.txt').write_bytes('caf\xe9 au lait\n'.encode('latin-1'))
  proc = run_prepare('--config=configs/demo.py', f'--config.train_files={tmp_path}/latin1.txt',
                     f'--output={out}')
  assert proc.returncode == 2  # The progress bar is closed first: the error is a line alone.
  assert proc.stderr.splitlines()[-1].startswith(f"error: '{tmp_path}/latin1.txt' is not UTF-8")


def test_prepare_cli_ends_with_json_and_bad_input_is_one_error_line(corpus, prepared, tmp_path):
  flags = ['--config=configs/demo.py', f'--config.train_files={corpus}',
           f'--config.max_seq_length={SEQ}', '--config.short_seq_prob=0.1', '--config.seed=5',
           '--examples_per_shard=150']
  proc = run_prepare(*flags, f'--output={tmp_path}/cli')
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['output'] == f'{tmp_path}/cli'
  # The command (not prepare(), which the data benchmark calls on a temporary folder) says
  # how to train on its output.
  assert f'train with --config.train_data_dir={tmp_path}/cli\n' in proc.stdout
  assert summary['num_examples'] == prepared[1]['num_examples']
  assert '2/2 [' in proc.stderr and ' files' in proc.stderr  # The bar counts the corpus's files.
  for shard in shards.read_metadata(prepared[0])['shards']:  # Byte-identical to in-process.
    with open(f"{prepared[0]}/{shard['file']}", 'rb') as a, \
         open(f"{tmp_path}/cli/{shard['file']}", 'rb') as b:
      assert a.read() == b.read()
  proc = run_prepare('--config=configs/demo.py', f'--config.train_files={tmp_path}/none/*.txt',
                     f'--output={tmp_path}/bad')
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [f"error: no files match '{tmp_path}/none/*.txt'; "
                                              'fix the glob (relative paths are tried from the '
                                              'current directory, then the repository root)']


def failing_after(num_examples, monkeypatch):
  """Makes prepare's corpus fail after `num_examples` examples, as a bad line deep in it
  would."""
  examples = pipeline.corpus_examples

  def fails(*args, **kwargs):
    for i, example in enumerate(examples(*args, **kwargs)):
      if i == num_examples:
        raise UserError('the corpus broke')
      yield example
  monkeypatch.setattr(pipeline, 'corpus_examples', fails)


def test_a_failed_prepare_leaves_no_shards_and_no_folder_of_its_own(corpus, tmp_path,
                                                                    monkeypatch):
  failing_after(5, monkeypatch)
  written = []
  abort = shards.ShardWriter.abort
  monkeypatch.setattr(shards.ShardWriter, 'abort', lambda self: (
      written.extend(os.listdir(self._dir)), abort(self)))  # pylint: disable=protected-access
  with pytest.raises(UserError, match='the corpus broke'):
    prepare.prepare(config_for(corpus), str(tmp_path / 'new' / 'out'), examples_per_shard=2,
                    progress=False)
  assert len(written) == 3  # Shards 0 and 1 full, 2 open: all removed, with the new folders.
  assert not os.path.exists(tmp_path / 'new')
  (tmp_path / 'mine').mkdir()
  (tmp_path / 'mine' / 'notes.txt').write_text('kept')
  with pytest.raises(UserError, match='the corpus broke'):
    prepare.prepare(config_for(corpus), str(tmp_path / 'mine'), examples_per_shard=2,
                    progress=False)
  assert os.listdir(tmp_path / 'mine') == ['notes.txt']


def test_a_rerun_after_a_killed_prepare_leaves_none_of_its_shards(corpus, tmp_path):
  """A kill -9 leaves shards (.tmp; uploaded ones under their names): a re-run writing fewer
  left the rest behind, unused (gigabytes at scale). The user's own files stay."""
  out = tmp_path / 'out'
  out.mkdir()
  leftovers = ['train-00040.array_record.tmp', 'train-00041.array_record.tmp',
               'train-00099.array_record']
  for name in leftovers + ['notes.txt', 'train-notes.array_record.txt']:
    (out / name).write_text('x')
  prepare.prepare(config_for(corpus), str(out), examples_per_shard=200, progress=False)
  shard_files = [s['file'] for s in shards.read_metadata(str(out))['shards']]
  assert shard_files == [f'train-0000{i}.array_record' for i in range(4)]
  assert sorted(os.listdir(out)) == sorted(
      shard_files + ['notes.txt', 'train-notes.array_record.txt', 'train_metadata.json'])


def test_bad_lines_fail_by_default_and_are_skipped_and_counted_when_asked(tmp_path, tokenizer,
                                                                          caplog):
  (tmp_path / 'mixed.txt').write_bytes(b'good line one\nbad \xff line\nbinary \x00 line\n'
                                       b'good line two\n')
  with pytest.raises(UserError, match=r"mixed.txt' is not UTF-8 .*byte offset 18\).*"
                     r'skip_bad_lines=true'):
    build_examples(str(tmp_path / 'mixed.txt'), tokenizer, SEQ, 0.0, 0)
  with caplog.at_level('WARNING'):
    docs = list(sources.read_documents([str(tmp_path / 'mixed.txt')], skip_bad_lines=True))
  assert docs == [['good line one', 'good line two']]
  assert 'skipped 2 line(s)' in caplog.text and 'mixed.txt' in caplog.text
  config = config_for(str(tmp_path / 'mixed.txt'), skip_bad_lines=True)
  assert len(pipeline.build_train_examples(config, tokenizer)['input_ids']) == 1


def test_train_runs_on_prepared_shards_and_checkpoints_the_consumed_position(corpus, prepared,
                                                                             tmp_path):
  from electra_jax import train  # pylint: disable=import-outside-toplevel
  config = config_for(corpus, train_data_dir=prepared[0], num_train_steps=3, num_warmup_steps=1,
                      eval_every_steps=0, log_every_steps=3, save_checkpoints_steps=3,
                      progress_bar=False)
  summary = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert summary['status'] == 'completed' and summary['step'] == 3
  with open(tmp_path / 'run' / 'checkpoints' / '3' / 'loop' / 'metadata') as f:
    loop_state = json.load(f)
  assert loop_state['data_position'] == 3 * config.train_batch_size
  assert loop_state['data'] == dict(examples=prepared[1]['num_examples'],
                                    tokens=prepared[1]['num_tokens'])


def test_a_checkpoint_keeps_its_data_order_and_an_unversioned_one_resumes_in_the_first(
    corpus, tmp_path, monkeypatch):
  """Seeds spread before grain's shuffle since order version 2: a run checkpointed before
  (no data_order) reads on in the order its position counts in, version 1."""
  from electra_jax import train  # pylint: disable=import-outside-toplevel
  config = config_for(corpus, seed=1, num_train_steps=2, num_warmup_steps=1,
                      eval_every_steps=0, log_every_steps=1, save_checkpoints_steps=1,
                      progress_bar=False)
  versions, make = [], pipeline.make_train_iterator
  monkeypatch.setattr(pipeline, 'make_train_iterator',
                      lambda *args: versions.append(args[5]) or make(*args))
  run = str(tmp_path / 'run')
  train.train_and_evaluate(config, run, stop_after_steps=1)
  metadata = tmp_path / 'run' / 'checkpoints' / '1' / 'loop' / 'metadata'
  loop_state = json.loads(metadata.read_text())
  assert loop_state['data_order'] == pipeline.ORDER_VERSION == 2
  del loop_state['data_order']
  metadata.write_text(json.dumps(loop_state))
  train.train_and_evaluate(config, run)
  assert versions == [2, 1]
  final = json.loads((tmp_path / 'run' / 'checkpoints' / '2' / 'loop' / 'metadata').read_text())
  assert final['data_order'] == 1


def test_a_resume_on_changed_data_says_it_does_not_read_on_where_it_left_off(
    corpus, tmp_path, capsys):
  """Files added to the run's glob change the shuffled order its data position counts in."""
  from electra_jax import train  # pylint: disable=import-outside-toplevel
  (tmp_path / 'text').mkdir()
  shutil.copy(glob.glob(corpus)[0], tmp_path / 'text' / 'a.txt')
  config = config_for(str(tmp_path / 'text' / '*.txt'), num_train_steps=2, num_warmup_steps=1,
                      eval_every_steps=0, log_every_steps=1, save_checkpoints_steps=1,
                      progress_bar=False)
  train.train_and_evaluate(config, str(tmp_path / 'run'), stop_after_steps=1)
  train.train_and_evaluate(config, str(tmp_path / 'run'), stop_after_steps=0)
  assert 'training data changed' not in capsys.readouterr().out
  shutil.copy(glob.glob(corpus)[-1], tmp_path / 'text' / 'b.txt')
  summary = train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert summary['status'] == 'completed'
  assert re.search(r'note: the training data changed since the checkpoint: 3\d\d examples '
                   r'\([\d,]+ tokens\) then, 6\d\d \([\d,]+\) now; the run reads on from '
                   r'position 8 of', capsys.readouterr().out)


def test_data_benchmark_cli_reads_the_same_batches_from_every_source_and_times_the_step(
    corpus, prepared):
  """`electra_jax.data.benchmark`: raw text and prepared shards, read in this process or by
  worker processes, give the same batches (so num_data_workers may change on resume), and
  --train_steps times the train program in whole calls of config.steps_per_execution."""
  env = dict(os.environ, PYTHONPATH=REPO_ROOT, JAX_PLATFORMS='cpu')
  proc = subprocess.run(
      [sys.executable, '-m', 'electra_jax.data.benchmark', '--config=configs/demo.py',
       f'--config.train_files={corpus}', f'--config.max_seq_length={SEQ}',
       '--config.short_seq_prob=0.1', '--config.seed=5', '--config.num_layers=1',
       '--config.train_batch_size=8', '--config.steps_per_execution=2',
       f'--data_dir={prepared[0]}', '--num_batches=3', '--workers=0,2', '--train_steps=3'],
      cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['same_batches_for_all_runs'] is True
  assert [(r['source'], r['workers']) for r in summary['results']] == [
      ('raw', 0), ('raw', 2), ('prepared', 0), ('prepared', 2)]
  assert summary['train_step_tokens_per_sec'] > 0
  assert 'train step (demo):' in proc.stdout
  for flag, message in [
      ('--workers=1,two', '--workers=1,two must be whole numbers >= 0, e.g. --workers=0,1,2'),
      ('--workers=-1', '--workers=-1 must be whole numbers >= 0, e.g. --workers=0,1,2'),
      ('--num_batches=0', '--num_batches=0 must be >= 1 and --train_steps=0 >= 0 (0 skips the '
       'train step)'),
      ('--train_steps=-2', '--num_batches=200 must be >= 1 and --train_steps=-2 >= 0 (0 skips '
       'the train step)'),
      (f'--data_dir={corpus}', f"'{corpus}' holds no prepared train data")]:
    bad = subprocess.run([sys.executable, '-m', 'electra_jax.data.benchmark',
                          '--config=configs/demo.py', flag], cwd=REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip().startswith(f'error: {message}'), (
        bad.stderr)
    assert 'Timing' not in bad.stdout  # Refused before anything is timed.


def test_shards_prepared_for_an_init_from_run_use_its_vocabulary_extension_included(
    corpus, tmp_path):
  """prepare with the run's init_from (and extend_vocab_file) packs with the vocabulary that
  run will train with, so training accepts the shards; without them the vocabulary differs."""
  from electra_jax import train  # pylint: disable=import-outside-toplevel
  fixture = os.path.join(REPO_ROOT, 'tests', 'data', 'official_checkpoint')
  words = tmp_path / 'words.txt'
  words.write_text('elliot\nwentworth\n', encoding='utf-8')
  keys = dict(init_from=fixture, extend_vocab_file=str(words), eval_every_steps=0,
              num_train_steps=2, save_checkpoints_steps=2, log_every_steps=1, progress_bar=False)
  out = str(tmp_path / 'prepared')
  summary = prepare.prepare(config_for(corpus, **keys), out, examples_per_shard=500,
                            progress=False)
  with open(summary['metadata'], encoding='utf-8') as f:
    metadata = json.load(f)
  assert metadata['vocab_size'] == 40 + 2
  # The resolved config names a source in the repository relative to it (it may move).
  assert metadata['vocab_file'] == ("the vocabulary of init_from 'tests/data/official_checkpoint' "
                                    f"extended with '{words}'")
  examples = shards.PreparedExamples(out, metadata)
  ids = np.concatenate([t for t, _ in examples.examples(range(len(examples)))])
  assert {40, 41} <= set(ids.tolist())  # The new words, packed as single tokens.
  run = train.train_and_evaluate(config_for(corpus, train_data_dir=out, **keys),
                                 str(tmp_path / 'run'), stop_after_steps=None)
  assert run['step'] == 2
  without = config_for(corpus, train_data_dir=out, **{**keys, 'extend_vocab_file': ''})
  with pytest.raises(UserError, match=r'was prepared with vocabulary .*extended with'):
    train.train_and_evaluate(without, str(tmp_path / 'other'))
