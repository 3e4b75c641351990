"""Token tagging: CoNLL files, word-first-piece features, conlleval's chunk F1, and the run end
to end (fine-tune, predict, export to transformers' ElectraForTokenClassification)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError
from electra_jax.finetune import features, loop, metrics, predictions, tasks
from tests.conftest import REPO_ROOT
from tests.test_finetune import pretrain_workdir  # noqa: F401  pylint: disable=unused-import
# pylint: disable-next=unused-import
from tests.test_finetune import VOCAB, bert_layout_vocab  # noqa: F401

CONLL = '''-DOCSTART- -X- -X- O

Mr. NNP B-NP O
Knightley NNP I-NP B-PER
came VBD B-VP O
. . O O

Jane NNP B-NP B-PER
Fairfax NNP I-NP I-PER
smiled VBD B-VP O
'''


def test_conll_files_read_as_sentences_of_words_and_tag_ids(tmp_path):
  (tmp_path / 'train.txt').write_text(CONLL)
  sentences = tasks.read_conll(str(tmp_path / 'train.txt'))
  assert sentences == [(['Mr.', 'Knightley', 'came', '.'], ['O', 'B-PER', 'O', 'O'], 0),
                       (['Jane', 'Fairfax', 'smiled'], ['B-PER', 'I-PER', 'O'], 1)]
  task = tasks.tagging_task(sentences)
  assert task.label_names == ('B-PER', 'I-PER', 'O') and task.main_metric == 'f1'
  examples = tasks.tagging_examples(task, sentences, 'train.txt')
  assert examples[1] == dict(words=['Jane', 'Fairfax', 'smiled'], label=[0, 1, 2], index=1)
  # POS-like tags are no spans: word accuracy is the main metric.
  assert tasks.named_tagging_task(('NN', 'VBD')).metric_names == ('accuracy',)
  # A file to predict has words only.
  (tmp_path / 'words.txt').write_text('Emma\nsmiled\n\nHarriet\n')
  untagged = tasks.read_conll(str(tmp_path / 'words.txt'), need_label=False)
  assert tasks.tagging_examples(task, untagged, 'words.txt')[1]['label'] is None
  with pytest.raises(UserError, match='has no tags'):
    tasks.read_conll(str(tmp_path / 'words.txt'))
  (tmp_path / 'mixed.txt').write_text('Emma B-PER\nsmiled\n')
  with pytest.raises(UserError, match=r"mixed.txt' line 2 has 1 column\(s\) where the file's "
                                      r'first word has 2'):
    tasks.read_conll(str(tmp_path / 'mixed.txt'))
  (tmp_path / 'eval.txt').write_text('Emma B-LOC\n')
  with pytest.raises(UserError, match=r"sentence 1 uses tag\(s\) \['B-LOC'\] the training.*; "
                                      'the model cannot predict them: remove such sentences'):
    tasks.tagging_examples(task, tasks.read_conll(str(tmp_path / 'eval.txt')), 'eval.txt')
  # Lines end at \n, \r\n or \r; a form feed or U+2028 within one is space, not a line end
  # (splitlines() cut the sentence in two and shifted every later sentence's index).
  (tmp_path / 'breaks.txt').write_bytes(
      'Mr. O\r\nDarcy B-PER\u2028\rsaid O\x0c\n\nEmma B-PER\n'.encode('utf-8'))
  assert tasks.read_conll(str(tmp_path / 'breaks.txt')) == [
      (['Mr.', 'Darcy', 'said'], ['O', 'B-PER', 'O'], 0), (['Emma'], ['B-PER'], 1)]
  from electra_jax.finetune import loop  # pylint: disable=import-outside-toplevel
  from tests.test_finetune import ft_config  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match=r'config.task=tagging needs --config.train_file=PATH '
                                      r'\(CoNLL format'):
    loop.load_data(ft_config(task='tagging'), tasks.get_task('tagging'), None)
  (tmp_path / 'one.txt').write_text('Emma O\n')
  with pytest.raises(UserError, match='single tag'):
    tasks.tagging_task(tasks.read_conll(str(tmp_path / 'one.txt')))


def test_prediction_files_keep_words_in_any_script_as_written(tmp_path):
  """The .jsonl beside the .conll is UTF-8 text a person reads: `Zoë`, `東京`, not \\u escapes."""
  task = tasks.Task(name='file', kind=tasks.TAGGING, main_metric='f1', num_epochs=1,
                    label_names=('O', 'B-LOC'))
  words = ['Zoë', 'flew', 'to', '東京']
  part = predictions.Part('test', [dict(words=words, label=[0, 0, 0, 1], index=0)], True)
  predictions.write_part(str(tmp_path), task, part, {}, decoded=[['O', 'O', 'O', 'B-LOC']])
  text = (tmp_path / 'test.jsonl').read_text(encoding='utf-8')
  assert '"Zoë"' in text and '"東京"' in text
  assert json.loads(text)['words'] == words
  assert (tmp_path / 'test.conll').read_text(encoding='utf-8').startswith('Zoë\tO\n')


def test_words_holding_whitespace_stay_one_column_of_the_conll_file(tmp_path):
  """A JSON Lines file's words may hold spaces (or be empty); each stays one column, so the
  .conll reads back (conlleval's way, read_conll's) as the same sentence and tags."""
  task = tasks.Task(name='file', kind=tasks.TAGGING, main_metric='f1', num_epochs=1,
                    label_names=('O', 'B-LOC', 'I-LOC'))
  words = ['New York', 'to', '', 'Ulan\u00a0Bator']
  tags = ['B-LOC', 'O', 'O', 'B-LOC']
  part = predictions.Part('test', [dict(words=words, label=None, index=0)], False)
  predictions.write_part(str(tmp_path), task, part, {}, decoded=[tags])
  (sentence,) = tasks.read_conll(str(tmp_path / 'test.conll'))
  assert sentence[:2] == (['New_York', 'to', '_', 'Ulan_Bator'], tags)
  assert json.loads((tmp_path / 'test.jsonl').read_text(encoding='utf-8'))['words'] == words


def test_hub_style_tagged_records_read_as_the_same_conll_file(tmp_path):
  """The Hub's conll2003 as Parquet (tokens, ner_tags as ids of a ClassLabel list in the
  schema's metadata), and JSON Lines with tag names, read as the equivalent CoNLL file; a file
  to predict needs only its words."""
  # pylint: disable=import-outside-toplevel
  import pyarrow
  import pyarrow.parquet
  (tmp_path / 'train.txt').write_text(CONLL)
  want = tasks.read_tagged_file(str(tmp_path / 'train.txt'), 'file')
  names = ['O', 'B-PER', 'I-PER']
  features = dict(tokens=dict(feature=dict(dtype='string', _type='Value'), _type='List'),
                  ner_tags=dict(feature=dict(names=names, _type='ClassLabel'), _type='List'),
                  id=dict(dtype='string', _type='Value'))
  table = pyarrow.table(dict(tokens=[w for w, _, _ in want], id=['0', '1'],
                             ner_tags=[[names.index(t) for t in tags] for _, tags, _ in want]))
  pyarrow.parquet.write_table(table.replace_schema_metadata(
      {b'huggingface': json.dumps(dict(info=dict(features=features)))}),
      tmp_path / 'train.parquet')
  ner = tasks.FileColumns(label='ner_tags')
  assert tasks.read_tagged_file(str(tmp_path / 'train.parquet'), 'file', columns=ner) == want
  assert tasks.read_tagged_file(str(tmp_path / 'train.parquet'), 'bioes', columns=ner) == \
      tasks.read_tagged_file(str(tmp_path / 'train.txt'), 'bioes')
  with open(tmp_path / 'train.jsonl', 'w', encoding='utf-8') as f:
    for words, tags, _ in want:
      f.write(json.dumps(dict(words=words, tags=tags)) + '\n')
  named = tasks.FileColumns(('words',), 'tags')
  assert tasks.read_tagged_file(str(tmp_path / 'train.jsonl'), 'file', columns=named) == want
  assert tasks.read_tagged_file(str(tmp_path / 'train.jsonl'), 'file', need_label=False,
                                columns=tasks.FileColumns(('words',))) == [
                                    (words, None, i) for words, _, i in want]
  with pytest.raises(UserError, match=r"train.parquet' lacks column\(s\) label \(has \['id', "
                                      r"'ner_tags', 'tokens'\]\); name the words and tags "):
    tasks.read_tagged_file(str(tmp_path / 'train.parquet'), 'file')
  pyarrow.parquet.write_table(table, tmp_path / 'ids.parquet')  # No names in its metadata.
  with pytest.raises(UserError, match=r"ids.parquet' record 1: 'ner_tags' is not a list of one "
                                      r"tag name per word \(ids need the file's ClassLabel"):
    tasks.read_tagged_file(str(tmp_path / 'ids.parquet'), 'file', columns=ner)


def test_a_conll_line_of_another_column_count_than_the_first_is_a_bad_line(tmp_path, caplog):
  """`New York<TAB>B-LOC` in a file of word and tag splits into three columns: it is named (or
  its sentence skipped with skip_bad_rows), never read as the word `New` with `York` lost; the
  same for two columns among CoNLL-2003's four."""
  path = tmp_path / 'train.txt'
  path.write_text('Elizabeth\tB-PER\nwent\tO\nto\tO\nNew York\tB-LOC\n\nDarcy\tB-PER\n'
                  'smiled\tO\n')
  with pytest.raises(UserError, match=r"train.txt' line 4 has 3 column\(s\) where the file's "
                                      r'first word has 2; .*skip_bad_rows=true'):
    tasks.read_conll(str(path), skip_bad_rows=False)
  with caplog.at_level('WARNING'):
    assert tasks.read_conll(str(path), skip_bad_rows=True) == [
        (['Darcy', 'smiled'], ['B-PER', 'O'], 1)]
  assert 'skipped 1 sentence(s)' in caplog.records[-1].getMessage()
  (tmp_path / 'conll.txt').write_text(CONLL.replace('came VBD B-VP O', 'came O'))
  with pytest.raises(UserError, match=r"conll.txt' line 5 has 2 column\(s\) where the file's "
                                      r'first word has 4'):
    tasks.read_conll(str(tmp_path / 'conll.txt'))


def test_tagging_examples_and_predictions_name_their_input_records_whatever_was_skipped(
    tmp_path, caplog):
  """An example's index is its record's (its sentence's in a CoNLL file): a record without words
  is skipped with a warning, and one skipped by skip_bad_rows too, and the predictions' .jsonl
  names each input record, not its place among the kept ones."""
  from electra_jax.finetune import saved_run  # pylint: disable=import-outside-toplevel
  from tests.test_finetune import ft_config  # pylint: disable=import-outside-toplevel
  path = tmp_path / 'input.jsonl'
  path.write_text('{"tokens": ["Elizabeth", "smiled"]}\n{"tokens": []}\n'
                  '{"tokens": ["Darcy", "left", "."]}\n')
  task = tasks.named_tagging_task(('B-PER', 'O'))
  run = saved_run.FinetunedRun(workdir='', config=ft_config(task='tagging'), task=task,
                               model_config=None, network=None, tokenizer=None, runs=[])
  with caplog.at_level('WARNING'):
    part = predictions.file_part(run, str(path))
  assert [(e['index'], e['words']) for e in part.examples] == [
      (0, ['Elizabeth', 'smiled']), (2, ['Darcy', 'left', '.'])]
  assert caplog.records[-1].getMessage() == (
      f"skipped 1 record(s) of '{path}' without words (an empty 'tokens' list): nothing to tag")
  predictions.write_part(str(tmp_path), task, part, {},
                         decoded=[['B-PER', 'O'], ['B-PER', 'O', 'O']])
  written = [json.loads(line) for line in (tmp_path / 'input.jsonl').read_text().splitlines()]
  assert [(w['index'], w['words'][0]) for w in written] == [(0, 'Elizabeth'), (2, 'Darcy')]
  # A record skipped with skip_bad_rows, or a CoNLL sentence, keeps the later ones' numbers.
  path.write_text('{"tokens": ["Emma"], "tags": ["B-PER"]}\n{"tokens": ["Jane"], "tags": []}\n'
                  '{"tokens": ["Harriet", "wept"], "tags": ["B-PER", "O"]}\n')
  sentences = tasks.read_tagged_file(str(path), 'file', columns=tasks.FileColumns(label='tags'),
                                     skip_bad_rows=True)
  assert [e['index'] for e in tasks.tagging_examples(task, sentences, str(path))] == [0, 2]
  (tmp_path / 'train.txt').write_text(CONLL.replace('came VBD B-VP O', 'came'))
  sentences = tasks.read_conll(str(tmp_path / 'train.txt'), skip_bad_rows=True)
  with pytest.raises(UserError, match=r"train.txt' sentence 2 uses tag\(s\) \['I-PER'\]"):
    tasks.tagging_examples(task, sentences, str(tmp_path / 'train.txt'))
  assert [e['index'] for e in tasks.tagging_examples(tasks.tagging_task(sentences), sentences,
                                                     'train.txt')] == [1]


def test_skip_bad_rows_drops_tagging_sentences_it_cannot_read_and_counts_them(tmp_path, caplog):
  """A CoNLL line of another column count (here a word whose tag went missing), or a record
  whose tags do not match its words, fails naming it and the option; with the option its
  sentence is dropped, counted in the log, and fine-tuning reads the rest."""
  (tmp_path / 'train.txt').write_text(CONLL.replace('came VBD B-VP O', 'came'))
  with pytest.raises(UserError, match=r"train.txt' line 5 has 1 column\(s\) where the file's .*"
                                      r'or set --config.skip_bad_rows=true to skip such rows'):
    tasks.read_conll(str(tmp_path / 'train.txt'), skip_bad_rows=False)
  with caplog.at_level('WARNING'):
    assert tasks.read_conll(str(tmp_path / 'train.txt'), skip_bad_rows=True) == [
        (['Jane', 'Fairfax', 'smiled'], ['B-PER', 'I-PER', 'O'], 1)]
  assert caplog.records[-1].getMessage() == (
      f"skipped 1 sentence(s) of '{tmp_path / 'train.txt'}' with a line of another column count "
      '(skip_bad_rows)')
  with pytest.raises(UserError, match=r"file's first word has 4; give every line the same "
                                      r'columns \(a word without spaces and its tag; a file to '
                                      r'predict: words alone\)$'):
    tasks.read_conll(str(tmp_path / 'train.txt'))  # predict: skipping not offered.
  with open(tmp_path / 'train.jsonl', 'w', encoding='utf-8') as f:
    for words, tags in [(['Emma', 'smiled'], ['B-PER', 'O']), (['Harriet', 'wept'], ['B-PER']),
                        (['Frank', 'Churchill', 'left'], ['B-PER', 'I-PER', 'O'])]:
      f.write(json.dumps(dict(tokens=words, ner_tags=tags)) + '\n')
  ner = tasks.FileColumns(label='ner_tags')
  with pytest.raises(UserError, match=r"record 2: 'ner_tags' is not a list of one tag name per "
                                      r'word .*or set --config.skip_bad_rows=true'):
    tasks.read_tagged_file(str(tmp_path / 'train.jsonl'), 'file', columns=ner,
                           skip_bad_rows=False)
  from tests.test_finetune import ft_config  # pylint: disable=import-outside-toplevel
  c = ft_config(task='tagging', train_file=str(tmp_path / 'train.jsonl'),
                eval_file=str(tmp_path / 'train.txt'), label_column='ner_tags',
                skip_bad_rows=True)
  data = loop.load_data(c, tasks.get_task('tagging'), tokenizer_lib.load_tokenizer(VOCAB))
  assert [e['words'] for e in data.evals[0].examples] == [['Jane', 'Fairfax', 'smiled']]
  assert data.task.label_names == ('B-PER', 'I-PER', 'O')  # Of the two readable records.
  assert len(data.train['input_ids']) == 2


def test_bioes_encoding_keeps_the_chunks_as_the_official_tagging_code_trains_them(tmp_path):
  assert tasks.to_bioes(['B-PER', 'I-PER', 'O', 'B-LOC', 'I-PER', 'I-PER', 'I-PER']) == [
      'B-PER', 'E-PER', 'O', 'S-LOC', 'B-PER', 'I-PER', 'E-PER']
  assert tasks.to_bioes(['I-ORG', 'O', 'I-ORG', 'I-ORG']) == ['S-ORG', 'O', 'B-ORG', 'E-ORG']
  bioes = ['S-PER', 'B-ORG', 'I-ORG', 'E-ORG', 'O']
  assert tasks.to_bioes(bioes) == bioes
  ner = tasks.encoded_task(tasks.get_task('conll2003'), 'bioes')
  assert len(ner.label_names) == 17 and {'S-MISC', 'E-LOC', 'O'} <= set(ner.label_names)
  with pytest.raises(UserError, match=r"tag_encoding='bioes' re-encodes span tags .* task "
                                      r"conll2003_pos has"):
    tasks.encoded_task(tasks.get_task('conll2003_pos'), 'bioes')
  # A file run learns every BIOES tag of its training file's types, as a TFDS task does (not
  # only those its training chunks give); its eval tags are re-encoded too.
  from electra_jax.finetune import loop  # pylint: disable=import-outside-toplevel
  from tests.test_finetune import ft_config  # pylint: disable=import-outside-toplevel
  (tmp_path / 'train.txt').write_text(CONLL)
  c = ft_config(task='tagging', train_file=str(tmp_path / 'train.txt'),
                eval_file=str(tmp_path / 'train.txt'), tag_encoding='bioes')
  data = loop.load_data(c, tasks.get_task('tagging'), tokenizer_lib.load_tokenizer(VOCAB))
  assert data.task.label_names == ('B-PER', 'E-PER', 'I-PER', 'O', 'S-PER')
  assert [data.task.label_names[t] for t in data.evals[0].examples[1]['label']] == [
      'B-PER', 'E-PER', 'O']
  # Names of two words in training, one in evaluation: S-PER is a tag to learn and to read.
  (tmp_path / 'two.txt').write_text('Anne B-PER\nElliot I-PER\nwalked O\n')
  (tmp_path / 'one.txt').write_text('Anne B-PER\nwalked O\n')
  c.update(dict(train_file=str(tmp_path / 'two.txt'), eval_file=str(tmp_path / 'one.txt')))
  task, _, evals = loop.read_examples(c, tasks.get_task('tagging'))
  assert task.label_names == ('B-PER', 'E-PER', 'I-PER', 'O', 'S-PER')
  assert [task.label_names[t] for t in evals[0][1][0]['label']] == ['S-PER', 'O']
  (tmp_path / 'pos.txt').write_text('Emma NNP\nsmiled VBD\n')
  with pytest.raises(UserError, match=r"pos.txt' has \['NNP', 'VBD'\]; use tag_encoding='file'"):
    c.train_file = str(tmp_path / 'pos.txt')
    loop.load_data(c, tasks.get_task('tagging'), None)


def test_chunks_and_their_f1_are_counted_as_conlleval_counts_them():
  # IOB2, IOB1 (a chunk may start with I) and BIOES read alike.
  assert metrics.tag_spans(['B-PER', 'I-PER', 'O', 'B-LOC']) == {(0, 2, 'PER'), (3, 4, 'LOC')}
  assert metrics.tag_spans(['I-PER', 'I-PER', 'I-LOC', 'O', 'I-PER']) == {
      (0, 2, 'PER'), (2, 3, 'LOC'), (4, 5, 'PER')}
  assert metrics.tag_spans(['S-PER', 'B-ORG', 'E-ORG', 'E-ORG', 'U-LOC']) == {
      (0, 1, 'PER'), (1, 3, 'ORG'), (3, 4, 'ORG'), (4, 5, 'LOC')}
  assert metrics.tag_spans(['B-PER', 'B-PER']) == {(0, 1, 'PER'), (1, 2, 'PER')}
  gold = [['B-PER', 'I-PER', 'O', 'B-LOC'], ['O', 'B-PER']]
  # One chunk right, one cut short (wrong), one missed, one extra: P 1/3, R 1/3.
  predicted = [['B-PER', 'O', 'O', 'B-LOC'], ['B-LOC', 'O']]
  result = metrics.tagging_metrics(gold, predicted, spans=True)
  assert (result['precision'], result['recall']) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
  assert result['f1'] == pytest.approx(1 / 3) and result['accuracy'] == pytest.approx(3 / 6)
  # Two of three chunks found, none extra: P 1, R 2/3, F1 0.8.
  predicted = [['B-PER', 'I-PER', 'O', 'B-LOC'], ['O', 'O']]
  result = metrics.tagging_metrics(gold, predicted, spans=True)
  assert (result['precision'], result['recall'], result['f1']) == (
      1.0, pytest.approx(2 / 3), pytest.approx(0.8))
  assert metrics.tagging_metrics(gold, [['O'] * 4, ['O'] * 2], spans=True)['f1'] == 0.0


@pytest.fixture(scope='module', params=['sentencepiece', 'wordpiece'])
def hf_tokenizer_pair(request, tmp_path_factory, bert_layout_vocab):  # noqa: F811
  """Our tokenizer and transformers' of the same vocabulary (as export writes it)."""
  transformers = pytest.importorskip('transformers')
  from electra_jax.hf import tokenizer_files  # pylint: disable=import-outside-toplevel
  vocab = VOCAB if request.param == 'sentencepiece' else bert_layout_vocab
  directory = str(tmp_path_factory.mktemp('tok'))
  tokenizer_files.write_tokenizer(vocab, directory, 512)
  return (tokenizer_lib.load_tokenizer(vocab),
          transformers.AutoTokenizer.from_pretrained(directory))


def test_each_tag_sits_at_its_words_first_piece_as_in_transformers_split_words(
    hf_tokenizer_pair):
  ours, theirs = hf_tokenizer_pair
  words = ['Mr.', 'Knightley', 'was', 'extraordinarily', 'agreeable', ',', 'said', 'Emma', '.']
  example = dict(words=words, label=list(range(len(words))), index=0)
  f = features.encode_tagging(ours, [example], 32, doc_stride=15)
  encoded = theirs(words, is_split_into_words=True)
  n = len(encoded['input_ids'])
  assert f['input_ids'].shape == (1, 32) and f['example_index'].tolist() == [0]
  assert f['input_ids'][0, :n].tolist() == encoded['input_ids']
  assert f['input_mask'][0].sum() == n and not f['segment_ids'].any()
  word_ids = encoded.word_ids()
  firsts = [i for i, w in enumerate(word_ids) if w is not None and word_ids[i - 1] != w]
  assert np.flatnonzero(f['word_start'][0]).tolist() == firsts
  assert np.flatnonzero(f['word_is_max_context'][0]).tolist() == firsts
  assert f['label'][0, firsts].tolist() == list(range(len(words)))
  assert f['word_index'][0, firsts].tolist() == list(range(len(words)))


def test_the_official_tagging_head_has_no_dropout_and_feeds_segment_1():
  """tag_head='official' is the official tagging code's: every real token in segment 1 and
  the linear layer alone; 'transformers' (ElectraForTokenClassification) drops out its input."""
  import jax  # pylint: disable=import-outside-toplevel
  from electra_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from electra_jax import model as model_lib  # pylint: disable=import-outside-toplevel
  from tests.conftest import tiny_config  # pylint: disable=import-outside-toplevel
  tokenizer = tokenizer_lib.load_tokenizer(VOCAB)
  example = dict(words=['Emma', 'smiled', '.'], label=[1, 0, 0], index=0)
  f = features.encode_tagging(tokenizer, [example], 16, doc_stride=8, segment_id=1)
  np.testing.assert_array_equal(f['segment_ids'], f['input_mask'])
  assert f['input_mask'][0].sum() < 16
  cfg = model_lib.ModelConfig.from_config(config_lib.resolve(tiny_config(
      vocab_size=tokenizer.vocab_size, dropout_rate=0.5)))
  task = tasks.named_tagging_task(('B-X', 'O'))
  hidden = jax.random.normal(jax.random.key(2), (1, 16, cfg.hidden_size))
  for tag_head, drops in (('official', False), ('transformers', True)):
    head = loop.make_model(task, cfg, tag_head=tag_head).head
    params = head.init(jax.random.key(0), hidden, f['input_mask'], True)
    train = head.apply(params, hidden, f['input_mask'], False,
                       rngs={'dropout': jax.random.key(1)})
    test = head.apply(params, hidden, f['input_mask'], True)
    assert (not np.allclose(train, test)) == drops, tag_head


@pytest.mark.parametrize('doc_stride', [1, 3, 8, 100])
def test_a_sentence_longer_than_the_window_is_read_in_windows_each_word_once(doc_stride):
  tokenizer = tokenizer_lib.load_tokenizer(VOCAB)
  words = ('Mr. Knightley was extraordinarily agreeable , said Emma , and Harriet Smith '
           'thought so too , though she never said it .').split()
  short = dict(words=['Emma', 'smiled', '.'], label=[1, 0, 0], index=0)
  example = dict(words=words, label=list(range(len(words))), index=1)
  length = 10  # [CLS] + 8 pieces + [SEP]
  f = features.encode_tagging(tokenizer, [short, example], length, doc_stride)
  pieces = [list(p) for p in tokenizer.encode_batch(words)]
  flat = [i for p in pieces for i in p]
  rows = np.flatnonzero(f['example_index'] == 1)
  assert f['example_index'].tolist() == [0] + [1] * len(rows) and len(rows) > 1
  # Every window is [CLS] + consecutive pieces of the sentence + [SEP], starting every
  # min(doc_stride, 8) pieces; the last reaches the end.
  stride = min(doc_stride, length - 2)
  for w, row in enumerate(rows):
    n = f['input_mask'][row].sum()
    assert f['input_ids'][row, 0] == tokenizer.cls_id
    assert f['input_ids'][row, n - 1] == tokenizer.sep_id
    assert f['input_ids'][row, 1:n - 1].tolist() == flat[w * stride:w * stride + n - 2]
  assert w * stride + n - 2 == len(flat)
  # Each word is trained on wherever its first piece is, and read exactly once, at its label.
  read = [(f['word_index'][r, p], f['label'][r, p])
          for r in rows for p in np.flatnonzero(f['word_is_max_context'][r])]
  assert sorted(read) == [(j, j) for j in range(len(words))]
  assert (f['word_is_max_context'] <= f['word_start']).all()
  assert f['word_start'][rows].sum() >= len(words)
  # ... from the window where its first piece has the most context on its shorter side.
  def context(row, word):
    position = np.flatnonzero((f['word_index'][row] == word) & (f['word_start'][row] > 0))
    if not len(position):
      return -1
    return min(position[0] - 1, f['input_mask'][row].sum() - 2 - position[0])
  for r in rows:
    for p in np.flatnonzero(f['word_is_max_context'][r]):
      word = f['word_index'][r, p]
      assert context(r, word) == max(context(other, word) for other in rows)
  # Decoding reads each word's tag from that window.
  task = tasks.Task(name='t', kind=tasks.TAGGING, main_metric='accuracy', num_epochs=1,
                    label_names=tuple(f'T{j}' for j in range(len(words))))
  elsewhere = np.where(f['word_is_max_context'] > 0, f['label'], 0)  # T0 where not read.
  tags = loop.word_tags(task, f, dict(prediction=elsewhere), [short, example])
  assert tags == [['T1', 'T0', 'T0'], [f'T{j}' for j in range(len(words))]]


def _write_names(path, n, seed):
  """A toy tagging set a tiny model learns in a few epochs: names are the capitalised words."""
  rng = np.random.default_rng(seed)
  names = ['Emma', 'Harriet', 'Knightley', 'Elton', 'Jane', 'Fairfax']
  filler = ['the', 'walk', 'was', 'long', 'and', 'very', 'pleasant', 'today']
  lines = []
  for _ in range(n):
    words = list(rng.choice(filler, 5))
    at = rng.integers(0, 5)
    person = list(rng.choice(names, rng.integers(1, 3), replace=False))
    words[at:at] = person
    tags = ['O'] * len(words)
    tags[at:at + len(person)] = ['B-PER'] + ['I-PER'] * (len(person) - 1)
    lines += [f'{w} {t}' for w, t in zip(words, tags)] + ['']
  path.write_text('\n'.join(lines))


def _run(module, *flags):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT, PYTHONUNBUFFERED='1')
  proc = subprocess.run([sys.executable, '-m', module, *flags], cwd=REPO_ROOT, env=env,
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, f'{proc.stdout}\n{proc.stderr}'
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_tagger_fine_tunes_predicts_and_exports_as_transformers_token_classifier(
    pretrain_workdir, tmp_path):  # noqa: F811
  transformers = pytest.importorskip('transformers')
  import torch  # pylint: disable=import-outside-toplevel
  _write_names(tmp_path / 'train.txt', 512, 0)
  _write_names(tmp_path / 'eval.txt', 64, 1)
  out = str(tmp_path / 'ft')
  summary = _run('electra_jax.finetune', '--config=configs/finetune/tagging.py',
                 f'--config.train_file={tmp_path}/train.txt',
                 f'--config.eval_file={tmp_path}/eval.txt', '--config.max_seq_length=16',
                 '--config.train_batch_size=16', '--config.num_epochs=4',
                 '--config.learning_rate=5e-3', '--config.dropout_rate=0.0',
                 '--config.attention_dropout_rate=0.0', '--config.progress_bar=false',
                 f'--config.init_checkpoint={pretrain_workdir[0]}', f'--workdir={out}')
  assert summary['label_names'] == ['B-PER', 'I-PER', 'O'] and summary['main_metric'] == 'f1'
  assert summary['median_best_f1'] > 0.8  # the toy task is learnable
  # Predictions reproduce the best epoch's scores; the .conll file is the input's words.
  predicted = _run('electra_jax.predict', f'--workdir={out}', f'--input={tmp_path}/eval.txt',
                   f'--output={tmp_path}/pred')
  (part,) = predicted['parts']
  assert part['metrics']['f1'] == pytest.approx(summary['median_best_f1'])
  conll = (tmp_path / 'pred' / 'eval.conll').read_text().split('\n\n')
  sentences = tasks.read_conll(str(tmp_path / 'eval.txt'))
  assert len(conll) == len(sentences) == 64
  assert [line.split('\t')[0] for line in conll[3].splitlines()] == sentences[3][0]
  with open(tmp_path / 'pred' / 'eval.jsonl', encoding='utf-8') as f:
    first = json.loads(f.readline())
  assert first['label'] == sentences[0][1] and len(first['prediction']) == len(first['words'])
  # transformers' ElectraForTokenClassification gives our predictions on the same words.
  exported = _run('electra_jax.export', f'--workdir={out}', f'--output={tmp_path}/hf')
  assert exported['what'] == 'ElectraForTokenClassification'
  tok = transformers.AutoTokenizer.from_pretrained(f'{tmp_path}/hf')
  model = transformers.ElectraForTokenClassification.from_pretrained(f'{tmp_path}/hf').eval()
  ours = [json.loads(line)['prediction'] for line in
          (tmp_path / 'pred' / 'eval.jsonl').read_text().splitlines()]
  for words, tags in zip([s[0] for s in sentences[:16]], ours):
    encoded = tok(words, is_split_into_words=True, return_tensors='pt')
    with torch.no_grad():
      ids = model(**encoded).logits[0].argmax(-1).tolist()
    word_ids = encoded.word_ids()
    theirs = [model.config.id2label[ids[i]] for i, w in enumerate(word_ids)
              if w is not None and word_ids[i - 1] != w]
    assert theirs == tags


def test_conll2003_refuses_files_it_would_ignore_and_its_config_gives_none():
  """tagging.py's bundled files under task=conll2003 (TFDS's data) are refused, naming the
  config that reads TFDS; conll2003.py, README's command, resolves."""
  # pylint: disable-next=import-outside-toplevel
  from configs.finetune import conll2003, tagging
  from electra_jax.finetune import settings  # pylint: disable=import-outside-toplevel
  for name in ('conll2003', 'conll2003_chunk', 'conll2003_pos'):
    c = tagging.get_config()
    c.task = name
    with pytest.raises(UserError, match=rf"config.task={name} reads TFDS's conll2003, not files "
                                        r"\(config.train_file='.*austen_names/train.txt', "
                                        r"config.eval_file=.*configs/finetune/conll2003.py"):
      settings.resolve(c, tasks.get_task(name), 256)
    c.train_file = ''
    with pytest.raises(UserError, match=r"not files \(config.eval_file="):
      settings.resolve(c, tasks.get_task(name), 256)
  c = conll2003.get_config()
  assert settings.resolve(c, tasks.get_task(c.task), 256).task == 'conll2003'
  tagged = tagging.get_config()  # Files are what task=tagging reads.
  assert settings.resolve(tagged, tasks.get_task('tagging'), 256).train_file


@pytest.mark.parametrize('encoding,tag_head', [('file', 'transformers'), ('bioes', 'official')])
def test_conll2003_tags_come_from_tfds_and_are_scored_on_dev_and_test(tmp_path, encoding,
                                                                      tag_head):
  """CoNLL-2003 (NER, chunks, POS) from TFDS mock data: TFDS's tag ids name our tags, the
  run picks its epoch on dev and reports test too, predictions score as its best epoch (with
  either head: predict builds the run's)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from electra_jax.finetune import loop, predictions, saved_run
  from tests.test_finetune import ft_config  # pylint: disable=import-outside-toplevel
  def sentences(builder, split, *args, **kwargs):
    """Records as TFDS's conll2003 holds them (its random mock gives each feature its own
    length): words, and the three tag columns as ids, one per word; the same on every call."""
    del builder, args, kwargs
    rng = np.random.default_rng(sum(map(ord, str(split))))
    records = []
    for _ in range(16):
      n = int(rng.integers(3, 12))
      records.append(dict(tokens=[w.encode() for w in rng.choice(['Emma', 'went', 'to',
                                                                   'Bath', '.'], n)],
                          ner=rng.integers(0, 9, n), chunks=rng.integers(0, 23, n),
                          pos=rng.integers(0, 47, n)))
    return records

  with tfds.testing.mock_data(as_data_source_fn=sentences):
    source = tasks.tfds_source('conll2003', 'dev', None, False)  # registers the builder
    builder = tfds.builder('conll2003')
    for name, key in (('conll2003', 'ner'), ('conll2003_chunk', 'chunks'),
                      ('conll2003_pos', 'pos')):
      assert tasks.get_task(name).label_names == tuple(builder.info.features[key].feature.names)
    c = ft_config(task='conll2003', random_init=True, model_size='demo', max_seq_length=32,
                  train_batch_size=8, eval_batch_size=8, num_epochs=1, max_train_examples=16,
                  max_eval_examples=8, num_seeds=1, tag_encoding=encoding, tag_head=tag_head)
    summary = loop.finetune(c, str(tmp_path / 'ft'))
    run = saved_run.load(str(tmp_path / 'ft'))
    parts = predictions.split_parts(run, 'test', max_examples=8)
    result = predictions.predict(run, parts, str(tmp_path / 'out'), say=lambda *a, **k: None)
  example = tasks.tagging_tfds_examples(run.task, source, 1, encoding)[0]
  assert len(example['words']) == len(example['label']) > 0
  assert len(run.task.label_names) == (9 if encoding == 'file' else 17)
  assert summary['main_metric'] == 'f1' and {'median_best_f1', 'median_best_test_f1'} <= set(
      summary)
  best = run.runs[0]['best']
  assert result['parts'][0]['name'] == 'conll2003_test'
  assert result['parts'][0]['metrics']['f1'] == pytest.approx(best['eval_test_f1'])
  assert tasks.get_task('conll2003_pos').metric_names == ('accuracy',)
  with pytest.raises(UserError, match="conll2003 record 0 has 2 words but 1 'ner' tags"):
    tasks.tagging_tfds_examples(tasks.get_task('conll2003'), [dict(tokens=[b'a', b'b'], ner=[0])])
