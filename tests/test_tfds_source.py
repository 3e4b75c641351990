"""TFDS text datasets as a pretraining source: a real ArrayRecord-prepared builder (no
TensorFlow, no download) and tfds.testing.mock_data."""
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from electra_jax.data import pipeline
from electra_jax.data import sources
from electra_jax.data import tfds_source
from electra_jax.data import tokenizer as tok
from electra_jax.errors import UserError
from tests import tfds_text
from tests.conftest import REPO_ROOT, tiny_config
from tests.tfds_text import NUM_DOCS
from tests.test_data import assert_well_formed, build_examples, held_out_note

DEMO_MODEL = os.path.join(REPO_ROOT, 'data', 'demo_spm.model')
SEQ = 64


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return tfds_text.prepare(str(tmp_path_factory.mktemp('tfds')))


@pytest.fixture(scope='module')
def tokenizer():
  return tok.load_tokenizer(DEMO_MODEL, 8000)


def tfds_config(data_dir, **overrides):
  keys = dict(vocab_file=DEMO_MODEL, vocab_size=8000, max_seq_length=SEQ,
              tfds_name='electra_test_text', tfds_split='train', text_key='text',
              tfds_data_dir=data_dir, train_files='/nowhere/*.txt')
  return tiny_config(**{**keys, **overrides})


def test_tfds_documents_pack_exactly_like_the_same_documents_in_a_text_file(
    data_dir, tokenizer, tmp_path):
  stored = tfds.data_source('electra_test_text', split='train', data_dir=data_dir)
  order = [int(stored[i]['id']) for i in range(len(stored))]
  assert sorted(order) == list(range(NUM_DOCS))
  docs = tfds_text.documents()
  (tmp_path / 'same.txt').write_text('\n\n'.join(docs[i] for i in order) + '\n')
  config = tfds_config(data_dir, short_seq_prob=0.1, seed=3)
  from_file = build_examples(str(tmp_path / 'same.txt'), tokenizer, SEQ, 0.1, seed=3)
  from_tfds = pipeline.build_train_examples(config, tokenizer)
  assert len(from_tfds['input_ids']) > NUM_DOCS
  for name in pipeline.FEATURES:
    np.testing.assert_array_equal(from_tfds[name], from_file[name])
  batch = next(pipeline.make_train_iterator(config, tokenizer))
  assert_well_formed(batch, SEQ)


def test_tfds_split_slices_are_honoured(data_dir):
  source = tfds_source.open_text_source('electra_test_text', 'train[:5]', 'text', data_dir)
  assert len(source) == 5 and [len(docs) for docs in source.records()] == [1] * 5
  assert source.description == "TFDS 'electra_test_text' split 'train[:5]'"


def test_a_tfds_data_dir_in_the_repository_is_read_from_any_directory(data_dir, tmp_path,
                                                                     monkeypatch):
  """The saved config names a tfds_data_dir inside the repository relative to it: it is found
  there whatever the cwd."""
  from electra_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from electra_jax import paths  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(paths, 'REPO_ROOT', os.path.dirname(data_dir))
  monkeypatch.chdir(tmp_path)
  config = config_lib.resolve(tfds_config(data_dir))
  assert config.tfds_data_dir == os.path.basename(data_dir)
  assert sources.open_corpus(config, 'train').num_parts == NUM_DOCS


def test_tfds_mock_data_works_without_tensorflow(tokenizer):
  with tfds.testing.mock_data(num_examples=40):
    source = tfds_source.open_text_source('lm1b', 'train', 'text')
    assert len(source) == 40
    ex = pipeline.build_train_examples(
        tiny_config(vocab_file=DEMO_MODEL, vocab_size=8000, max_seq_length=SEQ,
                    tfds_name='lm1b', tfds_data_dir=''), tokenizer)
  assert len(ex['input_ids']) >= 1
  assert_well_formed(ex, SEQ)


@pytest.mark.parametrize('name,directory', [
    ('wikipedia/20230601.en:1.0.0', 'wikipedia/20230601.en'),  # One config, any version.
    ('c4/en', 'c4/en'), ('lm1b:1.*.*', 'lm1b'),
    ('huggingface:ag_news', 'ag_news'),  # A community builder is stored without namespace.
])
def test_a_remote_tfds_dataset_is_copied_from_its_own_directory(name, directory):
  assert tfds_source.dataset_dir_name(name) == directory


def test_a_malformed_tfds_name_is_a_one_line_error():
  with pytest.raises(UserError, match=r"config.tfds_name='wiki pedia' is not a TFDS name"):
    tfds_source.dataset_dir_name('wiki pedia')


@pytest.mark.parametrize('name,split,key,where,message', [
    ('no_such_dataset', 'train', 'text', 'data', r"TFDS dataset 'no_such_dataset' not found "
     r'.*tfds build no_such_dataset --file_format=array_record --data_dir='),
    ('electra_test_text', 'train', 'body', 'data', r"config.text_key='body' is not a "
     r"feature of TFDS dataset 'electra_test_text'; its features are \['id', 'text', 'title'\]"),
    # A number feature, read as str(number), packed as text.
    ('electra_test_text', 'train', 'id', 'data', r"config.text_key='id' is not a text feature "
     r"of TFDS dataset 'electra_test_text'; its text features are \['text', 'title'\]"),
    ('electra_test_text', 'validation', 'text', 'data', r"config.tfds_split='validation' .*its "
     r"splits are \['train'\]"),
    ('electra_test_text', 'train', 'text', 'empty', r"TFDS dataset 'electra_test_text' is not "
     r'prepared in .*tfds build electra_test_text --file_format=array_record'),
])
def test_tfds_errors_are_one_line_and_say_what_to_do(data_dir, tmp_path, name, split, key, where,
                                                     message):
  directory = data_dir if where == 'data' else str(tmp_path / 'empty')
  with pytest.raises(UserError, match=message) as e:
    tfds_source.open_text_source(name, split, key, directory)
  assert '\n' not in str(e.value)
  assert not os.path.exists(tmp_path / 'empty' / 'downloads')  # Never downloads or builds.


def test_prepare_packs_a_tfds_split_as_training_streams_it_and_its_bar_counts_records(
    data_dir, tokenizer, tmp_path, capsys):
  # pylint: disable=import-outside-toplevel
  from electra_jax.data import prepare
  from electra_jax.data import shards
  config = tfds_config(data_dir, short_seq_prob=0.1, seed=3)
  summary = prepare.prepare(config, str(tmp_path / 'out'), examples_per_shard=40, progress=True)
  assert f'{NUM_DOCS}/{NUM_DOCS} [' in capsys.readouterr().err  # One tick per record.
  metadata = shards.read_metadata(summary['output'])
  assert metadata['source'] == dict(tfds_name='electra_test_text', tfds_split='train',
                                    text_key='text', tfds_data_dir=data_dir)
  streamed = pipeline.build_train_examples(config, tokenizer)
  examples = pipeline.open_train_examples(
      tfds_config(data_dir, short_seq_prob=0.1, seed=3, train_data_dir=summary['output']),
      tokenizer)
  read_back = examples.gather(np.arange(len(examples)))
  for name in pipeline.FEATURES:
    np.testing.assert_array_equal(read_back[name], streamed[name])


def test_tfds_eval_split_is_the_eval_set_read_as_the_same_text_file_would_be(
    data_dir, tokenizer, tmp_path):
  stored = tfds.data_source('electra_test_text', split='train', data_dir=data_dir)
  docs = tfds_text.documents()
  held_out = [docs[int(stored[i]['id'])] for i in range(8, NUM_DOCS)]
  (tmp_path / 'held_out.txt').write_text('\n\n'.join(held_out) + '\n')
  config = tfds_config(data_dir, tfds_split='train[:8]', tfds_eval_split='train[8:]',
                       eval_files=str(tmp_path / 'nowhere.txt'), eval_batch_size=4)
  from_files = tfds_config(data_dir, eval_files=str(tmp_path / 'held_out.txt'),
                           eval_batch_size=4)
  want = list(pipeline.make_eval_iterator(from_files, tokenizer))
  got = list(pipeline.make_eval_iterator(config, tokenizer))
  assert len(got) == len(want) > 2
  for w, g in zip(want, got):
    for name in pipeline.FEATURES:
      np.testing.assert_array_equal(g[name], w[name])
  np.testing.assert_array_equal(pipeline.count_token_frequencies(config, tokenizer),
                                pipeline.count_token_frequencies(from_files, tokenizer))
  # A glob given for one evaluation (evaluate --eval_files) is read instead.
  glob = sources.open_corpus(config, 'eval', str(tmp_path / 'held_out.txt'))
  assert len(list(pipeline.make_eval_iterator(config, tokenizer, corpus=glob))) == len(want)
  # Unset, evaluation reads eval_files, as before the key existed.
  with pytest.raises(UserError, match=r"no files match '.*nowhere.txt'"):
    pipeline.make_eval_iterator(tfds_config(data_dir, eval_files=str(tmp_path / 'nowhere.txt')),
                                tokenizer)
  with pytest.raises(UserError, match=r"config.tfds_split='nope' does not work"):
    sources.open_corpus(tfds_config(data_dir, tfds_eval_split='nope'), 'eval')
  assert held_out_note(config) is None
  assert held_out_note(tfds_config(data_dir, tfds_eval_split='train')) == (
      "the eval set is the training split (TFDS 'electra_test_text' split 'train'): its metrics "
      'are not of held-out text; set tfds_eval_split to a split training never reads')


def test_a_run_on_tfds_evaluates_on_its_eval_split_and_evaluate_names_it(data_dir, tmp_path):
  # pylint: disable=import-outside-toplevel
  import json
  import subprocess
  import sys
  from electra_jax import train
  workdir = str(tmp_path / 'run')
  config = tfds_config(data_dir, tfds_split='train[:8]', tfds_eval_split='train[8:]',
                       eval_files='/nowhere/*.txt', num_layers=1, num_train_steps=2,
                       num_warmup_steps=1, eval_every_steps=2, num_eval_steps=1,
                       log_every_steps=2, save_checkpoints_steps=2, progress_bar=False)
  assert train.train_and_evaluate(config, workdir)['status'] == 'completed'
  with open(os.path.join(workdir, 'eval_metrics.jsonl'), encoding='utf-8') as f:
    assert [json.loads(line)['step'] for line in f] == [2]
  proc = subprocess.run([sys.executable, '-m', 'electra_jax.evaluate', f'--workdir={workdir}',
                         '--num_batches=1'], cwd=REPO_ROOT, capture_output=True, text=True,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'), timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert result['eval_tfds'] == 'electra_test_text:train[8:]' and 'eval_files' not in result
  assert result['num_batches'] == 1 and 0 < result['disc_auc'] < 1
