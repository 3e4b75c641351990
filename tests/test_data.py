"""The data package: vocabularies, text sources, example packing and the train/eval iterators."""
import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import grain
import ml_collections
import numpy as np
import pytest

from electra_jax import atomic
from electra_jax import paths
from electra_jax.data import pipeline
from electra_jax.data import sources
from electra_jax.data import tokenizer as tok
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, tiny_config, under_ulimit

DEMO_MODEL = os.path.join(REPO_ROOT, 'data', 'demo_spm.model')
PERSUASION = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'eval', 'persuasion.txt')
TINY_VOCAB = 300
SEQ = 32


def write_docs(path, docs):
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n\n'.join('\n'.join(doc) for doc in docs) + '\n')


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """Chapters of the bundled Persuasion in three files: 'big' ones and a 'small' one."""
  root = tmp_path_factory.mktemp('corpus')
  docs = list(sources.read_documents([PERSUASION]))
  write_docs(root / 'a.txt', docs[0:2])
  write_docs(root / 'b.txt', docs[2:4])
  write_docs(root / 'small.txt', [docs[4][:2], docs[5][:2]])
  return root


@pytest.fixture(scope='module')
def tiny_tokenizer(corpus, tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp('vocab') / 'tiny')
  lines = sources.vocabulary_lines([str(corpus / 'a.txt'), str(corpus / 'b.txt')])
  model = tok.train_sentencepiece(lines, TINY_VOCAB, prefix)
  return tok.load_tokenizer(model, TINY_VOCAB)


def build_examples(files, tokenizer, max_seq_length=SEQ, short_seq_prob=0.0, seed=0):
  """The examples training packs from the text files `files` (a glob)."""
  config = ml_collections.ConfigDict(dict(train_files=files, max_seq_length=max_seq_length,
                                          short_seq_prob=short_seq_prob, seed=seed))
  return pipeline.build_train_examples(config, tokenizer)


def make_config(corpus, **overrides):
  c = ml_collections.ConfigDict(dict(
      vocab_file='unused', vocab_size=TINY_VOCAB, train_files=str(corpus / 'small.txt'),
      eval_files=str(corpus / 'b.txt'), max_seq_length=SEQ, short_seq_prob=0.1,
      train_batch_size=8, eval_batch_size=8, seed=0))
  c.update(overrides)
  return c


# --- Vocabulary ---------------------------------------------------------------------------


def test_special_tokens_are_ids_0_to_4_in_a_freshly_trained_vocab(tiny_tokenizer):
  assert [tiny_tokenizer.id_to_piece(i) for i in range(5)] == list(tok.SPECIAL_TOKENS)
  assert tiny_tokenizer.vocab_size == TINY_VOCAB
  assert (tiny_tokenizer.pad_id, tiny_tokenizer.unk_id, tiny_tokenizer.cls_id,
          tiny_tokenizer.sep_id, tiny_tokenizer.mask_id) == (0, 1, 2, 3, 4)
  assert tiny_tokenizer.special_ids == (0, 2, 3, 4)


def test_special_tokens_are_ids_0_to_4_in_the_bundled_demo_vocab():
  tk = tok.load_tokenizer(DEMO_MODEL, 8000)
  assert [tk.id_to_piece(i) for i in range(5)] == list(tok.SPECIAL_TOKENS)


@pytest.mark.parametrize('model', ['tiny', 'demo'])
def test_raw_text_never_encodes_to_cls_sep_or_mask(tiny_tokenizer, model):
  tk = tiny_tokenizer if model == 'tiny' else tok.load_tokenizer(DEMO_MODEL)
  ids = tk.encode('[MASK] [CLS] [SEP] [PAD] <mask> Anne [MASK]ed it.')
  ids += sum(tk.encode_batch(['[MASK]', '[CLS][SEP]']), [])
  assert ids and not {2, 3, 4} & set(ids)


def test_encode_batch_matches_encode_and_decode_round_trips(tiny_tokenizer):
  texts = ['Sir Walter Elliot, of Kellynch Hall.', 'Anne was nobody.']
  assert tiny_tokenizer.encode_batch(texts) == [tiny_tokenizer.encode(t) for t in texts]
  assert tiny_tokenizer.decode(tiny_tokenizer.encode(texts[1])) == texts[1]


def test_load_tokenizer_missing_file_says_how_to_build_one(tmp_path):
  with pytest.raises(UserError, match=r"'nope/spm.model' not found.*build_vocab"):
    tok.load_tokenizer('nope/spm.model')


def test_load_tokenizer_vocab_size_mismatch_names_both_numbers(tiny_tokenizer):
  with pytest.raises(UserError) as e:
    tok.load_tokenizer(tiny_tokenizer.model_file, 8000)
  assert '8000' in str(e.value) and f'--config.vocab_size={TINY_VOCAB}' in str(e.value)


def test_load_tokenizer_rejects_a_file_that_is_not_a_sentencepiece_model(tmp_path):
  path = tmp_path / 'spm.model'
  path.write_text('not a model')
  with pytest.raises(UserError, match='not a sentencepiece model'):
    tok.load_tokenizer(str(path))


def test_load_tokenizer_rejects_a_vocab_without_the_special_tokens(corpus, tmp_path):
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  spm.SentencePieceTrainer.train(input=str(corpus / 'a.txt'), model_prefix=str(tmp_path / 'x'),
                                 vocab_size=100, minloglevel=2)
  with pytest.raises(UserError, match=r'at ids 0\.\.4'):
    tok.load_tokenizer(str(tmp_path / 'x.model'))


def _spm_with_user_defined(corpus, tmp_path, unk_id, unk_piece, user_defined) -> str:
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  spm.SentencePieceTrainer.train(input=str(corpus / 'a.txt'), model_prefix=str(tmp_path / 'x'),
                                 vocab_size=100, pad_id=0, pad_piece='[PAD]', unk_id=unk_id,
                                 unk_piece=unk_piece, bos_id=-1, eos_id=-1,
                                 user_defined_symbols=user_defined, minloglevel=2)
  model = str(tmp_path / 'x.model')
  assert tok.MASK_ID in spm.SentencePieceProcessor(model_file=model).encode('a [MASK] b')
  return model


def test_user_defined_special_tokens_load_as_control_symbols_with_their_ids(corpus, tmp_path):
  """spm_train --user_defined_symbols=[CLS],[SEP],[MASK] (a BERT-style recipe): the text
  '[MASK]' encoded to MASK_ID. Loaded, they are control symbols at the same ids: a run trained
  on such a vocabulary keeps its ids, and no raw text encodes to a special id."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  model = _spm_with_user_defined(corpus, tmp_path, 1, '[UNK]', ['[CLS]', '[SEP]', '[MASK]'])
  raw = spm.SentencePieceProcessor(model_file=model)
  loaded = tok.load_tokenizer(model, raw.get_piece_size())
  assert not set(loaded.encode('a [MASK] b [CLS] [SEP] [PAD]')) & set(loaded.special_ids)
  text = 'It is a truth universally acknowledged.'
  assert loaded.encode(text) == raw.encode(text)
  assert [loaded.processor.id_to_piece(i) for i in range(5)] == list(tok.SPECIAL_TOKENS)


def test_an_unk_that_is_not_the_unknown_piece_is_refused(corpus, tmp_path):
  """[UNK] at id 1 as an ordinary piece and the model's unknown piece elsewhere: unknown text
  would get the other id."""
  model = _spm_with_user_defined(corpus, tmp_path, 5, '<unk>',
                                 ['[UNK]', '[CLS]', '[SEP]', '[MASK]'])
  with pytest.raises(UserError, match=re.escape(
      f"vocab_file '{model}' has [UNK] but not as sentencepiece's control (for [UNK]: unknown) "
      'symbols; build one with python -m electra_jax.data.build_vocab')):
    tok.load_tokenizer(model)


def test_a_vocab_file_that_is_a_directory_is_named_as_one(tmp_path):
  with pytest.raises(UserError, match=f"vocab_file '{tmp_path}' is a directory; build one"):
    tok.load_tokenizer(str(tmp_path))


def test_train_sentencepiece_vocab_too_large_for_the_corpus_is_a_user_error(corpus, tmp_path):
  with pytest.raises(UserError, match='50000'):
    tok.train_sentencepiece(sources.vocabulary_lines([str(corpus / 'small.txt')]), 50000,
                            str(tmp_path / 'big'))


def test_relative_paths_resolve_from_the_repo_root_when_not_in_the_cwd(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert tok.load_tokenizer('data/demo_spm.model', 8000).vocab_size == 8000
  assert sources.list_files('data/demo_corpus/eval/*.txt') == [PERSUASION]


def test_relative_paths_in_the_cwd_win_over_the_repo_root(tiny_tokenizer, tmp_path, monkeypatch):
  os.makedirs(tmp_path / 'data')
  shutil.copy(tiny_tokenizer.model_file, tmp_path / 'data' / 'demo_spm.model')
  monkeypatch.chdir(tmp_path)
  assert paths.resolve('data/demo_spm.model') == 'data/demo_spm.model'
  assert tok.load_tokenizer('data/demo_spm.model').vocab_size == TINY_VOCAB


# --- Sources ------------------------------------------------------------------------------


def test_documents_split_on_blank_lines_and_file_boundaries(tmp_path):
  (tmp_path / 'a.txt').write_text('a1\n  a2  \r\n\n \n\nb1\n')
  (tmp_path / 'b.txt').write_text('\ufeffc1\nc2\n\n')
  files = sources.list_files(str(tmp_path / '*.txt'))
  assert list(sources.read_documents(files)) == [['a1', 'a2'], ['b1'], ['c1', 'c2']]


def test_gz_files_are_read_transparently(tmp_path):
  with gzip.open(tmp_path / 'a.txt.gz', 'wt', encoding='utf-8') as f:
    f.write('x1\nx2\n\ny1\n')
  assert list(sources.read_documents([str(tmp_path / 'a.txt.gz')])) == [['x1', 'x2'], ['y1']]


def test_zstandard_files_are_read_transparently_and_a_corrupt_one_is_named(tmp_path):
  """.zst as the Pile and SlimPajama ship it: several concatenated frames."""
  import pyarrow  # pylint: disable=import-outside-toplevel
  with open(tmp_path / 'a.jsonl.zst', 'wb') as f:
    for text in ('x1\nx2', 'y1'):
      sink = pyarrow.BufferOutputStream()
      with pyarrow.CompressedOutputStream(sink, 'zstd') as frame:
        frame.write(json.dumps(dict(text=text)).encode() + b'\n')
      f.write(sink.getvalue().to_pybytes())
  sink = pyarrow.BufferOutputStream()
  with pyarrow.CompressedOutputStream(sink, 'zstd') as frame:
    frame.write(b'z1\n\nz2\n')
  (tmp_path / 'b.txt.zst').write_bytes(sink.getvalue().to_pybytes())
  files = sources.list_files(str(tmp_path / '*.zst'))
  assert list(sources.read_documents(files)) == [['x1', 'x2'], ['y1'], ['z1'], ['z2']]
  (tmp_path / 'c.txt.zst').write_bytes(sink.getvalue().to_pybytes()[:-6])
  with pytest.raises(UserError, match=r"cannot read '.*c.txt.zst': .*runcated"):
    list(sources.read_documents([str(tmp_path / 'c.txt.zst')]))


def test_empty_file_error_names_the_file(tmp_path):
  (tmp_path / 'empty.txt').write_text('\n \n')
  with pytest.raises(UserError, match='empty.txt.* is empty'):
    list(sources.read_documents([str(tmp_path / 'empty.txt')]))


@pytest.mark.parametrize('content,offset', [(b'abc\xff', 3), (b'hello\nab\xe9c\n', 8)])
def test_non_utf8_error_names_the_file_and_byte_offset(tmp_path, content, offset):
  (tmp_path / 'latin1.txt').write_bytes(content)
  with pytest.raises(UserError, match=f'latin1.txt.*not UTF-8.*byte offset {offset}\\)'):
    list(sources.read_documents([str(tmp_path / 'latin1.txt')]))


def test_binary_file_error_names_the_file(tmp_path):
  (tmp_path / 'data.bin').write_bytes(b'text\n\x00\x01\x02')
  with pytest.raises(UserError, match='data.bin.*binary'):
    list(sources.read_documents([str(tmp_path / 'data.bin')]))


@pytest.mark.parametrize('skip_bad_lines', [False, True])
def test_a_compressed_file_read_as_text_is_named_as_such_even_when_skipping_bad_lines(
    tmp_path, skip_bad_lines):
  """Read as lines, skip_bad_lines would drop its text and keep fragments of junk."""
  import bz2  # pylint: disable=import-outside-toplevel
  text = 'It is a truth universally acknowledged.\n' * 200
  (tmp_path / 'a.txt.bz2').write_bytes(bz2.compress(text.encode()))
  (tmp_path / 'b.txt').write_bytes(gzip.compress(text.encode()))
  with pytest.raises(UserError, match=re.escape(
      f"'{tmp_path}/a.txt.bz2' is bzip2-compressed, not text; decompress it")):
    list(sources.read_lines(str(tmp_path / 'a.txt.bz2'), skip_bad_lines))
  with pytest.raises(UserError, match=re.escape(
      f"'{tmp_path}/b.txt' is gzip-compressed, not text; rename it to end in .gz")):
    list(sources.read_lines(str(tmp_path / 'b.txt'), skip_bad_lines))
  (tmp_path / 'b.txt').rename(tmp_path / 'b.txt.gz')
  assert ''.join(sources.read_lines(str(tmp_path / 'b.txt.gz'), skip_bad_lines)) == text


def test_glob_matching_nothing_names_the_pattern(tmp_path):
  with pytest.raises(UserError, match="no files match 'nowhere/\\*.txt'"):
    sources.list_files('nowhere/*.txt')


def test_a_file_named_like_a_glob_or_with_a_comma_names_itself_and_a_directory_is_explained(
    tmp_path):
  for name in ('wiki [2023].txt', 'a,b.txt'):
    (tmp_path / name).write_text('x\n')
  assert sources.list_files(f'{tmp_path}/wiki [2023].txt') == [f'{tmp_path}/wiki [2023].txt']
  assert sources.list_files(f'{tmp_path}/a,b.txt') == [f'{tmp_path}/a,b.txt']
  with pytest.raises(UserError, match=re.escape(
      f"'{tmp_path}' is a directory; pass a glob of its files, e.g. '{tmp_path}/*.txt', or "
      f"'{tmp_path}/**/*.txt' to include subdirectories")):
    sources.list_files(str(tmp_path))


def test_comma_separated_globs_are_sorted_and_deduplicated(tmp_path):
  for name in ('b.txt', 'a.txt', 'c.md'):
    (tmp_path / name).write_text('x\n')
  got = sources.list_files(f'{tmp_path}/b.txt, {tmp_path}/*.txt,{tmp_path}/*.md')
  assert got == [str(tmp_path / n) for n in ('a.txt', 'b.txt', 'c.md')]


def test_one_file_named_two_ways_is_read_once_and_noted_as_training_text(tmp_path,
                                                                        monkeypatch):
  (tmp_path / 'a.txt').write_text('x\n')
  monkeypatch.chdir(tmp_path)
  named_twice = f'a.txt,./a.txt,{tmp_path}/a.txt'
  assert sources.list_files(named_twice) == [str(tmp_path / 'a.txt')]
  c = tiny_config(train_files='a.txt', eval_files=f'{tmp_path}/../{tmp_path.name}/a.txt')
  assert sources.held_out_note(sources.open_corpus(c, 'train').source,
                               sources.open_corpus(c, 'eval')).startswith(
                                   "1 of the eval set's 1 file(s) are training files too")


def write_records(path, docs, key='text', extra=None):
  """docs as JSON Lines, Parquet or Arrow records (by the name), a document's lines joined by
  newlines (one blank line inside each, as paragraphs come in real corpora); .gz paths are
  compressed; Arrow as `datasets` writes it (an IPC stream)."""
  records = [dict(extra or {}, **{key: '\n\n'.join(doc) + '\n'}) for doc in docs]
  if str(path).endswith(('.parquet', '.arrow')):
    # pylint: disable=import-outside-toplevel
    import pyarrow
    import pyarrow.ipc
    import pyarrow.parquet
    table = pyarrow.Table.from_pylist(records)
    if str(path).endswith('.parquet'):
      # Small row groups and batches of 1,024 rows: the reader crosses both.
      pyarrow.parquet.write_table(table, path, row_group_size=3)
      return
    with pyarrow.OSFile(str(path), 'wb') as sink, \
         pyarrow.ipc.new_stream(sink, table.schema) as writer:
      for batch in table.to_batches(max_chunksize=3):
        writer.write_batch(batch)
    return
  opener = gzip.open if str(path).endswith('.gz') else open
  with opener(path, 'wt', encoding='utf-8') as f:
    for record in records:
      f.write(json.dumps(record) + '\n')


@pytest.mark.parametrize('name', ['c4.json.gz', 'corpus.jsonl', 'corpus.ndjson', 'hub.parquet',
                                  'data-00000-of-00001.arrow'])
def test_records_are_documents_of_their_text_lines(tmp_path, name):
  write_records(tmp_path / name, [['a1', ' a2 '], ['b1']], extra={'url': 'u', 'n': 1})
  with open(tmp_path / 'more.txt', 'w', encoding='utf-8') as f:
    f.write('c1\n\nd1\n')
  files = sources.list_files(f'{tmp_path}/{name},{tmp_path}/more.txt')
  docs = list(sources.read_documents(files))
  assert docs == [['a1', 'a2'], ['b1'], ['c1'], ['d1']]  # Files in name order.
  assert list(sources.vocabulary_lines([str(tmp_path / name)])) == ['a1', 'a2', 'b1']


def test_json_lines_read_the_configured_text_key(tmp_path):
  write_records(tmp_path / 'c.jsonl', [['x y'], ['z']], key='body')
  config = ml_collections.ConfigDict(dict(text_key='body', skip_bad_lines=False))
  corpus = sources.open_corpus(config, 'eval', str(tmp_path / 'c.jsonl'))
  assert list(corpus.documents()) == [['x y'], ['z']]
  with pytest.raises(UserError, match=r"c.jsonl' line 1 has no key 'text' \(its keys: body\); "
                                      r'set --config.text_key to the field holding the text, '
                                      r'or set --config.skip_bad_lines=true to skip such records'):
    list(sources.read_documents([str(tmp_path / 'c.jsonl')]))


@pytest.mark.parametrize('line,problem', [
    ('{"text": "a"', r'not JSON \(Expecting'), ('["a"]', 'a JSON list'), ('"a"', 'a JSON str'),
    # Valid JSON that Python's reader refuses: an integer of 5000 digits, 100,000 nested lists.
    ('{"text": "a", "id": ' + '1' * 5000 + '}', r'not JSON Python reads \(Exceeds the limit'),
    ('[' * 100_000, r'not JSON Python reads \(maximum recursion')])
def test_a_json_lines_line_that_is_no_object_is_named_or_skipped(tmp_path, line, problem):
  path = tmp_path / 'bad.jsonl'
  path.write_text('{"text": "ok"}\n\n' + line + '\n{"text": "fine"}\n')
  with pytest.raises(UserError, match=f"bad.jsonl' line 3 is {problem}.*, not an object; "
                                      'write one JSON object per line, or set '
                                      '--config.skip_bad_lines=true'):
    list(sources.read_documents([str(path)]))
  assert list(sources.read_documents([str(path)], skip_bad_lines=True)) == [['ok'], ['fine']]


def test_a_file_whose_every_line_was_skipped_says_so_not_that_it_is_empty(tmp_path):
  """"is empty; fix the glob" sent the user to the wrong fix."""
  latin1 = tmp_path / 'latin1.txt'
  latin1.write_bytes(b'caf\xe9 au lait\nna\xefve\n')
  array = tmp_path / 'array.jsonl'
  array.write_text('[{"text": "a"}, {"text": "b"}]\n')
  for path, message in [
      (latin1, f"every line of '{latin1}' (2) was skipped as not UTF-8 text (skip_bad_lines); "
               'convert it, e.g. iconv -t UTF-8, or leave it out'),
      (array, f"every line of '{array}' (1) was skipped as not a JSON object (skip_bad_lines); "
              'write one JSON object per line (not one JSON array)')]:
    with pytest.raises(UserError, match=re.escape(message)):
      list(sources.read_documents([str(path)], skip_bad_lines=True))


def test_a_json_record_with_half_an_emoji_is_named_or_skipped(tmp_path):
  """A "\\ud83d" escape alone is valid JSON but not text: tokenizers fail on it (TypeError)."""
  path = tmp_path / 'scraped.jsonl'
  path.write_text('{"text": "ok \\ud83d\\ude00"}\n{"text": "cut \\ud83d"}\n{"text": "fine"}\n')
  with pytest.raises(UserError, match=r"scraped.jsonl' line 2 has a lone surrogate \\ud83d in "
                                      r"'text' .*, or set --config.skip_bad_lines=true"):
    list(sources.read_documents([str(path)]))
  assert list(sources.read_documents([str(path)], skip_bad_lines=True)) == [
      ['ok \U0001f600'], ['fine']]


def test_columnar_text_column_problems_are_named_or_skipped(tmp_path):
  import pyarrow  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet  # pylint: disable=import-outside-toplevel
  path = tmp_path / 'hub.parquet'
  pyarrow.parquet.write_table(pyarrow.table({'text': ['ok', None, 'fine'], 'id': [1, 2, 3]}),
                              path)
  with pytest.raises(UserError, match=r"hub.parquet' row 2 has 'text' = null, not text; set "
                                      r'--config.text_key'):
    list(sources.read_documents([str(path)]))
  assert list(sources.read_documents([str(path)], skip_bad_lines=True)) == [['ok'], ['fine']]
  with pytest.raises(UserError, match=r"hub.parquet' column 'id' holds int64, not text"):
    list(sources.read_documents([str(path)], text_key='id'))
  with pytest.raises(UserError, match=r"hub.parquet' has no column 'body' \(its columns: text, "
                                      r'id\); set --config.text_key to the column'):
    list(sources.read_documents([str(path)], text_key='body'))
  (tmp_path / 'not.parquet').write_text('text\n')
  with pytest.raises(UserError, match=r"not.parquet' is not a readable Parquet file \("):
    list(sources.read_documents([str(tmp_path / 'not.parquet')]))
  (tmp_path / 'not.arrow').write_text('text\n')
  with pytest.raises(UserError, match=r"not.arrow' is not a readable Arrow file \("):
    list(sources.read_documents([str(tmp_path / 'not.arrow')]))
  pyarrow.parquet.write_table(pyarrow.table({'text': pyarrow.array([], pyarrow.string())}),
                              tmp_path / 'empty.parquet')
  with pytest.raises(UserError, match=r"empty.parquet' is empty; remove it or fix the glob"):
    list(sources.read_documents([str(tmp_path / 'empty.parquet')]))


@pytest.mark.parametrize('name', ['many.parquet', 'many.arrow'])
def test_columnar_files_stream_every_row_in_order_across_batches_and_row_groups(tmp_path, name):
  """2,500 rows: three of the reader's 1,024-row batches, 834 row groups of 3 (Parquet), 834
  record batches (Arrow); a dictionary-encoded text column (a pandas category) reads too."""
  docs = [[f'r{i}'] for i in range(2500)]
  write_records(tmp_path / name, docs)
  assert list(sources.read_documents([str(tmp_path / name)])) == docs
  import pyarrow  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet  # pylint: disable=import-outside-toplevel
  table = pyarrow.table({'text': pyarrow.array(['a', 'b', 'a']).dictionary_encode()})
  pyarrow.parquet.write_table(table, tmp_path / 'category.parquet')
  assert list(sources.read_documents([str(tmp_path / 'category.parquet')])) == [['a'], ['b'],
                                                                                 ['a']]


def test_record_text_splits_on_newlines_only_as_text_files_do(tmp_path):
  text = 'form\x0cfeed\u2028kept\r\nnext'
  (tmp_path / 'a.txt').write_text(text, encoding='utf-8', newline='')
  write_records(tmp_path / 'a.jsonl', [[text]])
  assert list(sources.read_documents([str(tmp_path / 'a.txt')])) == \
      list(sources.read_documents([str(tmp_path / 'a.jsonl')])) == [['form\x0cfeed\u2028kept',
                                                                     'next']]


def test_a_corrupt_gzip_file_is_named_not_a_traceback(tmp_path):
  with gzip.open(tmp_path / 'a.jsonl.gz', 'wb') as f:
    f.write(b'{"text": "x"}\n' * 1000)
  data = bytearray((tmp_path / 'a.jsonl.gz').read_bytes())
  data[30:40] = b'\xff' * 10
  (tmp_path / 'a.jsonl.gz').write_bytes(bytes(data))
  with pytest.raises(UserError, match=r"cannot read '.*a.jsonl.gz': "):
    list(sources.read_documents([str(tmp_path / 'a.jsonl.gz')]))


def test_a_vocabulary_whose_lines_fail_to_read_reports_the_reading_error(tmp_path):
  def lines():
    yield 'some text'
    raise UserError("cannot read 'gs://b/c.txt': the bucket went away")
  with pytest.raises(UserError) as e:
    tok.train_sentencepiece(lines(), 100, str(tmp_path / 'spm'))
  assert str(e.value) == "cannot read 'gs://b/c.txt': the bucket went away"


def test_json_lines_records_without_text_are_named_or_skipped(tmp_path):
  path = tmp_path / 'null.jsonl'
  path.write_text('{"text": "ok"}\n{"text": null}\n{"text": ["a"]}\n')
  with pytest.raises(UserError, match=r"null.jsonl' line 2 has 'text' = null, not text"):
    list(sources.read_documents([str(path)]))
  assert list(sources.read_documents([str(path)], skip_bad_lines=True)) == [['ok']]
  path.write_text('{"id": 1}\n')
  with pytest.raises(UserError, match="null.jsonl' has no record with text under 'text'"):
    list(sources.read_documents([str(path)], skip_bad_lines=True))


def test_a_record_corpus_packs_the_examples_of_the_same_text_files(corpus, tiny_tokenizer,
                                                                   tmp_path):
  """The format is only how documents are stored: the same documents give the same examples,
  for training (shuffled batches) and evaluation."""
  docs = list(sources.read_documents([str(corpus / 'small.txt'), str(corpus / 'b.txt')]))
  write_records(tmp_path / 'small.jsonl.gz', docs[:2], key='content')
  write_records(tmp_path / 'b.parquet', docs[2:], key='content')
  as_text = make_config(corpus)
  as_json = make_config(corpus, train_files=str(tmp_path / 'small.jsonl.gz'),
                        eval_files=str(tmp_path / 'b.parquet'), text_key='content')
  for make in (pipeline.make_train_iterator, pipeline.make_eval_iterator):
    for want, got in zip(take(make(as_text, tiny_tokenizer), 6),
                         take(make(as_json, tiny_tokenizer), 6), strict=True):
      for name in pipeline.FEATURES:
        np.testing.assert_array_equal(got[name], want[name])
  np.testing.assert_array_equal(pipeline.count_token_frequencies(as_json, tiny_tokenizer),
                                pipeline.count_token_frequencies(as_text, tiny_tokenizer))


def write_line_records(path, docs, key='text'):
  """docs as the Hub's wikitext stores text: a record per line, spaced and newline-ended as
  there, an empty record between documents."""
  lines = [line for doc in docs for line in ['', *(f' {x} \n' for x in doc)]][1:]
  write_records(path, [[line] for line in lines], key=key)


@pytest.mark.parametrize('name', ['wikitext.parquet', 'wikitext.jsonl', 'wikitext.arrow'])
def test_records_are_lines_reads_a_record_per_line_as_the_same_text_file(tmp_path, name,
                                                                          caplog):
  write_line_records(tmp_path / name, [['t1', 'a1', 'a2'], ['b1'], ['c1', 'c2']])
  (tmp_path / 'more.txt').write_text('d1\nd2\n\ne1\n')
  files = [str(tmp_path / name), str(tmp_path / 'more.txt')]
  # A file ends its last document; text files read as always.
  assert list(sources.read_documents(files, records_are_lines=True)) == [
      ['t1', 'a1', 'a2'], ['b1'], ['c1', 'c2'], ['d1', 'd2'], ['e1']]
  assert not caplog.records
  assert list(sources.read_documents(files[:1])) == [  # Without it: a document per record,
      ['t1'], ['a1'], ['a2'], ['b1'], ['c1'], ['c2']]
  assert caplog.records[0].getMessage() == (  # and a warning that says what to set.
      f"2 of the first 8 records of '{files[0]}' are blank: if each record is a line "
      '(wikitext), set --config.records_are_lines=true, or each packs a short example of its own')
  caplog.clear()
  list(sources.vocabulary_lines(files[:1], flags='--'))  # Lines either way: no warning.
  write_records(tmp_path / 'c4.jsonl', [['x'], ['y']] * 10 + [['']])  # 1 in 21: documents.
  assert len(list(sources.read_documents([str(tmp_path / 'c4.jsonl')]))) == 20
  assert not caplog.records


def test_a_line_per_record_corpus_packs_the_examples_of_the_same_text_files(
    corpus, tiny_tokenizer, tmp_path):
  docs = list(sources.read_documents([str(corpus / 'small.txt'), str(corpus / 'b.txt')]))
  write_line_records(tmp_path / 'train.parquet', docs[:2])
  write_line_records(tmp_path / 'eval.jsonl', docs[2:])
  as_text = make_config(corpus)
  as_lines = make_config(corpus, train_files=str(tmp_path / 'train.parquet'),
                         eval_files=str(tmp_path / 'eval.jsonl'), records_are_lines=True)
  for make in (pipeline.make_train_iterator, pipeline.make_eval_iterator):
    for want, got in zip(take(make(as_text, tiny_tokenizer), 6),
                         take(make(as_lines, tiny_tokenizer), 6), strict=True):
      for name in pipeline.FEATURES:
        np.testing.assert_array_equal(got[name], want[name])
  with pytest.raises(UserError, match=r'records_are_lines applies to record files .*not to TFDS'):
    sources.open_corpus(make_config(corpus, tfds_name='wikipedia', records_are_lines=True))


def test_a_record_per_short_line_earns_the_padding_note_until_read_as_lines(
    corpus, tiny_tokenizer, tmp_path):
  """Read as a document each, records that are lines of one text pack an example each, mostly
  padding: train's start-up note says so and names records_are_lines, which fills them."""
  docs = list(sources.read_documents([str(corpus / 'b.txt')]))
  lines = [' '.join(line.split()[:4]) for doc in docs for line in doc]
  write_records(tmp_path / 'lines.jsonl', [[line] for line in lines])
  fills = []
  for records_are_lines in (False, True):
    c = make_config(corpus, train_files=str(tmp_path / 'lines.jsonl'), num_train_steps=10,
                    records_are_lines=records_are_lines)
    examples = pipeline.open_train_examples(c, tiny_tokenizer)
    n, num_tokens = len(examples), examples.num_tokens
    assert num_tokens == int(examples.gather(np.arange(n))['input_mask'].sum())
    fill = num_tokens / (n * SEQ)
    line, notes = pipeline.data_summary(examples, c)
    assert line == (f'data: {n:,} examples, {num_tokens:,} tokens ({fill:.0%} of their {SEQ} '
                    f'positions); 10 steps of 8 read them {80 / n:.1f} times')
    assert n < 80  # More than once.
    fills.append(fill)
    assert [note for note in notes if 'padding' in note] == ([] if records_are_lines else [
        f'the examples fill {fill:.0%} of their {SEQ} positions ({num_tokens / n:.0f} tokens '
        'on average: short documents), so most of every step computes padding; if the records '
        'are lines of longer texts set records_are_lines=True, else pack_across_documents=True '
        '(examples run on into the next document) or a lower max_seq_length'])
  assert fills[0] < pipeline.LOW_FILL < 0.8 < fills[1]
  # Packed across documents, the record-per-line examples fill up too, in fewer examples.
  c = make_config(corpus, train_files=str(tmp_path / 'lines.jsonl'), num_train_steps=10,
                  pack_across_documents=True)
  across = pipeline.open_train_examples(c, tiny_tokenizer)
  assert len(across) < len(lines) and across.num_tokens / (len(across) * SEQ) > 0.8
  assert pipeline.data_summary(across, c)[1] == []


def test_packing_across_documents_runs_examples_on_into_the_next(tiny_tokenizer):
  docs = [['Anne walked.'], ['Emma spoke.'], ['It rained.']]
  ids = [tiny_tokenizer.encode(doc[0]) for doc in docs]
  apart = list(pipeline.iter_examples(docs, tiny_tokenizer, SEQ, 0.0, seed=0))
  across = list(pipeline.iter_examples(docs, tiny_tokenizer, SEQ, 0.0, seed=0,
                                       across_documents=True))
  strip = lambda tokens: [t for t in tokens if t not in (tiny_tokenizer.cls_id,
                                                         tiny_tokenizer.sep_id)]
  assert [strip(tokens) for tokens, _ in apart] == ids
  assert [strip(tokens) for tokens, _ in across] == [sum(ids, [])]


# --- Example packing ----------------------------------------------------------------------


def assert_well_formed(ex, max_len, cls_id=2, sep_id=3, pad_id=0):
  ids, mask, seg = ex['input_ids'], ex['input_mask'], ex['segment_ids']
  assert ids.dtype == mask.dtype == seg.dtype == np.int32
  assert ids.shape == mask.shape == seg.shape and ids.shape[1] == max_len
  for row_ids, row_mask, row_seg in zip(ids, mask, seg):
    n = int(row_mask.sum())
    assert 3 <= n <= max_len
    assert (row_mask[:n] == 1).all() and (row_mask[n:] == 0).all()  # A prefix of ones.
    real = row_ids[:n]
    assert real[0] == cls_id and real[-1] == sep_id and (row_ids[n:] == pad_id).all()
    assert pad_id not in real and cls_id not in real[1:]
    seps = np.flatnonzero(real == sep_id)
    assert len(seps) in (1, 2)
    first_sep = seps[0]
    assert (row_seg[:first_sep + 1] == 0).all() and (row_seg[first_sep + 1:n] == 1).all()
    assert (row_seg[n:] == 0).all()
    if len(seps) == 2:
      assert seps[1] == n - 1 and seps[1] > first_sep + 1  # B is never empty between [SEP]s.


def test_packed_examples_are_well_formed(corpus, tiny_tokenizer):
  for short_seq_prob in (0.0, 0.5):
    ex = build_examples(f'{corpus}/a.txt,{corpus}/b.txt', tiny_tokenizer, SEQ, short_seq_prob,
                        seed=3)
    assert len(ex['input_ids']) > 200
    assert_well_formed(ex, SEQ)


def test_most_examples_are_full_length_when_documents_are_long(corpus, tiny_tokenizer):
  ex = build_examples(f'{corpus}/a.txt', tiny_tokenizer, SEQ, 0.05, seed=0)
  assert (ex['input_mask'].sum(1) == SEQ).mean() > 0.8


def test_short_seq_prob_makes_shorter_targets(corpus, tiny_tokenizer):
  full = build_examples(f'{corpus}/a.txt', tiny_tokenizer, 128, 0.0, seed=0)
  short = build_examples(f'{corpus}/a.txt', tiny_tokenizer, 128, 1.0, seed=0)
  assert len(short['input_ids']) > 1.2 * len(full['input_ids'])


def test_examples_are_consecutive_lines_of_one_document_split_at_a_line_boundary():
  """With line ids 100+k*10.., every example must be whole lines from one document, in order."""
  lines = [list(range(100 + 10 * k, 100 + 10 * k + 3 + k % 5)) for k in range(60)]
  docs = [lines[:25], lines[25:]]
  builder = pipeline.ExampleBuilder(24, 2, 3, 0.2, np.random.default_rng(0))
  examples = []
  for doc in docs:
    for line in doc:
      examples += builder.add_line(line)
    examples += builder.end_document()
  starts = {line[0]: (d, i) for d, doc in enumerate(docs) for i, line in enumerate(doc)}
  for tokens, num_first in examples:
    assert len(tokens) <= 24 and tokens[0] == 2 and tokens[num_first - 1] == 3
    a = tokens[1:num_first - 1]
    b = tokens[num_first:-1]
    d, i = starts[a[0]]
    expected = [t for line in docs[d][i:] for t in line]
    assert a + b == expected[:len(a) + len(b)]  # Consecutive, same document, tail trimmed.
    if b:
      assert b[0] in starts and tokens[-1] == 3  # B starts at a line boundary.
  two_segments = np.mean([num_first < len(tokens) for tokens, num_first in examples])
  assert 0.3 < two_segments < 0.9  # Official: 10 % single-segment, the rest split when possible.
  covered = {t for tokens, _ in examples for t in tokens}
  assert len(covered & {line[0] for line in lines}) > 0.5 * len(lines)


def test_long_lines_are_split_instead_of_dropped():
  builder = pipeline.ExampleBuilder(32, 2, 3, 0.0, np.random.default_rng(0))
  long_line = list(range(10, 110))  # 100 tokens, max_length 32.
  examples = builder.add_line(long_line) + builder.end_document()
  kept = [t for tokens, _ in examples for t in tokens if t >= 10]
  assert len(examples) == 4 and kept == sorted(kept)
  assert len(kept) >= 100 - 2 * 4  # At most [CLS]+[SEP] worth of tokens lost per piece.


def test_example_building_is_deterministic_given_the_seed(corpus, tiny_tokenizer):
  build = lambda seed: build_examples(f'{corpus}/a.txt', tiny_tokenizer, SEQ, 0.1, seed)
  first, again, other = build(7), build(7), build(8)
  for name in pipeline.FEATURES:
    np.testing.assert_array_equal(first[name], again[name])
  assert any(first[n].shape != other[n].shape or (first[n] != other[n]).any()
             for n in pipeline.FEATURES)


def test_a_corpus_without_examples_is_a_user_error(tmp_path, tiny_tokenizer):
  with pytest.raises(UserError, match='no files match'):
    build_examples(str(tmp_path / '*.txt'), tiny_tokenizer, SEQ, 0.0, 0)


# --- Train iterator -----------------------------------------------------------------------


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def row_keys(batch):
  return [tuple(r) for r in np.concatenate([batch[n] for n in pipeline.FEATURES], axis=1)]


def host_rows(batch_size: int, process_count: int) -> dict[str, np.ndarray]:
  """Each host's rows of a global batch (parallel.process_rows): one block per host, or
  interleaved, as jax.make_mesh lays out a TPU slice's hosts along the data axis."""
  rows = np.arange(batch_size)
  return {'blocks': rows.reshape(process_count, -1),
          'interleaved': rows.reshape(-1, process_count).T}


def place(host_batches, rows_of_hosts) -> np.ndarray:
  """The global batch made of each host's batch at its rows (as parallel.global_batch)."""
  merged = np.zeros((sum(map(len, rows_of_hosts)),) + host_batches[0].shape[1:],
                    host_batches[0].dtype)
  for batch, rows in zip(host_batches, rows_of_hosts):
    merged[rows] = batch
  return merged


@pytest.mark.parametrize('layout', ['blocks', 'interleaved'])
@pytest.mark.parametrize('process_count', [2, 4])
def test_host_batches_placed_at_their_rows_equal_the_single_host_batch(
    corpus, tiny_tokenizer, process_count, layout):
  config = make_config(corpus)
  num_examples = len(build_examples(config.train_files, tiny_tokenizer, SEQ,
                                    config.short_seq_prob, config.seed)['input_ids'])
  steps = 12
  assert num_examples < steps * config.train_batch_size / 2  # Crosses epoch boundaries.
  single = take(pipeline.make_train_iterator(config, tiny_tokenizer), steps)
  rows = host_rows(config.train_batch_size, process_count)[layout]
  hosts = [take(pipeline.make_train_iterator(config, tiny_tokenizer, r), steps) for r in rows]
  for step in range(steps):
    for name in pipeline.FEATURES:
      assert all(host[step][name].shape == (8 // process_count, SEQ) for host in hosts)
      merged = place([host[step][name] for host in hosts], rows)
      np.testing.assert_array_equal(merged, single[step][name])


def test_data_workers_called_from_python_give_the_same_batches(corpus, tiny_tokenizer):
  """Outside a command (a notebook, this test) absl flags are unparsed; grain's worker
  processes read one of them."""
  config = make_config(corpus)
  single = take(pipeline.make_train_iterator(config, tiny_tokenizer), 3)
  config.num_data_workers = 1
  with_worker = take(pipeline.make_train_iterator(config, tiny_tokenizer), 3)
  for a, b in zip(single, with_worker):
    for name in pipeline.FEATURES:
      np.testing.assert_array_equal(a[name], b[name])


def test_train_iterator_yields_every_example_once_per_epoch_reshuffled(corpus, tiny_tokenizer):
  config = make_config(corpus)
  examples = build_examples(config.train_files, tiny_tokenizer, SEQ, config.short_seq_prob,
                            config.seed)
  n = len(examples['input_ids'])
  batches = take(pipeline.make_train_iterator(config, tiny_tokenizer), -(-3 * n // 8))
  rows = [r for b in batches for r in row_keys(b)]
  assert_well_formed({k: np.stack([b[k] for b in batches]).reshape(-1, SEQ)
                      for k in pipeline.FEATURES}, SEQ)
  expected = collections.Counter(row_keys(examples))
  epochs = [rows[e * n:(e + 1) * n] for e in range(3)]
  assert all(collections.Counter(epoch) == expected for epoch in epochs)
  assert epochs[0] != epochs[1] != epochs[2]
  assert epochs[0] != row_keys(examples)  # Shuffled, not file order.


def test_seeds_do_not_share_epoch_orders():
  """No (seed, epoch) order repeats another's: grain's shuffle seeds epoch e with seed + e, so
  seed 1 used as given would read seed 0's second epoch first. Seed 0 keeps grain's order."""
  n = 50
  orders = {(seed, epoch): tuple(pipeline.example_order(n, seed)[epoch * n:(epoch + 1) * n])
            for seed in range(6) for epoch in range(6)}
  assert all(sorted(order) == list(range(n)) for order in orders.values())
  assert len(set(orders.values())) == len(orders)
  plain = grain.MapDataset.range(n).shuffle(seed=0).repeat(None)
  assert orders[0, 1] == tuple(plain[n:2 * n])
  # Version 1, which runs checkpointed before resume in: the seed as given.
  plain = grain.MapDataset.range(n).shuffle(seed=3).repeat(None)
  assert tuple(pipeline.example_order(n, 3, order_version=1)[:2 * n]) == tuple(plain[:2 * n])
  with pytest.raises(UserError, match='data order version 3 is newer than this electra_jax'):
    pipeline.example_order(n, 3, order_version=3)


def test_train_iterator_shape_dtype_and_seed_dependence(corpus, tiny_tokenizer):
  config = make_config(corpus)
  batch = next(pipeline.make_train_iterator(config, tiny_tokenizer))
  assert set(batch) == set(pipeline.FEATURES)
  assert all(v.shape == (8, SEQ) and v.dtype == np.int32 for v in batch.values())
  other = next(pipeline.make_train_iterator(make_config(corpus, seed=1), tiny_tokenizer))
  assert (batch['input_ids'] != other['input_ids']).any()


def test_train_iterator_resumes_from_a_global_position(corpus, tiny_tokenizer):
  config = make_config(corpus)
  it = pipeline.make_train_iterator(config, tiny_tokenizer)
  take(it, 3)
  expected = take(it, 3)
  resumed = pipeline.make_train_iterator(config, tiny_tokenizer, start=3 * 8)
  for want, got in zip(expected, take(resumed, 3)):
    for name in pipeline.FEATURES:
      np.testing.assert_array_equal(want[name], got[name])
  # A position inside a batch (after a change of train_batch_size) starts there.
  shifted = next(pipeline.make_train_iterator(config, tiny_tokenizer, start=3 * 8 + 4))
  for name in pipeline.FEATURES:
    np.testing.assert_array_equal(shifted[name][:4], expected[0][name][4:])
    np.testing.assert_array_equal(shifted[name][4:], expected[1][name][:4])


# --- Eval iterator ------------------------------------------------------------------------


@pytest.fixture(scope='module')
def eval_config(corpus, tiny_tokenizer):
  """An eval batch size that leaves a partial last batch."""
  n = len(build_examples(str(corpus / 'b.txt'), tiny_tokenizer, SEQ, 0.0,
                         pipeline.EVAL_SEED)['input_ids'])
  batch = next(b for b in (12, 16, 20, 24, 28) if n % b)
  return make_config(corpus, eval_batch_size=batch), n


def test_eval_iterator_is_deterministic_static_and_zero_padded(eval_config, tiny_tokenizer):
  config, n = eval_config
  b = config.eval_batch_size
  first = list(pipeline.make_eval_iterator(config, tiny_tokenizer))
  again = list(pipeline.make_eval_iterator(config, tiny_tokenizer))
  assert len(first) == -(-n // b)
  for x, y in zip(first, again):
    for name in pipeline.FEATURES:
      assert x[name].shape == (b, SEQ) and x[name].dtype == np.int32
      np.testing.assert_array_equal(x[name], y[name])
  last = first[-1]
  padding = last['input_mask'].sum(1) == 0
  assert padding.sum() == b - n % b and not padding[:n % b].any()
  assert all((last[name][padding] == 0).all() for name in pipeline.FEATURES)
  real = {k: np.concatenate([x[k] for x in first])[:n] for k in pipeline.FEATURES}
  assert_well_formed(real, SEQ)


def test_eval_iterator_respects_num_batches_and_matches_the_full_run(eval_config,
                                                                    tiny_tokenizer):
  config, _ = eval_config
  full = list(pipeline.make_eval_iterator(config, tiny_tokenizer))
  for num_batches in (0, None):
    assert len(list(pipeline.make_eval_iterator(config, tiny_tokenizer,
                                                num_batches=num_batches))) == len(full)
  two = list(pipeline.make_eval_iterator(config, tiny_tokenizer, num_batches=2))
  assert len(two) == 2
  np.testing.assert_array_equal(two[1]['input_ids'], full[1]['input_ids'])
  other = list(pipeline.make_eval_iterator(
      config, tiny_tokenizer, num_batches=1,
      corpus=sources.open_corpus(config, 'eval', config.train_files)))
  assert (other[0]['input_ids'] != full[0]['input_ids']).any()


@pytest.mark.parametrize('layout', ['blocks', 'interleaved'])
def test_eval_host_batches_placed_at_their_rows_equal_the_single_host_batch(
    eval_config, tiny_tokenizer, layout):
  config, _ = eval_config
  single = list(pipeline.make_eval_iterator(config, tiny_tokenizer))
  rows = host_rows(config.eval_batch_size, 2)[layout]
  hosts = [list(pipeline.make_eval_iterator(config, tiny_tokenizer, r)) for r in rows]
  assert len(hosts[0]) == len(hosts[1]) == len(single)
  for step, batch in enumerate(single):
    for name in pipeline.FEATURES:
      merged = place([host[step][name] for host in hosts], rows)
      np.testing.assert_array_equal(merged, batch[name])


def test_token_frequencies_count_real_non_special_eval_tokens(eval_config, tiny_tokenizer):
  config, _ = eval_config
  counts = pipeline.count_token_frequencies(config, tiny_tokenizer)
  assert counts.shape == (TINY_VOCAB,)
  assert (counts[list(tiny_tokenizer.special_ids)] == 0).all()
  ids = np.concatenate([b['input_ids'][b['input_mask'] == 1]
                        for b in pipeline.make_eval_iterator(config, tiny_tokenizer)])
  ids = ids[~np.isin(ids, tiny_tokenizer.special_ids)]
  np.testing.assert_array_equal(counts, np.bincount(ids, minlength=TINY_VOCAB))
  # Over the first batches only (evaluate --num_batches): what those batches hold.
  first = next(pipeline.make_eval_iterator(config, tiny_tokenizer))
  ids = first['input_ids'][first['input_mask'] == 1]
  ids = ids[~np.isin(ids, tiny_tokenizer.special_ids)]
  np.testing.assert_array_equal(
      pipeline.count_token_frequencies(config, tiny_tokenizer,
                                       num_examples=config.eval_batch_size),
      np.bincount(ids, minlength=TINY_VOCAB))


# --- build_vocab CLI ----------------------------------------------------------------------


def run_build_vocab(*flags):
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  return subprocess.run([sys.executable, '-m', 'electra_jax.data.build_vocab', *flags],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_build_vocab_cli_writes_the_model_and_ends_with_a_json_line(corpus, tmp_path):
  proc = run_build_vocab(f'--input={corpus}/a.txt,{corpus}/b.txt', '--vocab_size=250',
                         f'--output={tmp_path}/out/spm')
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  lines = sum(len((corpus / name).read_text(encoding='utf-8').splitlines())
              for name in ('a.txt', 'b.txt'))
  assert summary == {'model': f'{tmp_path}/out/spm.model', 'vocab': f'{tmp_path}/out/spm.vocab',
                     'vocab_size': 250, 'num_input_files': 2, 'num_lines': lines,
                     'num_lines_too_long': 0}
  assert os.path.exists(summary['vocab'])
  tk = tok.load_tokenizer(summary['model'], 250)
  assert [tk.id_to_piece(i) for i in range(5)] == list(tok.SPECIAL_TOKENS)
  # A second vocabulary at the same prefix would change the ids of runs that use the first.
  with open(summary['model'], 'rb') as f:
    first = f.read()
  again = (f'--input={corpus}/small.txt', '--vocab_size=120', f'--output={tmp_path}/out/spm')
  proc = run_build_vocab(*again)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: --output={tmp_path}/out/spm: '{tmp_path}/out/spm.model' exists, and runs that "
      'use it would read the new vocabulary; pass another --output, or --overwrite']
  with open(summary['model'], 'rb') as f:
    assert f.read() == first
  proc = run_build_vocab(*again, '--overwrite')
  assert proc.returncode == 0, proc.stderr
  assert tok.load_tokenizer(summary['model']).vocab_size == 120


def test_a_build_vocab_failed_at_the_model_leaves_no_vocab_file_to_refuse_its_rerun(
    corpus, tmp_path, monkeypatch):
  """The .vocab is written first: a full disk at the .model left it, and the re-run that the
  error line advises was refused as overwriting it."""
  write_bytes = atomic.write_bytes

  def full_at_the_model(path, data):
    if path.endswith('.model'):
      raise UserError(f"writing '{path}' failed (No space left on device)")
    write_bytes(path, data)
  monkeypatch.setattr(atomic, 'write_bytes', full_at_the_model)

  def lines():
    return sources.vocabulary_lines([str(corpus / 'a.txt')])
  with pytest.raises(UserError, match='No space left'):
    tok.train_sentencepiece(lines(), 250, str(tmp_path / 'spm'), num_threads=1)
  assert not os.listdir(tmp_path)
  (tmp_path / 'spm.vocab').write_text('an earlier one')  # Not this run's: kept.
  with pytest.raises(UserError, match='No space left'):
    tok.train_sentencepiece(lines(), 250, str(tmp_path / 'spm'), num_threads=1)
  assert os.listdir(tmp_path) == ['spm.vocab']


def test_a_full_temporary_folder_under_sentencepiece_is_one_error_line(corpus, tmp_path):
  """Sentencepiece writes its model to a temporary folder and reports no failure: a cut model
  was a traceback ('could not parse ModelProto'). A file size limit cuts it as a full disk."""
  flags = (f'--input={corpus}/a.txt,{corpus}/b.txt', '--vocab_size=250',
           f'--output={tmp_path}/new/spm')
  env = dict(os.environ, PYTHONPATH=REPO_ROOT)
  proc = subprocess.run([*under_ulimit('-f', '5'), sys.executable, '-m',  # Files <= 5 KiB.
                         'electra_jax.data.build_vocab', *flags],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert re.fullmatch(r"error: sentencepiece's model in the temporary folder '.*' is unreadable "
                      r'\(a full disk there\?\); free space there or set TMPDIR to a folder with '
                      r'room, then re-run the same command', proc.stderr.strip().splitlines()[-1])
  assert not (tmp_path / 'new').exists()


def test_build_vocab_output_names_a_file_a_prefix_or_a_folder(tmp_path):
  from electra_jax.data import build_vocab  # pylint: disable=import-outside-toplevel
  (tmp_path / 'existing').mkdir()
  for output, prefix in [('v/spm.model', 'v/spm'), ('v/spm.vocab', 'v/spm'), ('v/mine', 'v/mine'),
                         ('new/', 'new/spm'), ('existing', 'existing/spm')]:
    assert build_vocab._prefix(str(tmp_path / output) + ('/' if output.endswith('/') else '')) \
        == str(tmp_path / prefix)  # pylint: disable=protected-access


def test_build_vocab_cli_reads_json_lines_under_text_key(corpus, tmp_path):
  """A JSON Lines corpus trains the vocabulary its text trains (sentencepiece is deterministic
  given its lines)."""
  docs = list(sources.read_documents([str(corpus / 'a.txt')]))
  write_docs(tmp_path / 'a.txt', docs)
  write_records(tmp_path / 'a.jsonl', docs, key='body')
  assert run_build_vocab(f'--input={tmp_path}/a.txt', '--vocab_size=250',
                         f'--output={tmp_path}/text/spm').returncode == 0
  proc = run_build_vocab(f'--input={tmp_path}/a.jsonl', '--vocab_size=250', '--text_key=body',
                         f'--output={tmp_path}/json/spm')
  assert proc.returncode == 0, proc.stderr
  with open(tmp_path / 'text' / 'spm.vocab', 'rb') as f, \
       open(tmp_path / 'json' / 'spm.vocab', 'rb') as g:
    assert f.read() == g.read()
  proc = run_build_vocab(f'--input={tmp_path}/a.jsonl', f'--output={tmp_path}/none/spm')
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      f"error: '{tmp_path}/a.jsonl' line 1 has no key 'text' (its keys: body); set --text_key "
      'to the field holding the text, or set --skip_bad_lines=true to skip such records']


def test_build_vocab_cli_bad_input_is_one_error_line_and_exit_code_2(tmp_path):
  proc = run_build_vocab(f'--input={tmp_path}/none/*.txt', f'--output={tmp_path}/spm')
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [f"error: no files match '{tmp_path}/none/*.txt'; "
                                              'fix the glob (relative paths are tried from the '
                                              'current directory, then the repository root)']
  # One glob of several that matches nothing is a typo, not a part to leave out.
  proc = run_build_vocab(f'--input={WORDS},{tmp_path}/typo*.txt', f'--output={tmp_path}/spm')
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: no files match '{tmp_path}/typo*.txt' (of '{WORDS},{tmp_path}/typo*.txt'); fix "
      'the glob (relative paths are tried from the current directory, then the repository root)']
  assert not (tmp_path / 'spm.model').exists()


def test_build_vocab_counts_the_lines_sentencepiece_leaves_out_and_names_a_corpus_of_only_them(
    tmp_path):
  """Sentencepiece skips lines over 64 KiB without a word: the run says how many, and a corpus
  of nothing else is one line naming them, not sentencepiece's internal error."""
  long_line = 'ωμέγα ' * 12_000  # 132 KB: its Greek is found nowhere else.
  (tmp_path / 'long.txt').write_text(long_line + '\n\n')
  proc = run_build_vocab(f'--input={WORDS},{tmp_path}/long.txt', '--vocab_size=35',
                         f'--output={tmp_path}/v/spm')
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['num_lines'] == 12 and summary['num_lines_too_long'] == 1
  assert 'note: 1 of the 12 lines are over 64 KiB, which sentencepiece leaves out' in proc.stdout
  assert tok.load_tokenizer(summary['model']).encode('ωμέγα')[-1] == tok.UNK_ID
  proc = run_build_vocab(f'--input={tmp_path}/long.txt', '--vocab_size=60',
                         f'--output={tmp_path}/w/spm')
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      'error: --input has no line to train a vocabulary on: its 2 line(s) are blank (1) or '
      'longer than sentencepiece reads (1 over 64 KiB); give it text, one sentence or paragraph '
      'a line']
  assert not (tmp_path / 'w').exists()


WORDS = os.path.join(REPO_ROOT, 'data', 'austen_words.txt')  # 10 lines: 27 to 38 tokens.


def test_build_vocab_cli_bad_output_or_vocab_size_is_one_line_and_leaves_no_folder(tmp_path):
  def error(*flags):
    proc = run_build_vocab(f'--input={WORDS}', *flags)
    assert proc.returncode == 2, proc.stderr
    return proc.stderr.strip().splitlines()

  (tmp_path / 'afile.txt').write_text('mine')
  assert error('--vocab_size=30', f'--output={tmp_path}/afile.txt/v') == [
      f"error: --output (its folder) '{tmp_path}/afile.txt' is a file; pass a directory path"]
  assert error('--vocab_size=30', f'--output={tmp_path}/afile.txt/sub/v') == [
      f"error: cannot create --output (its folder) '{tmp_path}/afile.txt/sub': Not a directory; "
      'pick a writable location']
  assert error('--vocab_size=30', '--max_sentences=-5', f'--output={tmp_path}/new/v') == [
      'error: --max_sentences=-5 must be in [1, 2**31) and --vocab_size=30 below 2**31']
  assert error('--vocab_size=99999999999', f'--output={tmp_path}/new/v') == [
      'error: --max_sentences=2000000 must be in [1, 2**31) and --vocab_size=99999999999 below '
      '2**31']
  # A run's folder (its config.json): its vocabulary copy is its own, --overwrite or not.
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'config.json').write_text('{}')
  assert error('--vocab_size=30', f'--output={tmp_path}/run/', '--overwrite') == [
      f"error: --output={tmp_path}/run/: '{tmp_path}/run' holds a run or a model "
      f"({tmp_path}/run/config.json), whose vocabulary is its own; pass --output in another "
      'folder']
  assert error('--vocab_size=0', f'--output={tmp_path}/new/v') == [
      'error: --vocab_size=0 is too small: it must hold the 5 special tokens plus every distinct '
      'character of the corpus (a few dozen for English text; 8000 is usual)']
  # sentencepiece's own checks name the corpus' bounds; the new folders go again.
  assert error('--vocab_size=6', f'--output={tmp_path}/new/sub/v') == [
      'error: --vocab_size=6 is less than this corpus needs (its characters and the special '
      'tokens: 27); use 27 or more']
  assert error('--vocab_size=100', f'--output={tmp_path}/new/sub/v') == [
      'error: --vocab_size=100 is more than this corpus supports (at most 38); use 38 or '
      'fewer, or more text']
  assert sorted(os.listdir(tmp_path)) == ['afile.txt', 'run']
  assert os.listdir(tmp_path / 'run') == ['config.json']
  # An --output naming the .model file is its prefix.
  proc = run_build_vocab(f'--input={WORDS}', '--vocab_size=38', f'--output={tmp_path}/v.model')
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout.strip().splitlines()[-1])['vocab'] == f'{tmp_path}/v.vocab'
  assert sorted(os.listdir(tmp_path)) == ['afile.txt', 'run', 'v.model', 'v.vocab']


def held_out_note(config):
  return sources.held_out_note(sources.training_source(config),
                               sources.open_corpus(config, 'eval'))


def test_an_eval_set_of_training_text_earns_a_note(corpus, tiny_tokenizer):
  apart = make_config(corpus)  # small.txt for training, b.txt held out.
  assert held_out_note(apart) is None
  same = make_config(corpus, train_files=f'{corpus}/*.txt', eval_files=str(corpus / 'b.txt'))
  # Training compares the source its examples carry, read once at start-up.
  trained_on = pipeline.open_train_examples(same, tiny_tokenizer).source
  assert trained_on == sources.training_source(same)
  assert trained_on['files'] == [str(corpus / f) for f in ('a.txt', 'b.txt', 'small.txt')]
  assert held_out_note(same) == (
      f"1 of the eval set's 1 file(s) are training files too ('{corpus}/b.txt'): its metrics are "
      'not of held-out text; point eval_files at text training never reads')
  # evaluate notes it too, but training data it cannot read (another machine's) stops nothing.
  from electra_jax import evaluate  # pylint: disable=import-outside-toplevel
  assert evaluate._held_out_note(same, sources.open_corpus(same, 'eval')) == held_out_note(same)
  moved = make_config(corpus, train_files='/moved/*.txt')
  with pytest.raises(UserError, match='no files match'):
    held_out_note(moved)
  assert evaluate._held_out_note(moved, sources.open_corpus(moved, 'eval')) is None


def test_an_eval_file_reached_through_a_symlink_is_still_training_text(corpus, tmp_path):
  (tmp_path / 'link').symlink_to(corpus, target_is_directory=True)
  linked = make_config(corpus, train_files=f'{corpus}/*.txt',
                       eval_files=str(tmp_path / 'link' / 'b.txt'))
  assert held_out_note(linked).startswith(
      f"1 of the eval set's 1 file(s) are training files too ('{tmp_path}/link/b.txt')")
