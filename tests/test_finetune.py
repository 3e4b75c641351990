"""Fine-tuning: tasks and files, TFDS GLUE/SQuAD adapters, LLRD, SQuAD head and decoding,
initialisation from a pretraining workdir, and the CLI end to end on a tiny model."""
import csv
import dataclasses
import gzip
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import optim
from electra_jax import parallel
from electra_jax import saved_config
from electra_jax import train_state as ts
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError
from electra_jax.finetune import features, heads, loop, pretrained, spans, steps, tasks
from tests.conftest import REPO_ROOT, tiny_config, xla_flags_with

VOCAB = os.path.join(REPO_ROOT, 'data', 'demo_spm.model')


@pytest.fixture(scope='module')
def tokenizer():
  return tokenizer_lib.load_tokenizer(VOCAB)


@pytest.fixture(scope='module')
def bert_layout_vocab(tmp_path_factory):
  """An uncased WordPiece vocab.txt whose special tokens sit where BERT's do, away from ids
  0..4 ([PAD] 0, [UNK] 11, [CLS] 12, [SEP] 13, [MASK] 14), as in the released ELECTRA vocab."""
  from tests import hf_pair  # pylint: disable=import-outside-toplevel
  return hf_pair.wordpiece_vocab(str(tmp_path_factory.mktemp('bert_layout')))


@pytest.fixture(scope='module', params=['sentencepiece', 'wordpiece'])
def any_tokenizer(request, tokenizer, bert_layout_vocab):
  """The demo sentencepiece model, or the BERT-layout WordPiece vocabulary."""
  if request.param == 'sentencepiece':
    return tokenizer
  wordpiece = tokenizer_lib.load_tokenizer(bert_layout_vocab)
  assert (wordpiece.cls_id, wordpiece.sep_id, wordpiece.pad_id) == (12, 13, 0)
  return wordpiece


def ft_config(**overrides):
  from configs.finetune import glue  # pylint: disable=import-outside-toplevel
  c = glue.get_config()
  c.update(dict(max_seq_length=32, train_batch_size=16, eval_batch_size=32, num_epochs=2,
                dropout_rate=0.0, attention_dropout_rate=0.0, progress_bar=False))
  c.update(overrides)
  return c


# --- Files task ---------------------------------------------------------------------------------

def test_files_task_reads_csv_tsv_and_jsonl_with_sorted_class_names(tmp_path):
  (tmp_path / 'a.csv').write_text('text,label\n"Hello, world",pos\nBad day,neg\nOk,neu\n')
  (tmp_path / 'b.tsv').write_text('text_a\ttext_b\tlabel\nA "quoted" one\tB\tyes\nC\tD\tno\n')
  (tmp_path / 'c.jsonl').write_text('{"text": "x", "label": 0.5}\n\n{"text": "y", "label": 2}\n')
  rows = tasks.read_rows(str(tmp_path / 'a.csv'))
  task = tasks.files_task(rows)
  assert task.kind == tasks.CLASSIFICATION and task.label_names == ('neg', 'neu', 'pos')
  examples = tasks.file_examples(task, rows, 'a.csv')
  assert examples[0] == dict(text_a='Hello, world', text_b=None, label=2, index=0)
  pairs = tasks.read_rows(str(tmp_path / 'b.tsv'))
  pair_task = tasks.files_task(pairs)
  assert pair_task.label_names == ('no', 'yes') and pair_task.metric_names[0] == 'accuracy'
  assert tasks.file_examples(pair_task, pairs, 'b.tsv')[0] == dict(
      text_a='A "quoted" one', text_b='B', label=1, index=0)
  floats = tasks.read_rows(str(tmp_path / 'c.jsonl'))
  reg = tasks.files_task(floats)
  assert reg.kind == tasks.REGRESSION
  assert [e['label'] for e in tasks.file_examples(reg, floats, 'c.jsonl')] == [0.5, 2.0]
  # Integer labels are classes unless told otherwise.
  ints = [dict(text='a', label='1'), dict(text='b', label='2')]
  assert tasks.files_task(ints).kind == tasks.CLASSIFICATION
  assert tasks.files_task(ints, 'regression').kind == tasks.REGRESSION


def test_files_task_errors_are_one_clear_line(tmp_path):
  (tmp_path / 'nolabel.csv').write_text('text,target\nhi,1\n')
  (tmp_path / 'train.tsv').write_text('text\tlabel\na\tx\nb\ty\n')
  (tmp_path / 'eval.tsv').write_text('text\tlabel\nc\tz\n')
  (tmp_path / 'data.txt').write_text('hi\n')
  with pytest.raises(UserError, match=r"lacks column\(s\) label \(has \['target', 'text'\]\)"):
    rows = tasks.read_rows(str(tmp_path / 'nolabel.csv'))
    tasks.file_examples(tasks.TASKS['files'], rows, 'nolabel.csv')
  with pytest.raises(UserError, match="file '/nowhere.csv' not found"):
    tasks.read_rows('/nowhere.csv')
  saved = tmp_path / 'saved'  # As datasets' save_to_disk writes a split.
  saved.mkdir()
  (saved / 'state.json').write_text('{}')
  (saved / 'data-00000-of-00001.arrow').write_text('')
  for read in (tasks.read_rows, tasks.read_conll, lambda p: tasks.squad_file_examples(p, False)):
    with pytest.raises(UserError, match=re.escape(
        f"'{saved}' is a directory (it holds e.g. '{saved / 'data-00000-of-00001.arrow'}'); "
        'pass ')):
      read(str(saved))
  with pytest.raises(UserError, match=r'is not .csv, .tsv, JSON Lines \(.jsonl, .ndjson, .json; '
                                      r'.gz, .zst\), .parquet or .arrow'):
    tasks.read_rows(str(tmp_path / 'data.txt'))
  (tmp_path / 'noheader.csv').write_text('Bad day,neg\nGood day,pos\n')
  with pytest.raises(UserError, match=r"lacks column\(s\) text \(or text_a\), label \(has "
                                      r"\['Bad day', 'neg'\]\); .*\(CSV/TSV: in a header row\), "
                                      r'or name yours when fine-tuning: --config.text_columns, '
                                      r'--config.label_column$'):
    tasks.files_task(tasks.read_rows(str(tmp_path / 'noheader.csv')))
  # JSON Lines as pretraining corpora are read, without their config key in the message.
  (tmp_path / 'list.jsonl').write_text('{"text": "a", "label": 1}\n["b", 2]\n')
  with pytest.raises(UserError, match=r"list.jsonl' line 2 is a JSON list, not an object; write "
                                      r'one JSON object per line$'):
    tasks.read_rows(str(tmp_path / 'list.jsonl'))
  # A tab inside a TSV's text (read unquoted) would shift the label: the line is named.
  (tmp_path / 'tab.tsv').write_text('text\tlabel\na\tx\nb\tc\ty\nd\tz\t\n')
  with pytest.raises(UserError, match=r"tab.tsv' line 3 has 3 fields, its header 2; a TSV field "
                                      r'cannot hold a tab'):
    tasks.read_rows(str(tmp_path / 'tab.tsv'))
  (tmp_path / 'comma.csv').write_text('text,label\n"a, b",x\nc,d,y\n')
  with pytest.raises(UserError, match=r"comma.csv' line 3 has 3 fields, its header 2; quote a "):
    tasks.read_rows(str(tmp_path / 'comma.csv'))
  # A trailing delimiter (an empty last field) is no shift.
  (tmp_path / 'trailing.tsv').write_text('text\tlabel\na\tx\t\n')
  assert tasks.read_rows(str(tmp_path / 'trailing.tsv')) == [dict(text='a', label='x')]
  task = tasks.files_task(tasks.read_rows(str(tmp_path / 'train.tsv')))
  with pytest.raises(UserError, match="label 'z', which the training file never uses .*; the "
                                      'model cannot predict it: remove such examples or add'):
    tasks.file_examples(task, tasks.read_rows(str(tmp_path / 'eval.tsv')), 'eval.tsv')
  # A space after a CSV comma is no class of its own (it made a binary task three classes).
  (tmp_path / 'spaced.csv').write_text('text,label\nhappy day,good\nsad day,bad\n'
                                       'nice day, good\n')
  rows = tasks.read_rows(str(tmp_path / 'spaced.csv'))
  spaced = tasks.files_task(rows)
  assert spaced.label_names == ('bad', 'good') and 'mcc' in spaced.metric_names
  assert [e['label'] for e in tasks.file_examples(spaced, rows, 'spaced.csv')] == [1, 0, 1]
  # A GLUE class id must be ASCII digits: '²'.isdigit(), but int('²') is a ValueError.
  sst2 = tasks.get_task('sst2')
  with pytest.raises(UserError, match="example 1 has label '²', which the training file"):
    tasks.file_examples(sst2, [dict(text='a', label='²')], 'sst2.tsv')
  assert tasks.file_examples(sst2, [dict(text='a', label=' 1')], 'sst2.tsv')[0]['label'] == 1
  with pytest.raises(UserError, match="config.task='nope' is not a task"):
    tasks.get_task('nope')


def test_files_not_utf8_or_with_a_quote_left_open_are_one_clear_line(tmp_path):
  """Latin-1 files (Excel's CSVs on Windows) fail naming the file, as pretraining's text files
  do; so does a CSV quote never closed, which would read the rest of the file as one field (one
  unlabelled example). Quoted lines, \r line ends (old Mac Excel) and no last \n still read."""
  for name, text, offset in [('latin1.csv', 'text,label\ncafé,pos\n', 14),
                             ('latin1.tsv', 'text\tlabel\ncafé\tpos\n', 14),
                             ('latin1.jsonl', '{"text": "café", "label": "pos"}\n', 13),
                             ('latin1.conll', 'café\tO\n', 3)]:
    path = tmp_path / name
    path.write_bytes(text.encode('latin-1'))
    read = tasks.read_conll if name.endswith('.conll') else tasks.read_rows
    with pytest.raises(UserError, match=rf"^'{path}' is not UTF-8 \(invalid byte at byte offset "
                                        rf'{offset}\); convert it, e.g. iconv -t UTF-8$'):
      read(str(path))
  (tmp_path / 'open.csv').write_text('text,label\nfine,pos\n"Hello, world,pos\nBad day,neg\n')
  with pytest.raises(UserError, match=r"^file '.*open.csv' line 3 opens a quoted field that no "
                                      r'later line closes; close the quote \(write a quote '
                                      r'inside a quoted field twice: ""\)$'):
    tasks.read_rows(str(tmp_path / 'open.csv'))
  (tmp_path / 'mac.csv').write_bytes(b'\xef\xbb\xbftext,label\r"two\r\nlines",pos\r'
                                     b'"a ""quote""",neg')
  assert tasks.read_rows(str(tmp_path / 'mac.csv')) == [dict(text='two\r\nlines', label='pos'),
                                                        dict(text='a "quote"', label='neg')]


def test_hub_parquet_arrow_and_gzipped_json_lines_files_read_their_named_columns(tmp_path):
  """The Hugging Face Hub's GLUE files (Parquet, int labels, columns like question/sentence)
  read as the same examples as a CSV with our column names; Arrow and JSON Lines .gz too."""
  # pylint: disable=import-outside-toplevel
  import pyarrow
  import pyarrow.ipc
  import pyarrow.parquet
  hub = dict(question=['Who?', 'Where, then?', 'Why'], sentence=['Emma.', 'At "Bath".', 'No'],
             label=[1, 0, 1], idx=[0, 1, 2])
  pyarrow.parquet.write_table(pyarrow.table(hub), tmp_path / 'train.parquet')
  with pyarrow.OSFile(str(tmp_path / 'train.arrow'), 'wb') as sink:  # Arrow's file format.
    with pyarrow.ipc.new_file(sink, pyarrow.table(hub).schema) as writer:
      writer.write_table(pyarrow.table(hub))
  with gzip.open(tmp_path / 'train.jsonl.gz', 'wt', encoding='utf-8') as f:
    for row in pyarrow.table(hub).to_pylist():
      f.write(json.dumps(row) + '\n')
  with open(tmp_path / 'train.csv', 'w', encoding='utf-8', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['text_a', 'text_b', 'label'])
    writer.writerows(zip(hub['question'], hub['sentence'], hub['label']))
  want_rows = tasks.read_rows(str(tmp_path / 'train.csv'))
  want_task = tasks.files_task(want_rows)
  want = tasks.file_examples(want_task, want_rows, 'train.csv')
  assert want[1] == dict(text_a='Where, then?', text_b='At "Bath".', label=0, index=1)
  config = ml_collections.ConfigDict(dict(text_columns='question, sentence', label_column='label'))
  columns = tasks.file_columns(config)
  assert columns == tasks.FileColumns(('question', 'sentence'), 'label')
  for name in ('train.parquet', 'train.jsonl.gz', 'train.arrow'):
    rows = tasks.read_rows(str(tmp_path / name))
    task = tasks.files_task(rows, path=name, columns=columns)
    assert task.label_names == want_task.label_names == ('0', '1')
    assert tasks.file_examples(task, rows, name, columns=columns) == want
  # One text column; an unlabelled file (predictions) needs only the text.
  rows = [dict(sentence='x', label='1'), dict(sentence='y', label='0')]
  one = tasks.FileColumns(('sentence',))
  assert tasks.file_examples(tasks.files_task(rows, columns=one), rows, 'f', columns=one)[0] == \
      dict(text_a='x', text_b=None, label=1, index=0)
  assert tasks.file_examples(want_task, [dict(sentence='z')], 'f', need_label=False,
                             columns=one) == [dict(text_a='z', text_b=None, label=None, index=0)]
  # A `datasets` ClassLabel column (its names in the schema's metadata) reads as the names; -1
  # (no label, the Hub's test splits) stays a value.
  features = dict(question=dict(dtype='string', _type='Value'),
                  label=dict(names=['entailment', 'not_entailment'], _type='ClassLabel'))
  table = pyarrow.table(dict(question=['a', 'b', 'c'], label=[1, 0, -1]))
  pyarrow.parquet.write_table(table.replace_schema_metadata(
      {b'huggingface': json.dumps(dict(info=dict(features=features)))}), tmp_path / 'nli.parquet')
  nli = tasks.read_rows(str(tmp_path / 'nli.parquet'))
  assert [r['label'] for r in nli] == ['not_entailment', 'entailment', None]
  nli_task = tasks.named_files_task(('entailment', 'not_entailment'))
  one = tasks.FileColumns(('question',))
  with pytest.raises(UserError, match="nli.parquet' example 3 has no label value; give every "):
    tasks.files_task(nli, path='nli.parquet', columns=one)
  # A test split (every label -1) predicts unlabelled.
  test_split = [dict(r, label=None) for r in nli]
  assert [e['label'] for e in tasks.file_examples(nli_task, test_split, 'test.parquet',
                                                  need_label=False, columns=one)] == [None] * 3
  with pytest.raises(UserError, match=r"lacks column\(s\) sentence2, gold \(has \['idx', "):
    tasks.files_task(tasks.read_rows(str(tmp_path / 'train.parquet')),
                     columns=tasks.FileColumns(('question', 'sentence2'), 'gold'))


def test_a_glue_task_reads_its_own_files_by_its_column_names(tmp_path, tokenizer):
  """GLUE without TFDS: the Hub's MRPC Parquet (ClassLabel names, sentence1/sentence2, idx) and
  a TSV of GLUE's class ids read into MRPC's classes and metrics; double_unordered doubles the
  pairs as it does TFDS's; a train file without an eval file is named."""
  # pylint: disable=import-outside-toplevel
  import pyarrow
  import pyarrow.parquet
  features = dict(sentence1=dict(dtype='string', _type='Value'),
                  sentence2=dict(dtype='string', _type='Value'),
                  label=dict(names=['not_equivalent', 'equivalent'], _type='ClassLabel'),
                  idx=dict(dtype='int32', _type='Value'))
  table = pyarrow.table(dict(sentence1=['Emma walked.', 'Anne sang.'],
                             sentence2=['Emma went on foot.', 'Anne was silent.'],
                             label=[1, 0], idx=[0, 1]))
  pyarrow.parquet.write_table(table.replace_schema_metadata(
      {b'huggingface': json.dumps(dict(info=dict(features=features)))}),
      tmp_path / 'train.parquet')
  (tmp_path / 'dev.tsv').write_text('sentence1\tsentence2\tlabel\nA cat.\tA dog.\t0\n')
  mrpc = tasks.get_task('mrpc')
  config = ft_config(task='mrpc', train_file=str(tmp_path / 'train.parquet'),
                     eval_file=str(tmp_path / 'dev.tsv'), double_unordered=True)
  data = loop.load_data(config, mrpc, tokenizer)
  assert data.task == mrpc and data.task.metric_names == ('accuracy', 'f1')
  assert data.train['label'].tolist() == [1, 0, 1, 0]  # Both orders of each pair.
  (evals,) = data.evals
  assert evals.examples == [dict(text_a='A cat.', text_b='A dog.', label=0, index=0)]
  swapped = loop.encode(config, mrpc, tokenizer, [
      dict(text_a='Emma went on foot.', text_b='Emma walked.', label=1, index=0)])
  np.testing.assert_array_equal(data.train['input_ids'][2], swapped['input_ids'][0])
  with pytest.raises(UserError, match=r"config.task=mrpc needs --config.eval_file=PATH \(.*with "
                                      r"the task's columns \(sentence1, sentence2 or #1 String, "
                                      r"#2 String\) and label \(or Quality\)\)"):
    loop.load_data(ft_config(task='mrpc', train_file=str(tmp_path / 'train.parquet')), mrpc,
                   tokenizer)


def test_eval_files_are_read_by_the_text_columns_the_training_file_was_read_by(tmp_path):
  """Each file used to pick its own text columns: a pair model (text_a, text_b) evaluated on an
  eval file of one `text` column scored single sentences. The training file's columns now hold
  for the eval file (a GLUE task's own names, the Hub's or GLUE's TSVs', stay alike)."""
  def write(name, header, *rows):
    (tmp_path / name).write_text('\n'.join(['\t'.join(header)] + ['\t'.join(r) for r in rows])
                                 + '\n')
    return str(tmp_path / name)
  pairs = write('pairs.tsv', ('text_a', 'text_b', 'label'), ('a', 'b', 'x'), ('c', 'd', 'y'))
  single = write('single.tsv', ('text', 'label'), ('a b', 'x'), ('c d', 'y'))
  read = lambda train, eval_file, task='files': loop.read_examples(
      ft_config(task=task, train_file=train, eval_file=eval_file), tasks.get_task(task))
  with pytest.raises(UserError, match=f"^file '{re.escape(single)}' has text column\\(s\\) text "
                                      r"\(its columns: \['label', 'text'\]\) where the run "
                                      r"trained on text_a, text_b; give it the training file's "):
    read(pairs, single)
  with pytest.raises(UserError, match=r"pairs.tsv' has text column\(s\) text_a, text_b .*where "
                                      r'the run trained on text;'):
    read(single, pairs)
  task, _, ((_, evals),) = read(pairs, pairs)
  assert task.file_text == ('text_a', 'text_b') and evals[0]['text_b'] == 'b'
  # MNLI: the Hub's names and GLUE's TSVs' are one task's; a file of other names is not.
  hub = write('hub.tsv', ('premise', 'hypothesis', 'label'), ('p', 'h', 'neutral'))
  glue = write('glue.tsv', ('sentence1', 'sentence2', 'gold_label'), ('p', 'h', 'neutral'))
  task, _, ((_, evals),) = read(hub, glue, 'mnli')
  assert task == tasks.TASKS['mnli'] and evals[0]['text_b'] == 'h'
  with pytest.raises(UserError, match=r"single.tsv' has text column\(s\) text .*where the run "
                                      r'trained on premise, hypothesis or sentence1, sentence2;'):
    read(hub, single, 'mnli')
  # The generic names (text, text_a/text_b) do, holding as many texts as training read.
  generic = write('generic.tsv', ('text_a', 'text_b', 'label'), ('a', 'b', 'neutral'))
  task, _, ((_, evals),) = read(hub, generic, 'mnli')
  assert (evals[0]['text_a'], evals[0]['text_b']) == ('a', 'b')


def test_glue_data_tsvs_read_as_the_official_code_reads_them(tmp_path, tokenizer):
  """GLUE's own TSVs (glue_data/, the official code's input): CoLA's train/dev without a header
  row, MRPC's Quality/#1 String/#2 String, QQP's is_duplicate, STS-B's score, MNLI's
  sentence1/sentence2/gold_label; their test files as leaderboard parts, keyed by their ids."""
  from electra_jax.finetune import predictions, saved_run  # pylint: disable=import-outside-toplevel
  layouts = {
      'cola': ('gj04\t1\t\tOur friends will buy it.\ngj04\t0\t*\tThey drank the pub.\n',
               'index\tsentence\n0\tBill left.\n',
               [('Our friends will buy it.', None, 1), ('They drank the pub.', None, 0)]),
      'mrpc': ('Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t7\t8\tEmma ran.\tEmma hurried.\n',
               'index\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t1\t2\tA.\tB.\n',
               [('Emma ran.', 'Emma hurried.', 1)]),
      'qqp': ('id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n5\t1\t2\tWho?\tWhom?\t0\n',
              'id\tquestion1\tquestion2\n0\tWhy?\tHow?\n', [('Who?', 'Whom?', 0)]),
      'stsb': ('index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t'
               'sentence2\tscore\n0\tm\tf\t2012\t1\ts\ts\tA cat.\tA dog.\t2.500\n',
               'index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t'
               'sentence2\n0\tm\tf\t2012\t1\ts\ts\tA.\tB.\n', [('A cat.', 'A dog.', 0.5)]),
      'mnli': ('index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n'
               '0\t1\t1n\tfiction\tShe read.\tShe slept.\tneutral\tneutral\n',
               'index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\n3\t1\t1n\tf\tA.\tB.\n',
               [('She read.', 'She slept.', 1)]),
  }
  for name, (train, test, want) in layouts.items():
    (tmp_path / f'{name}_train.tsv').write_text(train)
    (tmp_path / f'{name}_test.tsv').write_text(test)
    task = tasks.get_task(name)
    c = ft_config(task=name, train_file=str(tmp_path / f'{name}_train.tsv'),
                  eval_file=str(tmp_path / f'{name}_train.tsv'))
    data = loop.load_data(c, task, tokenizer)
    assert [(e['text_a'], e['text_b'], e['label']) for e in data.evals[0].examples] == want, name
    run = saved_run.FinetunedRun(workdir='', config=c, task=task, model_config=None,
                                 network=None, tokenizer=tokenizer, runs=[])
    spec = str(tmp_path / f'{name}_test.tsv')
    part = predictions.glue_test_part(run, f'MNLI-m={spec}' if name == 'mnli' else spec)
    assert not part.labelled and len(part.examples) == 1, name
    assert part.examples[0]['index'] == (3 if name == 'mnli' else 0)
  # A CoLA file with a header is read by it; a named label column is not second-guessed.
  (tmp_path / 'cola_header.tsv').write_text('sentence\tlabel\tx\ty\nBill left.\t1\t\t\n')
  assert tasks.read_rows(str(tmp_path / 'cola_header.tsv'),
                         tasks.TASKS['cola'].glue_tsv_headerless)[0]['sentence'] == 'Bill left.'
  (tmp_path / 'four.csv').write_text('id,text,lbl,extra\n1,a,0,x\n')  # Only TSVs lack headers.
  assert tasks.read_rows(str(tmp_path / 'four.csv'),
                         tasks.TASKS['cola'].glue_tsv_headerless) == [
                             dict(id='1', text='a', lbl='0', extra='x')]
  with pytest.raises(UserError, match=r"lacks column\(s\) gold \(has"):
    loop.load_data(ft_config(task='mnli', label_column='gold',
                             train_file=str(tmp_path / 'mnli_train.tsv'),
                             eval_file=str(tmp_path / 'mnli_train.tsv')), tasks.TASKS['mnli'],
                   tokenizer)
  with pytest.raises(UserError, match=r"lacks column\(s\) label \(or score\)"):
    loop.load_data(ft_config(task='stsb', train_file=str(tmp_path / 'stsb_test.tsv'),
                             eval_file=str(tmp_path / 'stsb_test.tsv')), tasks.TASKS['stsb'],
                   tokenizer)


def test_file_rows_with_missing_values_or_fields_are_named_and_other_columns_ignored(tmp_path):
  """Nulls stay missing (not the word 'null'); JSON Lines records need not repeat every field;
  columns the task does not read may hold anything (dates, bytes)."""
  import datetime  # pylint: disable=import-outside-toplevel
  # pylint: disable=import-outside-toplevel
  import pyarrow
  import pyarrow.parquet
  table = pyarrow.table(dict(text=['a', 'b'], label=['x', 'y'],
                             day=[datetime.date(2026, 11, 28)] * 2, raw=[b'\x00', b'\x01']))
  pyarrow.parquet.write_table(table, tmp_path / 'dated.parquet')
  rows = tasks.read_rows(str(tmp_path / 'dated.parquet'))
  assert rows[0] == dict(text='a', label='x', day='"2026-11-28"', raw=rows[0]['raw'])
  assert tasks.files_task(rows).label_names == ('x', 'y')
  (tmp_path / 'gaps.jsonl').write_text('{"text_a": "q1", "text_b": "s1", "label": "x"}\n'
                                       '{"text_a": "q2", "text_b": "s2", "label": "y"}\n'
                                       '{"text_a": null, "text_b": "s3", "label": "x"}\n'
                                       '{"text_a": "q4", "text_b": "s4"}\n'
                                       '{"text_a": "q5", "label": "y"}\n')
  rows = tasks.read_rows(str(tmp_path / 'gaps.jsonl'))
  task = tasks.files_task(rows[:2])
  assert [e['text_b'] for e in tasks.file_examples(task, rows[:2], 'gaps.jsonl')] == ['s1', 's2']
  with pytest.raises(UserError, match=r"gaps.jsonl' example 3 has no text_a value"):
    tasks.file_examples(task, rows[:3], 'gaps.jsonl')
  # A pair model is never fed a single text: a record without text_b is named (or skipped).
  single = [rows[0], rows[4]]
  with pytest.raises(UserError, match=r"gaps.jsonl' example 2 has no text_b value"):
    tasks.file_examples(task, single, 'gaps.jsonl')
  with pytest.raises(UserError, match=r"gaps.jsonl' example 2 has no text_b value; give every"):
    tasks.complete_rows(single, 'gaps.jsonl')
  assert tasks.complete_rows(single, 'gaps.jsonl', skip_bad_rows=True) == [rows[0]]
  with pytest.raises(UserError, match=r"gaps.jsonl' example 4 has no label value; give every"):
    tasks.files_task(rows, path='gaps.jsonl')
  (tmp_path / 'empty.jsonl').write_text('\n')
  with pytest.raises(UserError, match=r"empty.jsonl' is empty$"):
    tasks.read_rows(str(tmp_path / 'empty.jsonl'))


def test_a_blank_csv_label_cell_is_a_missing_label_as_a_json_null_is(tmp_path):
  """A CSV/TSV cannot write null: its empty (or blank) cell is no class named '' or ' '."""
  (tmp_path / 'train.csv').write_text('text,label\nfine day,pos\nawful day,neg\nmeh day, \n')
  path = str(tmp_path / 'train.csv')
  with pytest.raises(UserError, match=r"train.csv' example 3 has no label value; give every"):
    tasks.complete_rows(tasks.read_rows(path), path)
  rows = tasks.complete_rows(tasks.read_rows(path), path, skip_bad_rows=True)
  assert tasks.files_task(rows).label_names == ('neg', 'pos')
  with pytest.raises(UserError, match=r"train.csv' example 3 has no label value; give every"):
    tasks.files_task(tasks.read_rows(path), path=path)
  # A regression file with a blank score stays a regression over the others.
  (tmp_path / 'scores.tsv').write_text('text\tlabel\na\t0.5\nb\t\nc\t2.25\n')
  path = str(tmp_path / 'scores.tsv')
  rows = tasks.complete_rows(tasks.read_rows(path), path, skip_bad_rows=True)
  task = tasks.files_task(rows, path=path)
  assert task.kind == tasks.REGRESSION and [r['text'] for r in rows] == ['a', 'c']
  # NaN or inf is no target: it made every weight NaN, reported as a diverged seed.
  for bad in ('NaN', 'inf'):
    (tmp_path / 'scores.tsv').write_text(f'text\tlabel\na\t0.5\nb\t{bad}\nc\t2.25\n')
    rows = tasks.read_rows(path)
    with pytest.raises(UserError, match=f"scores.tsv' example 2 has label '{bad}', not a "
                       'finite number'):
      tasks.file_examples(tasks.files_task(rows, path=path), rows, path)
  # A file to predict with its label column left empty: unlabelled examples.
  task = tasks.named_files_task(('neg', 'pos'))
  (tmp_path / 'predict.csv').write_text('text,label\nlovely day,\ndreadful day,\n')
  path = str(tmp_path / 'predict.csv')
  examples = tasks.file_examples(task, tasks.read_rows(path), path, need_label=False)
  assert [(e['text_a'], e['label']) for e in examples] == [('lovely day', None),
                                                          ('dreadful day', None)]


def test_skip_bad_rows_drops_and_counts_rows_that_are_no_examples_and_errors_offer_it(
    tmp_path, tokenizer, caplog):
  """A QQP train TSV as GLUE's is said to hold: a row cut short (no is_duplicate), one whose
  question holds a tab (a field too many); BERT's and transformers' readers skip such rows."""
  (tmp_path / 'qqp.tsv').write_text(
      'id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n'
      '1\t1\t2\tWho?\tWhom?\t0\n'
      '2\t3\t4\tWhy?\n'
      '3\t5\t6\tHow\tcome?\tWhy?\t1\n'
      '4\t7\t8\tWhere?\tWhence?\t1\n')
  path = str(tmp_path / 'qqp.tsv')
  c = ft_config(task='qqp', train_file=path, eval_file=path)
  with pytest.raises(UserError, match=r"qqp.tsv' line 4 has 7 fields, its header 6; .* or write "
                                      r'the file as JSON Lines, or set --config.skip_bad_rows='
                                      r'true to skip such rows$'):
    loop.load_data(c, tasks.TASKS['qqp'], tokenizer)
  with pytest.raises(UserError, match=r"qqp.tsv' example 2 has no is_duplicate value; give every "
                                      r'example one, or set --config.skip_bad_rows=true'):
    tasks.complete_rows(tasks.read_rows(path, skip_bad_rows=True), path,
                        tasks.file_columns(c, tasks.TASKS['qqp']))
  with pytest.raises(UserError, match=r"line 4 has 7 fields, its header 6; .*JSON Lines$"):
    tasks.read_rows(path)  # Predictions: no option to offer.
  with pytest.raises(UserError, match=r"test.parquet' has no label values \(a test split\?\); "
                                      r'fine-tune and evaluate on labelled files'):
    tasks.complete_rows([dict(text='a', label=None)] * 2, 'test.parquet', skip_bad_rows=True)
  c.skip_bad_rows = True
  caplog.clear()
  data = loop.load_data(c, tasks.TASKS['qqp'], tokenizer)
  assert [(e['text_a'], e['label']) for e in data.evals[0].examples] == [('Who?', 0),
                                                                          ('Where?', 1)]
  assert data.train['label'].tolist() == [0, 1]
  skipped = [r.getMessage() for r in caplog.records if 'skip_bad_rows' in r.getMessage()]
  assert skipped == [f"skipped 1 row(s) of '{path}' {what} (skip_bad_rows)" for what in [
      'with more fields than the header', 'without a label or text value'] * 2]


def test_pairs_are_packed_and_truncated_longest_first(any_tokenizer):
  tokenizer = any_tokenizer
  long_a = ' '.join(['Elizabeth'] * 40)
  out = features.encode_classification(
      tokenizer, [dict(text_a=long_a, text_b='Mr. Darcy', label=1),
                  dict(text_a='Emma', text_b=None, label=0)], 16, regression=False)
  ids, seg, mask = out['input_ids'], out['segment_ids'], out['input_mask']
  assert ids.shape == (2, 16) and out['label'].tolist() == [1, 0]
  b = tokenizer.encode('Mr. Darcy')
  # [CLS] a... [SEP] b [SEP]: b kept whole, a truncated to fill the rest.
  assert ids[0, 0] == tokenizer.cls_id and ids[0, -1] == tokenizer.sep_id
  assert ids[0, 16 - len(b) - 1:-1].tolist() == b
  assert seg[0].tolist() == [0] * (16 - len(b) - 1) + [1] * (len(b) + 1)
  assert mask[0].all()
  assert ids[0, 16 - len(b) - 2] == tokenizer.sep_id
  n = len(tokenizer.encode('Emma')) + 2
  assert mask[1].tolist() == [1] * n + [0] * (16 - n) and not seg[1].any()
  assert ids[1, 0] == tokenizer.cls_id and ids[1, n - 1] == tokenizer.sep_id
  assert (ids[1, n:] == tokenizer.pad_id).all()


# --- TFDS ---------------------------------------------------------------------------------------

def test_glue_tasks_load_from_tfds_mock_data(tokenizer):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  c = ft_config()
  with tfds.testing.mock_data(num_examples=6):
    mnli = loop.load_data(c, tasks.get_task('mnli'), tokenizer)
    stsb = loop.load_data(c, tasks.get_task('stsb'), tokenizer)
    raw = tasks.tfds_source('glue/stsb', 'train', None, False)
    raw_labels = [float(raw[i]['label']) for i in range(6)]
    cola = loop.load_data(c, tasks.get_task('cola'), tokenizer)
  assert [e.prefix for e in mnli.evals] == ['', 'mismatched_']
  assert mnli.train['input_ids'].shape == (6, 32)
  assert set(mnli.train['label'].tolist()) <= {0, 1, 2}
  assert (mnli.train['segment_ids'].sum(axis=1) > 0).all()  # premise + hypothesis pairs
  # STS-B: regression targets divided by 5 (official code); metrics on the original scale.
  assert stsb.task.kind == tasks.REGRESSION
  np.testing.assert_allclose(stsb.train['label'], np.array(raw_labels) / 5, rtol=1e-6)
  assert not cola.train['segment_ids'].any()  # single sentences
  assert tasks.get_task('cola').main_metric == 'mcc'


def test_squad_v2_loads_from_tfds_mock_data(tokenizer):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  c = ft_config(max_seq_length=64, doc_stride=16, max_query_length=16)
  with tfds.testing.mock_data(num_examples=4):
    data = loop.load_data(c, tasks.get_task('squad_v2'), tokenizer)
  assert len(data.evals[0].examples) == 4
  assert data.train['input_ids'].shape[1] == 64
  assert {e['is_impossible'] for e in data.evals[0].examples} <= {True, False}


def test_missing_tfds_dataset_is_a_user_error(tmp_path, capfd):
  """One line saying where it was looked for: tfds's cause named TFRecord files and broke off
  ('Possible root causes:'), after a warning line of its own."""
  with pytest.raises(UserError, match=re.escape(
      f"TFDS dataset 'glue/rte' split 'train' is not available (not found as ArrayRecord files "
      f'in {tmp_path}); prepare it with `tfds build glue/rte')):
    tasks.tfds_source('glue/rte', 'train', str(tmp_path), download=False)
  assert 'dataset_info.json' not in capfd.readouterr().err


def test_a_broken_tensorflow_datasets_install_is_a_user_error(monkeypatch):
  """tensorflow-datasets 4.9.10 imports importlib_resources at first use without declaring it
  (Python >= 3.9): a module missing there is one line saying to reinstall."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  def data_source(*args, **kwargs):
    raise ModuleNotFoundError("No module named 'importlib_resources'")

  monkeypatch.setattr(tfds, 'data_source', data_source)
  with pytest.raises(UserError, match=r"^task dataset 'glue/rte' needs tensorflow-datasets, which "
                                      r"failed to import \(No module named 'importlib_resources'"
                                      r'\); reinstall: pip install -e \. \(or use'):
    tasks.tfds_source('glue/rte', 'train', None, download=False)


def test_a_tfds_download_without_a_network_is_one_line(monkeypatch, tmp_path):
  """Offline, tensorflow-datasets' download fails (after minutes of retries) with requests'
  ConnectionError, an OSError whose text is a page of URL details."""
  import requests  # pylint: disable=import-outside-toplevel
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  def data_source(*args, **kwargs):
    raise requests.exceptions.ConnectionError(
        "HTTPSConnectionPool(host='dl.fbaipublicfiles.com', port=443): Max retries exceeded")

  monkeypatch.setattr(tfds, 'data_source', data_source)
  with pytest.raises(UserError, match=r"^downloading TFDS dataset 'glue/sst2' failed \("
                                      r"HTTPSConnectionPool.*\); check the network, or build it "
                                      r'where there is one \(`tfds build glue/sst2 '):
    tasks.tfds_source('glue/sst2', 'train', str(tmp_path), download=True)
  # predict has no --config: its own way (the split as a file) replaces fine-tuning's flags.
  with pytest.raises(UserError, match=r'\); check the network, or predict the split as a file: '
                                      r'--input=FILE$'):
    tasks.tfds_source('glue/sst2', 'train', str(tmp_path), download=True,
                      remedy='predict the split as a file: --input=FILE')


# --- Layer-wise learning-rate decay --------------------------------------------------------------

def _model(task, num_layers=3):
  c = config_lib.resolve(tiny_config(vocab_size=8000, num_layers=num_layers))
  return loop.make_model(task, model_lib.ModelConfig.from_config(c))


def test_layerwise_lr_multipliers_follow_the_paper_not_the_official_bug():
  task = tasks.TASKS['sst2']
  model = _model(task)  # E 16 != H 32: has an embeddings_project
  params = jax.eval_shape(lambda: model.init(
      {'params': jax.random.key(0)},
      {k: jnp.zeros((1, 8), jnp.int32) for k in ('input_ids', 'segment_ids', 'input_mask')}
  )['params'])
  m = optim.layerwise_lr_multipliers(params, 0.8, 3)
  enc = m['electra']['discriminator']['encoder']
  assert m['head']['output']['kernel'] == 1.0
  assert enc['layer_2']['attention']['query']['kernel'] == pytest.approx(0.8)  # top: decay^1
  assert enc['layer_1']['output_LayerNorm']['scale'] == pytest.approx(0.8 ** 2)
  assert enc['layer_0']['intermediate']['bias'] == pytest.approx(0.8 ** 3)
  assert enc['embeddings_project']['kernel'] == pytest.approx(0.8 ** 4)
  assert m['electra']['embeddings']['word_embeddings'] == pytest.approx(0.8 ** 4)
  assert 'generator' not in params['electra'] and 'head' not in params['electra']['discriminator']


def test_finetune_optimizer_scales_each_layers_step_by_its_multiplier():
  params = {'electra': {'embeddings': {'w': jnp.ones(3)},
                        'discriminator': {'encoder': {'layer_0': {'w': jnp.ones(3)},
                                                      'layer_1': {'w': jnp.ones(3)}}}},
            'head': {'w': jnp.ones(3)}}
  c = ml_collections.ConfigDict(dict(learning_rate=1e-2, adam_b1=0.9, adam_b2=0.999,
                                     adam_epsilon=1e-12, weight_decay_rate=0.0,
                                     max_grad_norm=0.0, layerwise_lr_decay=0.5,
                                     official_layerwise_decay=False, adam_bias_correction=True,
                                     lr_decay_power=1.0, warmup_times_decay=False))
  tx, _ = optim.make_finetune_optimizer(c, params, 2, total_steps=10, warmup_steps=0)
  grads = jax.tree.map(lambda p: 0.3 * p, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  # Adam's first step moves every weight by the learning rate; LLRD scales that.
  step = {jax.tree_util.keystr(p): float(-u[0] / 1e-2)
          for p, u in jax.tree_util.tree_leaves_with_path(updates)}
  assert step["['head']['w']"] == pytest.approx(1.0, rel=1e-4)
  layer = "['electra']['discriminator']['encoder']['layer_{}']['w']"
  assert step[layer.format(1)] == pytest.approx(0.5, rel=1e-4)
  assert step[layer.format(0)] == pytest.approx(0.25, rel=1e-4)
  assert step["['electra']['embeddings']['w']"] == pytest.approx(0.125, rel=1e-4)


# --- SQuAD --------------------------------------------------------------------------------------

CONTEXT = ('Anne Elliot walked to the Cobb at Lyme with Captain Wentworth, and Louisa Musgrove '
           'jumped from the steps and fell on the pavement below.')


def test_squad_windows_map_answers_to_the_right_tokens(any_tokenizer):
  tokenizer = any_tokenizer
  answer = 'Louisa Musgrove'
  example = dict(id='q', question='Who fell?', context=CONTEXT, is_impossible=False,
                 answers=[(answer, CONTEXT.index(answer))])
  query = len(tokenizer.encode('Who fell?'))
  length = max(64, query + len(tokenizer.encode(CONTEXT)) + 3)  # One window holds it all.
  one = features.encode_squad(tokenizer, [example], length, doc_stride=8, max_query_length=16)
  assert one['input_ids'].shape == (1, length)
  assert one['input_ids'][0, 0] == tokenizer.cls_id
  assert one['input_ids'][0, query + 1] == tokenizer.sep_id
  s, e = one['start_position'][0], one['end_position'][0]
  assert one['answerable'][0] == 1
  assert CONTEXT[one['token_begin'][0, s]:one['token_end'][0, e]] == answer
  # Context tokens carry their segment and context_mask; the question's do not.
  assert one['context_mask'][0, s] == 1 and one['segment_ids'][0, s] == 1
  assert one['context_mask'][0, 0] == 0 and one['token_begin'][0, 0] == -1
  # Short windows: several per example; the answer is in some, [CLS] (0) in the others.
  many = features.encode_squad(tokenizer, [example], 24, doc_stride=4, max_query_length=16)
  assert len(many['example_index']) > 3 and set(many['example_index'].tolist()) == {0}
  hits = np.flatnonzero(many['answerable'])
  assert hits.size >= 1 and (many['start_position'][many['answerable'] == 0] == 0).all()
  for f in hits:
    s, e = many['start_position'][f], many['end_position'][f]
    assert CONTEXT[many['token_begin'][f, s]:many['token_end'][f, e]] == answer


@pytest.mark.parametrize('answer', ['Louisa\u0301', 'Musgrove\u00ad', 'Louisa\u200b'])
def test_an_answer_ending_in_a_character_the_normaliser_deletes_keeps_it(any_tokenizer, answer):
  """A decomposed accent, a soft hyphen or a zero-width space ending an answer has no token
  of its own: the answer's span still reaches it (the official code answers whole words)."""
  context = f'Anne saw {answer} fall.'
  example = dict(id='q', question='Who fell?', context=context, is_impossible=False,
                 answers=[(answer, context.index(answer))])
  f = features.encode_squad(any_tokenizer, [example], 48, doc_stride=8, max_query_length=16)
  s, e = f['start_position'][0], f['end_position'][0]
  assert f['answerable'][0] == 1
  assert context[f['token_begin'][0, s]:f['token_end'][0, e]] == answer


def test_a_question_that_leaves_no_room_for_context_is_refused_not_windowed_forever(tokenizer):
  """Windows advance by at most their context room: with none, windowing would never end."""
  from electra_jax.finetune import settings  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match=r'config.max_seq_length=32 leaves no room for context '
                                      r'after config.max_query_length=29 .* above'):
    settings.resolve(ft_config(max_query_length=29), tasks.get_task('squad_v2'), 256)
  settings.resolve(ft_config(max_query_length=29), tasks.get_task('sst2'), 256)  # No question.
  assert settings.resolve(ft_config(max_query_length=28), tasks.get_task('squad_v1'), 256)
  with pytest.raises(ValueError, match='a window holds 0 context tokens'):
    features._windows(10, 0, 128)  # pylint: disable=protected-access
  question = ' '.join(['Elizabeth'] * 40) + '?'
  example = dict(id='q', question=question, context=CONTEXT, is_impossible=False, answers=[])
  with pytest.raises(ValueError, match='holds 0 context tokens'):
    features.encode_squad(tokenizer, [example], 32, doc_stride=128, max_query_length=29)
  # The least room validation allows: a window per context token.
  f = features.encode_squad(tokenizer, [example], 32, doc_stride=128, max_query_length=28)
  assert len(f['input_ids']) == len(tokenizer.encode(CONTEXT))
  assert (f['context_mask'].sum(1) == 1).all()


def test_span_head_shapes_and_end_conditioned_on_start(tokenizer):
  task = tasks.TASKS['squad_v2']
  model = _model(task, num_layers=1)
  example = dict(id='q', question='Who fell?', context=CONTEXT, is_impossible=False,
                 answers=[('Louisa', CONTEXT.index('Louisa'))])
  f = features.encode_squad(tokenizer, [example, dict(example, id='r')], 48, 16, 16)
  inputs = loop._model_inputs(f)  # pylint: disable=protected-access
  batch = {k: jnp.asarray(v) for k, v in inputs.items()}
  # Jitted: eager op-by-op dispatch of a whole model is slow on a busy CPU.
  params = jax.jit(lambda r: model.init({'params': r}, batch)['params'])(jax.random.key(0))
  start, end, answerable = jax.jit(lambda p: model.apply({'params': p}, batch))(params)
  assert start.shape == end.shape == (2, 48) and answerable.shape == (2,)
  # Spans start in the context or at [CLS] (a window without the answer's target).
  outside = np.asarray(batch['context_mask'] == 0).copy()
  outside[:, 0] = False
  assert (np.asarray(start)[outside] < -1e8).all() and (np.asarray(start)[:, 0] > -1e8).all()
  # The loss of a window without the answer is the [CLS] target's: finite, and it trains.
  f['start_position'][1] = f['end_position'][1] = f['answerable'][1] = 0
  no_answer = dict(batch, start_position=jnp.asarray(f['start_position']),
                   end_position=jnp.asarray(f['end_position']),
                   answerable=jnp.asarray(f['answerable']))
  outputs = jax.jit(lambda p: model.apply({'params': p}, no_answer))(params)
  losses = steps.per_example_loss(task, outputs, no_answer, 0.5)
  start, end, answerable = (np.asarray(o[1], np.float64) for o in outputs)
  log_softmax = lambda x: x - np.log(np.sum(np.exp(x - x.max()))) - x.max()
  span = -0.5 * (log_softmax(start)[0] + log_softmax(end)[0])
  assert 1.0 < span < 10.0  # Probability on [CLS] well above zero: a learnable target.
  assert losses[1] == pytest.approx(span + 0.5 * np.log1p(np.exp(answerable)), rel=1e-4)
  beam = jax.jit(lambda p: model.apply({'params': p}, batch, 5, 3,
                                       method=model.span_beam))(params)
  s_lp, s_idx, e_lp, e_idx = (beam[k] for k in ('start_score', 'start_index', 'end_score',
                                                'end_index'))
  assert beam['answerable_prob'].shape == (2,)
  assert s_idx.shape == s_lp.shape == (2, 5) and e_idx.shape == e_lp.shape == (2, 5, 5)
  valid = e_lp > -1e8
  gap = np.asarray(e_idx) - np.asarray(s_idx)[..., None]
  assert ((gap >= 0) & (gap < 3))[np.asarray(valid)].all()
  # End logits depend on the start they are conditioned on.
  head = heads.SpanHead(32)

  @jax.jit
  def end_logits(p):
    hidden = model.apply({'params': p}, batch, True, method=model.hidden)
    return head.apply({'params': p['head']}, hidden, batch['context_mask'],
                      jnp.array([[20, 25], [20, 25]]), method=head.end_logits)
  ends = end_logits(params)
  assert not np.allclose(ends[:, 0], ends[:, 1])


def test_the_official_span_head_is_the_official_releases(tokenizer):
  """512-wide GELU layers without a LayerNorm; answerability labelled per question on every
  window, trained for SQuAD 1.1 too; no answer below the official logit threshold of 2.75."""
  answer = 'Louisa Musgrove'
  example = dict(id='q', question='Who fell?', context=CONTEXT, is_impossible=False,
                 answers=[(answer, CONTEXT.index(answer))])
  f = features.encode_squad(tokenizer, [example], 24, doc_stride=4, max_query_length=16)
  assert f['question_answerable'].all() and 0 < f['answerable'].sum() < len(f['answerable'])
  inputs = loop._model_inputs(f)  # pylint: disable=protected-access
  batch = {k: jnp.asarray(v) for k, v in inputs.items()}
  c = config_lib.resolve(tiny_config(vocab_size=8000, num_layers=1))
  for task in (tasks.TASKS['squad_v1'], tasks.TASKS['squad_v2']):
    model = loop.make_model(task, model_lib.ModelConfig.from_config(c), span_head='official')
    params = jax.jit(lambda r, m=model: m.init({'params': r}, batch)['params'])(
        jax.random.key(0))
    head = params['head']
    assert head['end_dense']['kernel'].shape == (64, 512) and 'end_LayerNorm' not in head
    assert head['answer_dense']['kernel'].shape == (64, 512)
    outputs = jax.jit(lambda p, m=model: m.apply({'params': p}, batch))(params)
    span_only = steps.per_example_loss(task, outputs, batch, 0.0, 'official')
    official = steps.per_example_loss(task, outputs, batch, 0.5, 'official')
    bce = optax.sigmoid_binary_cross_entropy(outputs[2], 1.0)  # every window: answerable
    np.testing.assert_allclose(official, span_only + 0.5 * bce, rtol=1e-5)
    xlnet = steps.per_example_loss(task, outputs, batch, 0.5, 'xlnet')
    window = optax.sigmoid_binary_cross_entropy(outputs[2], batch['answerable'])
    np.testing.assert_allclose(
        xlnet, span_only + (0.5 * window if task.name == 'squad_v2' else 0.0), rtol=1e-5)
  assert spans.NULL_THRESHOLDS['official'] == pytest.approx(1 / (1 + np.exp(-2.75)))
  from electra_jax.finetune import settings  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError,
                     match="config.span_head='albert' is not one of xlnet, official, bert"):
    settings.resolve(ft_config(span_head='albert'), tasks.get_task('squad_v2'), 256)
  from configs.finetune import official  # pylint: disable=import-outside-toplevel
  assert official.get_config().span_head == 'official'


def test_classifier_pooling_reads_cls_or_the_mean_of_real_tokens_only():
  hidden = jax.random.normal(jax.random.key(0), (2, 5, 4))
  mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(heads.pool(hidden, mask, 'cls'), hidden[:, 0])
  mean = heads.pool(hidden, mask, 'mean')
  np.testing.assert_allclose(mean[0], hidden[0, :3].mean(0), rtol=1e-6)
  np.testing.assert_allclose(mean[1], hidden[1].mean(0), rtol=1e-6)
  # Padding never reaches the head; every real token does.
  padded = hidden.at[0, 3:].set(100.0)
  np.testing.assert_array_equal(heads.pool(padded, mask, 'mean')[0], mean[0])
  assert not np.allclose(heads.pool(hidden.at[0, 2].set(100.0), mask, 'mean')[0], mean[0])
  # Through the model: the head gets the batch's input_mask (padded positions have hidden
  # states of their own, which an unmasked mean would read).
  task = tasks.TASKS['sst2']
  c = config_lib.resolve(tiny_config(vocab_size=8000, num_layers=1))
  batch = dict(input_ids=jnp.array([[2, 10, 11, 3, 0]]), segment_ids=jnp.zeros((1, 5), jnp.int32),
               input_mask=jnp.array([[1, 1, 1, 1, 0]]))
  for pooling in heads.POOLINGS:
    model = loop.make_model(task, model_lib.ModelConfig.from_config(c), pooling)
    params = jax.jit(lambda r, m=model: m.init({'params': r}, batch)['params'])(
        jax.random.key(0))
    logits = jax.jit(lambda p, b, m=model: m.apply({'params': p}, b))
    base = logits(params, batch)
    assert base.shape == (1, 2)
    np.testing.assert_allclose(logits(params, dict(batch, input_ids=batch['input_ids'].at[0, 4]
                                                   .set(50))), base, rtol=1e-6)
  from electra_jax.finetune import settings  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match="config.classifier_pooling='max' is not one of cls, mean"):
    settings.resolve(ft_config(classifier_pooling='max'), tasks.get_task('sst2'), 256)


def test_head_init_normal_is_berts_and_glorot_the_official_releases():
  hidden = jnp.zeros((1, 4, 512))
  mask = jnp.ones((1, 4), jnp.int32)
  for head_init, check in (
      ('normal', lambda k: np.abs(k).max() <= 0.04 and abs(k.std() - 0.0176) < 0.002),
      # Glorot-uniform: U(-l, l), l = sqrt(6 / (fan_in + fan_out)), std l / sqrt(3).
      ('glorot', lambda k: np.abs(k).max() <= np.sqrt(6 / 1536) and abs(
          k.std() - np.sqrt(2 / 1536)) < 0.002)):
    head = heads.ClassificationHead(1024, 0.0, pooling='cls', head_init=head_init)
    params = head.init(jax.random.key(0), hidden, mask, True)['params']
    assert check(np.asarray(params['output']['kernel'])), head_init
    span = heads.SpanHead(512, head_init=head_init)
    params = span.init(jax.random.key(0), hidden, mask, jnp.zeros((1,), jnp.int32))['params']
    kernel = np.asarray(params['end_dense']['kernel'])  # fan in 1024, fan out 512
    limit = 0.04 if head_init == 'normal' else np.sqrt(6 / 1536)
    assert np.abs(kernel).max() <= limit
  from electra_jax.finetune import settings  # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match="config.head_init='xavier' is not one of normal, glorot"):
    settings.resolve(ft_config(head_init='xavier'), tasks.get_task('sst2'), 256)
  from configs.finetune import official  # pylint: disable=import-outside-toplevel
  assert official.get_config().head_init == 'glorot'


def test_a_nan_main_metric_ranks_below_every_number_in_best_epoch_and_seed_selection():
  """A diverged regression's Spearman is NaN; compared with `>`, a NaN first epoch was never
  replaced by a later finite one, and max() over seeds kept whichever came first."""
  from electra_jax.finetune import saved_run  # pylint: disable=import-outside-toplevel
  nan = float('nan')
  history = [dict(epoch=1, eval_spearman=nan), dict(epoch=2, eval_spearman=0.5),
             dict(epoch=3, eval_spearman=nan), dict(epoch=4, eval_spearman=0.5)]
  best = loop._best_record  # pylint: disable=protected-access
  assert best(history, 'eval_spearman')['epoch'] == 2
  assert best(history[:1], 'eval_spearman')['epoch'] == 1
  run = saved_run.FinetunedRun(workdir='', config=None, task=tasks.named_files_task(()),
                               model_config=None, network=None, tokenizer=None, runs=[
                                   dict(seed=0, best=dict(eval_spearman=nan)),
                                   dict(seed=1, best=dict(eval_spearman=-0.2))])
  assert run.best_seed() == 1


def test_span_decoding_picks_the_best_candidate_across_windows():
  context = 'alpha beta gamma delta'
  # Two windows of one example; tokens 1..4 are the four words (spans), 0 is [CLS].
  spans_ = [(0, 5), (6, 10), (11, 16), (17, 22)]
  begin = np.full((2, 6), -1)
  end = np.full((2, 6), -1)
  for j, (b, e) in enumerate(spans_):
    begin[:, j + 1], end[:, j + 1] = b, e
  feats = dict(example_index=np.array([0, 0]), token_begin=begin, token_end=end,
               token_is_max_context=np.ones((2, 6), np.int32))
  outputs = dict(
      start_index=np.array([[2, 1], [1, 3]]),
      start_score=np.array([[-0.5, -1.0], [-0.2, -2.0]]),
      end_index=np.array([[[3, 2], [1, 4]], [[0, 2], [4, 3]]]),
      end_score=np.array([[[-0.1, -0.3], [-0.5, -0.2]], [[-0.01, -0.5], [-0.1, -0.1]]]),
      answerable_prob=np.array([0.3, 0.7]))
  examples = [dict(id='q', context=context)]
  # Token j+1 is word j. Window 0: (2, 3) scores -0.6, (2, 2) -0.8, (1, 1) -1.5, (1, 4) is
  # too long. Window 1: (1, 0) ends before it starts ([CLS]), (1, 2) -0.7, (3, 3) -2.1.
  got = spans.decode(feats, outputs, examples, max_answer_length=3, squad_v2=False).answers
  assert got == {'q': 'beta gamma'}
  # One-token answers only: (2, 2) = 'beta' beats (1, 1) and window 1's (3, 3).
  got = spans.decode(feats, outputs, examples, max_answer_length=1, squad_v2=False).answers
  assert got == {'q': 'beta'}
  # A more confident start in window 1 makes its (1, 2) the best overall: -0.55.
  outputs['start_score'] = np.array([[-0.5, -1.0], [-0.05, -2.0]])
  assert spans.decode(feats, outputs, examples, 3, squad_v2=False).answers == {
      'q': 'alpha beta'}
  outputs['start_score'] = np.array([[-0.5, -1.0], [-0.2, -2.0]])
  # SQuAD 2.0: some window is confident enough there is an answer (0.7) -> keep it.
  assert spans.decode(feats, outputs, examples, 3, squad_v2=True).answers == {
      'q': 'beta gamma'}
  outputs['answerable_prob'] = np.array([0.3, 0.4])
  assert spans.decode(feats, outputs, examples, 3, squad_v2=True).answers == {'q': ''}
  assert spans.decode(feats, outputs, examples, 3, squad_v2=True).best_spans == {
      'q': 'beta gamma'}
  # The official script's no-answer probability: 1 - the most confident window's.
  assert spans.decode(feats, outputs, examples, 3, squad_v2=True).no_answer == {
      'q': pytest.approx(0.6)}
  # A start is read only in the window where it has the most context: with 'beta' (token 2)
  # at home in window 1, window 0's (2, 3) and (2, 2) drop out; window 1's (1, 2) wins.
  feats['token_is_max_context'][0, 2] = 0
  assert spans.decode(feats, outputs, examples, 3, squad_v2=False).answers == {
      'q': 'alpha beta'}


def test_each_context_token_starts_spans_in_exactly_one_window_the_most_central(tokenizer):
  example = dict(id='q', question='Who fell?', context=CONTEXT, is_impossible=False,
                 answers=[])
  f = features.encode_squad(tokenizer, [example], 24, doc_stride=4, max_query_length=16)
  home = f['token_is_max_context'].astype(bool)
  assert not home[f['context_mask'] == 0].any()
  # Keyed by character span: each context token is at home in one window ...
  owners = {}
  for w in range(len(f['example_index'])):
    for j in np.flatnonzero(f['context_mask'][w]):
      owners.setdefault(int(f['token_begin'][w, j]), []).append((w, j, bool(home[w, j])))
  assert all(sum(h for _, _, h in seen) == 1 for seen in owners.values())
  # ... the one where its shorter side of context is longest (ties: the first window).
  for seen in owners.values():
    def side(w, j):
      positions = np.flatnonzero(f['context_mask'][w])
      return min(j - positions[0], positions[-1] - j) + 0.01 * len(positions)
    best = max(seen, key=lambda s: (side(s[0], s[1]), -s[0]))
    assert best[2]
  # Windows without the answer (all of them here) target [CLS].
  assert not f['start_position'].any() and not f['answerable'].any()


# --- Initialisation from a pretraining workdir ---------------------------------------------------

@pytest.fixture(scope='module')
def pretrain_workdir(tmp_path_factory):
  """A tiny pretraining workdir (config.json + one Orbax checkpoint) with the demo vocabulary."""
  workdir = str(tmp_path_factory.mktemp('pretrained'))
  c = config_lib.resolve(tiny_config(vocab_size=8000, vocab_file=VOCAB))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  tx, _ = optim.make_optimizer(c)
  mesh = parallel.make_mesh()
  state = ts.init_state(mesh, jax.random.key(42), model, tx, c.max_seq_length,
                        c.max_predictions_per_seq)
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, 'checkpoints'))
  ckpt.save(7, state, force=True)
  ckpt.close()
  saved_config.write(workdir, c)
  return workdir, jax.device_get(state.params)


def test_load_pretrained_keeps_embeddings_and_discriminator_encoder(pretrain_workdir):
  workdir, saved = pretrain_workdir
  params, model_config = pretrained.load_pretrained(workdir)
  jax.tree.map(np.testing.assert_array_equal, pretrained.load_pretrained(workdir, 7)[0], params)
  with pytest.raises(UserError, match=r'step 8 is not a checkpoint in .*; available: \[7\]'):
    pretrained.load_pretrained(workdir, 8)
  assert set(params) == {'embeddings', 'discriminator'}
  assert set(params['discriminator']) == {'encoder'}  # generator and RTD head dropped
  assert model_config.hidden_size == 32 and model_config.num_layers == 2
  for path, value in jax.tree_util.tree_leaves_with_path(params):
    expected = saved
    for key in path:
      expected = expected[key.key]
    np.testing.assert_array_equal(value, expected)
  # random_init: the same shape and vocabulary, no pretrained weights.
  c = ft_config(init_checkpoint=workdir, random_init=True)
  _, random_config, tok = loop._network(c)  # pylint: disable=protected-access
  assert loop._pretrained_params(c, None) is None  # pylint: disable=protected-access
  assert random_config.hidden_size == 32 and tok.vocab_size == 8000
  assert random_config.dropout_rate == c.dropout_rate


def test_a_transformers_directory_starts_from_the_same_weights_as_its_workdir(pretrain_workdir,
                                                                              tmp_path):
  pytest.importorskip('transformers')
  from electra_jax import export  # pylint: disable=import-outside-toplevel
  from electra_jax.hf import files as hf_files  # pylint: disable=import-outside-toplevel
  workdir, _ = pretrain_workdir
  hf_dir = str(tmp_path / 'hf')
  export.export_workdir(workdir, hf_dir)
  assert hf_files.is_hf_dir(hf_dir)
  from_hf, hf_config = pretrained.load_pretrained(hf_dir)
  from_workdir, workdir_config = pretrained.load_pretrained(workdir)
  assert hf_config.hidden_size == workdir_config.hidden_size
  assert hf_config.num_layers == workdir_config.num_layers
  assert jax.tree.structure(from_hf) == jax.tree.structure(from_workdir)
  jax.tree.map(np.testing.assert_array_equal, from_hf, from_workdir)


def test_inputs_from_a_transformers_directory_are_what_its_own_tokenizer_makes(
    bert_layout_vocab, tmp_path):
  """Fine-tuning a released-style directory (WordPiece, [CLS] at 12 not 2) feeds the model
  exactly the ids, segments and mask transformers' tokenizer of that directory makes."""
  transformers = pytest.importorskip('transformers')
  from tests import hf_pair  # pylint: disable=import-outside-toplevel
  hf_dir = str(tmp_path / 'disc')
  hf_pair.save_pair(hf_dir, str(tmp_path / 'gen'), bert_layout_vocab)
  _, ours = pretrained.network_config(ft_config(init_checkpoint=hf_dir))
  pairs = [('Emma Woodhouse, handsome, clever, and rich!', 'She had lived nearly twenty-one '
            'years in the world with very little to distress or vex her.'),
           ('Mr. Knightley, a sensible man about seven or eight-and-thirty,', 'was a very old '
            'and intimate friend of the family.')]
  got = features.encode_classification(
      ours, [dict(text_a=a, text_b=b, label=0) for a, b in pairs], 96, regression=False)
  theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)(
      [a for a, _ in pairs], [b for _, b in pairs], max_length=96, padding='max_length')
  assert got['input_ids'].tolist() == theirs['input_ids']
  assert got['segment_ids'].tolist() == theirs['token_type_ids']
  assert got['input_mask'].tolist() == theirs['attention_mask']
  assert got['input_ids'][0, 0] == 12 and not got['input_mask'][:, -1].any()  # Not truncated.


def test_pairs_are_truncated_as_the_official_code_does():
  """ELECTRA's (BERT's) _truncate_seq_pair: the longer loses its last token, B on a tie
  (transformers' fast tokenizers split a tie the other way)."""
  for a, b, limit, want in (([1, 2, 3], [4, 5, 6], 5, ([1, 2, 3], [4, 5])),
                            ([1, 2, 3, 4, 5], [6, 7], 5, ([1, 2, 3], [6, 7])),
                            ([1], [2, 3, 4, 5], 3, ([1], [2, 3])),
                            ([1, 2, 3], [4, 5, 6], 4, ([1, 2], [4, 5]))):
    features._truncate_pair(a, b, limit)  # pylint: disable=protected-access
    assert (a, b) == want


# --- End to end ---------------------------------------------------------------------------------

def _write_sentiment(path, n, seed):
  """A toy task a tiny model learns in two epochs: the words decide the label."""
  rng = np.random.default_rng(seed)
  good = ['happy', 'kind', 'lovely', 'cheerful']
  bad = ['sad', 'cruel', 'awful', 'gloomy']
  filler = ['the', 'day', 'was', 'and', 'very', 'house']
  lines = ['text\tlabel']
  for _ in range(n):
    label = rng.integers(2)
    words = list(rng.choice(filler, 4)) + list(rng.choice(good if label else bad, 2))
    rng.shuffle(words)
    lines.append(' '.join(words) + '\t' + ('good' if label else 'bad'))
  path.write_text('\n'.join(lines) + '\n')


def run_cli(*flags, check=True, timeout=600):
  env = dict(os.environ, PYTHONUNBUFFERED='1', JAX_PLATFORMS='cpu',
             PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  proc = subprocess.run([sys.executable, '-m', 'electra_jax.finetune', *flags], cwd=REPO_ROOT,
                        env=env, capture_output=True, text=True, timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f'finetune failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}')
  return proc


def test_a_diverged_seed_ends_with_its_epochs_and_the_other_seeds_go_on(tmp_path,
                                                                       pretrain_workdir):
  """Fine-tuning takes every step, so NaN weights stay NaN: the seed stops at that epoch's
  end, recorded (its NaN ranks last), instead of the whole run failing at the next save."""
  rng = np.random.default_rng(0)
  lines = ['text\tlabel'] + [f'{w} day\t{rng.uniform(0, 5):.2f}'
                             for w in rng.choice(['good', 'bad', 'fine', 'grim'], 64)]
  (tmp_path / 'scores.tsv').write_text('\n'.join(lines) + '\n')
  proc = run_cli('--config=configs/finetune/files.py', f'--config.train_file={tmp_path}/scores.tsv',
                 f'--config.eval_file={tmp_path}/scores.tsv', '--config.max_seq_length=16',
                 '--config.train_batch_size=16', '--config.num_epochs=2', '--config.num_seeds=2',
                 '--config.learning_rate=1e30', '--config.progress_bar=false',
                 f'--config.init_checkpoint={pretrain_workdir[0]}', f'--workdir={tmp_path}/out')
  for seed in (0, 1):
    assert f'seed {seed} diverged in epoch 1 (NaN/inf weights) and stops there' in proc.stdout
  strict = lambda constant: pytest.fail(f'{constant} in the JSON line')
  summary = json.loads(proc.stdout.strip().splitlines()[-1], parse_constant=strict)
  assert summary['best_spearman_per_seed'] == [None, None]
  with open(tmp_path / 'out' / 'results.json', encoding='utf-8') as f:
    runs = json.load(f)['runs']
  assert [(r['seed'], r['diverged_in_epoch'], r['checkpoint']) for r in runs] == [
      (0, 1, None), (1, 1, None)]
  assert not os.listdir(tmp_path / 'out' / 'seed_0' / 'best')
  # NaN weights predict nothing: the epoch's eval metrics are NaN (an earlier finite epoch, had
  # there been one, stays the best), and predict names the divergence.
  (row,) = [json.loads(line) for line in open(tmp_path / 'out' / 'seed_0' / 'metrics.jsonl',
                                               encoding='utf-8')]
  assert all(v is None for k, v in row.items() if k.startswith('eval_'))  # JSON's NaN: null.
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT)
  predict = subprocess.run(
      [sys.executable, '-m', 'electra_jax.predict', f'--workdir={tmp_path}/out',
       f'--output={tmp_path}/predictions', f'--input={tmp_path}/scores.tsv'], cwd=REPO_ROOT,
      env=env, capture_output=True, text=True, timeout=600, check=False)
  assert predict.returncode == 2 and predict.stderr.strip().splitlines() == [
      f'error: seed 0 of {tmp_path}/out diverged in epoch 1 before any finite epoch, so it has '
      'no checkpoint; so did every seed: fine-tune again with a lower config.learning_rate']


def test_predict_names_the_seeds_it_can_read_and_why_one_has_no_checkpoint(tmp_path):
  """"Pick another --seed" listed every seed, those without a checkpoint too."""
  from electra_jax.finetune import saved_run  # pylint: disable=import-outside-toplevel
  runs = [dict(seed=0, diverged_in_epoch=2, checkpoint=None),
          dict(seed=1, diverged_in_epoch=None, checkpoint='kept'),
          dict(seed=2, diverged_in_epoch=3, checkpoint='kept before it diverged')]
  run = saved_run.FinetunedRun(str(tmp_path), ml_collections.ConfigDict(dict(
      save_best_checkpoint=True)), None, None, None, None, runs)
  with pytest.raises(UserError, match=re.escape(
      'diverged in epoch 2 before any finite epoch, so it has no checkpoint; pick another --seed '
      '(those with a checkpoint: [1, 2])')):
    run.read_params(0)
  with pytest.raises(UserError, match=re.escape(
      f"{tmp_path}/seed_1/best does not exist: seed 1's checkpoint was moved or deleted")):
    run.read_params(1)
  run.config = ml_collections.ConfigDict(dict(save_best_checkpoint=False))
  with pytest.raises(UserError, match=re.escape(
      f'{tmp_path} kept no checkpoint (config.save_best_checkpoint=false)')):
    run.read_params(0)


@pytest.fixture(scope='module')
def finetuned(tmp_path_factory, pretrain_workdir):
  """Two seeds x two epochs of the CLI from the tiny pretraining workdir on the toy task."""
  root = tmp_path_factory.mktemp('ft')
  _write_sentiment(root / 'train.tsv', 256, 0)
  _write_sentiment(root / 'eval.tsv', 64, 1)
  flags = ['--config=configs/finetune/files.py', f'--config.train_file={root}/train.tsv',
           f'--config.eval_file={root}/eval.tsv', '--config.max_seq_length=16',
           '--config.train_batch_size=16', '--config.num_epochs=3', '--config.num_seeds=2',
           '--config.learning_rate=5e-3', '--config.dropout_rate=0.0',
           '--config.attention_dropout_rate=0.0', '--config.progress_bar=false']
  out = str(root / 'out')
  proc = run_cli(*flags, f'--config.init_checkpoint={pretrain_workdir[0]}', f'--workdir={out}')
  return dict(root=root, flags=flags, out=out, proc=proc)


def test_cli_trains_every_seed_and_ends_with_a_json_summary(finetuned):
  summary = json.loads(finetuned['proc'].stdout.strip().splitlines()[-1])
  assert summary['task'] == 'files' and summary['num_seeds'] == 2
  assert summary['label_names'] == ['bad', 'good'] and not summary['random_init']
  per_seed = summary['best_accuracy_per_seed']
  assert len(per_seed) == 2 and summary['median_best_accuracy'] == pytest.approx(
      np.median(per_seed))
  assert summary['median_best_accuracy'] > 0.8  # the toy task is learnable
  with open(os.path.join(finetuned['out'], 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  assert [r['seed'] for r in results['runs']] == [0, 1]
  for seed in (0, 1):
    with open(os.path.join(finetuned['out'], f'seed_{seed}', 'metrics.jsonl'),
              encoding='utf-8') as f:
      rows = [json.loads(line) for line in f]
    assert [r['epoch'] for r in rows] == [1, 2, 3]
    assert {'train_loss', 'eval_loss', 'eval_accuracy', 'eval_f1', 'eval_mcc'} <= set(rows[0])


def test_finetuning_lowers_eval_loss_and_the_best_checkpoint_reproduces_its_score(
    finetuned, pretrain_workdir, tokenizer):
  with open(os.path.join(finetuned['out'], 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  c = ml_collections.ConfigDict(results['config'])
  task = tasks.files_task(tasks.read_rows(c.train_file))
  data = loop.load_data(c, tasks.TASKS['files'], tokenizer)
  enc, model_config = pretrained.load_pretrained(pretrain_workdir[0])
  model = loop.make_model(task, pretrained.with_run_settings(model_config, c))
  mesh = parallel.make_mesh()
  predict = ts.jit_eval_step(loop.steps.make_predict(model, task, c), mesh)
  run = results['runs'][0]
  initial = loop.init_params(model, data.train, jax.random.key(run['seed']), enc)
  before = loop.predict_all(predict, initial, data.evals[0].features, 32, mesh)
  assert run['final']['eval_loss'] < float(np.mean(before['loss'])) - 0.05
  best_dir = os.path.join(finetuned['out'], 'seed_0', 'best')
  assert os.listdir(best_dir) == [str(run['best']['step'])]  # only the best epoch is kept
  best_ckpt = checkpoint.Checkpointer(best_dir, read_only=True)
  best = best_ckpt.read_state(run['best']['step'])
  best_ckpt.close()
  outputs = loop.predict_all(predict, best, data.evals[0].features, 32, mesh)
  scores = loop.score(task, c, data.evals[0], outputs)
  assert scores['accuracy'] == pytest.approx(run['best']['eval_accuracy'])


def test_cli_refuses_to_overwrite_results_and_reports_bad_input(finetuned):
  again = run_cli(*finetuned['flags'], '--config.random_init=true', '--config.model_size=demo',
                  f'--workdir={finetuned["out"]}', check=False)
  assert again.returncode == 2 and 'already holds fine-tuning results' in again.stderr
  (finetuned['root'] / 'bad.csv').write_text('sentence,label\nhi,a\n')
  bad = run_cli('--config=configs/finetune/files.py', '--config.random_init=true',
                f'--config.train_file={finetuned["root"]}/bad.csv',
                f'--workdir={finetuned["root"]}/bad', check=False)
  assert bad.returncode == 2 and 'Traceback' not in bad.stderr
  assert bad.stderr.strip().splitlines()[-1].startswith(
      f"error: file '{finetuned['root']}/bad.csv' lacks column(s) text (or text_a)")
  unknown = run_cli('--config=configs/finetune/glue.py', '--config.lerning_rate=1e-4',
                    f'--workdir={finetuned["root"]}/x', check=False)
  assert unknown.returncode != 0 and 'lerning_rate' in unknown.stderr


def test_paper_defaults_fill_by_model_size_and_task():
  from electra_jax.finetune import settings  # pylint: disable=import-outside-toplevel
  small = settings.resolve(ft_config(num_epochs=None), tasks.get_task('rte'), 256)
  assert (small.learning_rate, small.layerwise_lr_decay, small.num_epochs) == (3e-4, 0.8, 10)
  large = settings.resolve(ft_config(num_epochs=None, max_seq_length=512),
                           tasks.get_task('squad_v2'), 1024)
  assert (large.learning_rate, large.layerwise_lr_decay, large.num_epochs) == (5e-5, 0.9, 2)
  base = settings.resolve(ft_config(learning_rate=2e-5, num_epochs=None),
                          tasks.get_task('sst2'), 768)
  assert (base.learning_rate, base.layerwise_lr_decay, base.num_epochs) == (2e-5, 0.8, 3)
  for bad in ('a,b,c', 'a, a'):
    with pytest.raises(UserError, match=f"config.text_columns='{bad}' must name one column, or "
                                        'two different ones'):
      settings.resolve(ft_config(text_columns=bad), tasks.get_task('files'), 256)
  with pytest.raises(UserError, match=r"text_columns='text,label' names the label column 'label'"):
    settings.resolve(ft_config(text_columns='text,label'), tasks.get_task('files'), 256)
  with pytest.raises(UserError, match=r'config.layerwise_lr_decay=1.5 must be in \(0, 1\]'):
    settings.resolve(ft_config(layerwise_lr_decay=1.5), tasks.get_task('sst2'), 256)
  # The optimizer's numbers as pretraining checks them: each trained (a negative max_grad_norm
  # quietly without clipping, learning_rate=inf to a diverged seed).
  for key, value, rule in [('max_grad_norm', -1.0, '>= 0 (0: no clipping)'),
                           ('adam_b2', 1.5, 'in [0, 1)'), ('adam_epsilon', -1.0, '> 0'),
                           ('learning_rate', float('inf'), '> 0'),
                           ('weight_decay_rate', float('nan'), '>= 0'),
                           ('answerable_weight', float('inf'), '>= 0')]:
    with pytest.raises(UserError, match=re.escape(f'config.{key}={value} must be {rule}')):
      settings.resolve(ft_config(**{key: value}), tasks.get_task('sst2'), 256)
  # Windows: the official code's 128 tokens over SQuAD contexts; half the window for tagging.
  assert large.doc_stride == 128
  tagging = settings.resolve(ft_config(max_seq_length=128), tasks.get_task('conll2003'), 256)
  assert tagging.doc_stride == 63
  assert settings.resolve(ft_config(doc_stride=9), tasks.get_task('conll2003'), 256).doc_stride == 9
  with pytest.raises(UserError, match='config.doc_stride=0 must be a positive integer'):
    settings.resolve(ft_config(doc_stride=0), tasks.get_task('squad_v1'), 256)
  # Seeds repeat past 2**32 (jax.random.key wraps there), as pretraining refuses.
  settings.resolve(ft_config(seed=2**32 - 2, num_seeds=2), tasks.get_task('sst2'), 256)
  with pytest.raises(UserError, match=re.escape('config.seed=4294967295 with num_seeds=2 runs '
                                                'seeds past 2**32 - 1')):
    settings.resolve(ft_config(seed=2**32 - 1, num_seeds=2), tasks.get_task('sst2'), 256)


def test_without_checkpoint_or_random_init_the_error_says_what_to_set():
  with pytest.raises(UserError, match='set --config.init_checkpoint=WORKDIR'):
    loop._network(ft_config())  # pylint: disable=protected-access


def test_a_checkpoint_step_as_init_checkpoint_names_its_run_and_init_step(tmp_path):
  """train's init_from takes WORKDIR/checkpoints/STEP; fine-tuning takes the run and
  init_step, and said only that the step folder is no workdir."""
  step = tmp_path / 'run' / 'checkpoints' / '20'
  step.mkdir(parents=True)
  (tmp_path / 'run' / 'config.json').write_text('{}')
  with pytest.raises(UserError, match=re.escape(
      f"is a checkpoint step; pass its run and the step: --config.init_checkpoint="
      f"{tmp_path / 'run'} --config.init_step=20")):
    pretrained.pretraining_config(str(step))


# --- Predictions of a fine-tuned run -------------------------------------------------------------

def _read_tsv(path):
  with open(path, encoding='utf-8') as f:
    lines = f.read().splitlines()
  return lines[0], [line.split('\t') for line in lines[1:]]


def test_predict_reproduces_the_best_epochs_score_and_writes_every_example(finetuned, tmp_path):
  with open(os.path.join(finetuned['out'], 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  best_run = max(results['runs'], key=lambda r: (r['best']['eval_accuracy'], -r['seed']))
  proc = subprocess.run([sys.executable, '-m', 'electra_jax.predict',
                         f'--workdir={finetuned["out"]}', f'--output={tmp_path}/out',
                         f'--input={finetuned["root"]}/eval.tsv'], cwd=REPO_ROOT,
                        env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT),
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert (summary['seed'], summary['step']) == (best_run['seed'], best_run['best']['step'])
  (part,) = summary['parts']
  assert part['metrics']['accuracy'] == pytest.approx(best_run['best']['eval_accuracy'])
  assert part['metrics']['loss'] == pytest.approx(best_run['best']['eval_loss'], rel=1e-5)
  header, rows = _read_tsv(tmp_path / 'out' / 'eval.tsv')
  labels = [r[1] for r in _read_tsv(finetuned['root'] / 'eval.tsv')[1]]
  assert header == 'index\tprediction' and [r[0] for r in rows] == [str(i) for i in range(64)]
  assert np.mean([r[1] == y for r, y in zip(rows, labels)]) == pytest.approx(
      part['metrics']['accuracy'])
  with open(tmp_path / 'out' / 'eval.jsonl', encoding='utf-8') as f:
    details = [json.loads(line) for line in f]
  assert [d['prediction'] for d in details] == [r[1] for r in rows]
  assert [d['label'] for d in details] == labels
  for d in details:
    assert sum(d['probabilities'].values()) == pytest.approx(1, abs=1e-5)
    assert max(d['probabilities'], key=d['probabilities'].get) == d['prediction']
  again = subprocess.run(proc.args, cwd=REPO_ROOT, env=dict(os.environ, JAX_PLATFORMS='cpu',
                                                            PYTHONPATH=REPO_ROOT),
                         capture_output=True, text=True, timeout=600, check=False)
  assert again.returncode == 2 and again.stderr.strip().splitlines()[-1] == (
      f"error: --output '{tmp_path}/out' already holds eval.tsv, eval.jsonl; pass another "
      '--output or --overwrite')
  # A folder where a file goes is refused before anything is written, --overwrite or not.
  (tmp_path / 'folder' / 'eval.jsonl').mkdir(parents=True)
  folder = subprocess.run([*proc.args[:4], f'--output={tmp_path}/folder', *proc.args[5:],
                           '--overwrite'], cwd=REPO_ROOT,
                          env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT),
                          capture_output=True, text=True, timeout=600, check=False)
  assert folder.returncode == 2 and folder.stderr.strip().splitlines()[-1] == (
      f"error: --output '{tmp_path}/folder' holds a folder named eval.jsonl, where a prediction "
      'file goes; pass another --output or move it away')
  assert os.listdir(tmp_path / 'folder') == ['eval.jsonl']
  seeds = sorted(r['seed'] for r in results['runs'])
  no_seed = subprocess.run([*proc.args[:4], f'--output={tmp_path}/new/out', *proc.args[5:],
                            '--seed=99'], cwd=REPO_ROOT,
                           env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT),
                           capture_output=True, text=True, timeout=600, check=False)
  assert no_seed.returncode == 2 and no_seed.stderr.strip().splitlines()[-1] == (
      f'error: --seed=99 is not a run of {finetuned["out"]}; its seeds: {seeds}')
  assert not (tmp_path / 'new').exists()  # The folders it made for --output are gone.


def test_a_pair_task_on_a_network_of_one_segment_is_refused_before_anything_is_written(
    tmp_path, monkeypatch):
  """A released network with type_vocab_size=1 fed a pair: segment id 1 read NaN rows (the
  run 'diverged', with advice to lower the learning rate); one line instead."""
  from electra_jax.finetune import loop, pretrained  # pylint: disable=import-outside-toplevel
  one_segment = pretrained.config_for_size

  def config_for_size(model_size, vocab_size):
    c = one_segment(model_size, vocab_size)
    c.unlock()
    c.type_vocab_size = 1
    return c
  monkeypatch.setattr(pretrained, 'config_for_size', config_for_size)
  rows = 'text_a\ttext_b\tlabel\n' + ''.join(f'a{i}\tb{i}\t{i % 2}\n' for i in range(16))
  (tmp_path / 'pairs.tsv').write_text(rows)
  c = ft_config(task='files', train_file=str(tmp_path / 'pairs.tsv'),
                eval_file=str(tmp_path / 'pairs.tsv'), random_init=True, model_size='demo')
  with pytest.raises(UserError, match=r'^this task feeds segment id 1 \(a second text, or '
                                      r"tag_head='official'\), but the network has "
                                      'type_vocab_size=1; use a single-text task'):
    loop.finetune(c, str(tmp_path / 'ft'))
  assert not (tmp_path / 'ft').exists()


def test_predictions_never_go_into_a_runs_own_folders(tmp_path):
  """`--output=FT_DIR/seed_0 --overwrite` with an input named metrics.*: the seed's
  metrics.jsonl was replaced by predictions. A run's (or model's) folder and the fine-tuning
  run's seed and network folders are refused; a folder of its own inside the run is fine."""
  # pylint: disable-next=import-outside-toplevel
  from electra_jax.finetune import predictions, saved_run, tasks
  workdir = tmp_path / 'ft'
  (workdir / 'seed_0' / 'best').mkdir(parents=True)
  (workdir / 'network').mkdir()
  (workdir / 'checkpoints').mkdir()
  (workdir / 'config.json').write_text('{"task": "sst2"}')
  (tmp_path / 'pretrained').mkdir()
  (tmp_path / 'pretrained' / 'config.json').write_text('{}')
  parts = [predictions.Part('metrics', [], True, source=str(tmp_path / 'metrics.tsv'))]
  task = tasks.get_task('sst2')
  check = lambda output: predictions.check_output(str(output), task, parts, True)
  (tmp_path / 'pretrained' / 'checkpoints' / '20').mkdir(parents=True)
  for output, message in [
      (workdir, f"holds a run or a model ({workdir}/config.json)"),
      (tmp_path / 'pretrained', f"holds a run or a model ({tmp_path}/pretrained/config.json)"),
      (workdir / 'seed_0', f"lies in seed_0/ of the run in '{workdir}'"),
      (workdir / 'seed_0' / 'best' / 'x', f"lies in seed_0/ of the run in '{workdir}'"),
      (workdir / 'network', f"lies in network/ of the run in '{workdir}'"),
      (workdir / 'checkpoints' / 'p', f"lies in checkpoints/ of the run in '{workdir}'"),
      # Another run's checkpoint step, which its rotation deletes.
      (tmp_path / 'pretrained' / 'checkpoints' / '20',
       f"lies in checkpoints/ of the run in '{tmp_path / 'pretrained'}'")]:
    with pytest.raises(UserError, match=re.escape(f"--output '{output}' {message}")):
      check(output)
  assert check(workdir / 'predictions') == str(workdir / 'predictions')
  # A pretraining run has no network/ or seed folders: a folder of that name is the user's.
  run = tmp_path / 'pretraining'
  (run / 'network').mkdir(parents=True)
  (run / 'config.json').write_text('{"model_size": "demo"}')
  assert saved_run.run_folder_holding(str(run), str(run / 'network')) is None
  assert saved_run.run_folder_holding(str(workdir), str(workdir / 'network' / 'x')) == 'network'


def test_predict_never_writes_over_its_input_file(finetuned, tmp_path):
  """--output=the input's folder would write eval.tsv over the input eval.tsv: refused before
  anything is written, --overwrite or not (that is for old predictions), symlinks resolved."""
  data = tmp_path / 'data'
  data.mkdir()
  original = (finetuned['root'] / 'eval.tsv').read_bytes()
  (data / 'eval.tsv').write_bytes(original)
  (tmp_path / 'link').symlink_to(data)
  proc = subprocess.run([sys.executable, '-m', 'electra_jax.predict',
                         f'--workdir={finetuned["out"]}', f'--output={tmp_path}/link',
                         f'--input={data}/eval.tsv', '--overwrite'], cwd=REPO_ROOT,
                        env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT),
                        capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
      f"error: --output '{tmp_path}/link' would write eval.tsv over the input file "
      f"'{data}/eval.tsv'; pass another --output")
  assert os.listdir(data) == ['eval.tsv'] and (data / 'eval.tsv').read_bytes() == original


def test_hub_style_parquet_files_finetune_and_predict_through_the_named_columns(
    finetuned, pretrain_workdir, tmp_path):
  """Columns named as a Hub dataset names them (review, stars as ints): the run saves the
  names, and predict reads an unlabelled Parquet file through them."""
  import pyarrow  # pylint: disable=import-outside-toplevel
  import pyarrow.parquet  # pylint: disable=import-outside-toplevel
  for split in ('train', 'eval'):
    _, rows = _read_tsv(finetuned['root'] / f'{split}.tsv')
    table = dict(review=[r[0] for r in rows], stars=[int(r[1] == 'good') for r in rows])
    pyarrow.parquet.write_table(pyarrow.table(table), tmp_path / f'{split}.parquet')
  pyarrow.parquet.write_table(pyarrow.table(dict(review=table['review'])),
                              tmp_path / 'unlabelled.parquet')
  flags = [f for f in finetuned['flags'] if not f.startswith(('--config.train_file',
                                                               '--config.eval_file',
                                                               '--config.num_seeds'))]
  proc = run_cli(*flags, f'--config.train_file={tmp_path}/train.parquet',
                 f'--config.eval_file={tmp_path}/eval.parquet', '--config.num_seeds=1',
                 '--config.text_columns=review', '--config.label_column=stars',
                 f'--config.init_checkpoint={pretrain_workdir[0]}', f'--workdir={tmp_path}/ft')
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['label_names'] == ['0', '1'] and summary['median_best_accuracy'] > 0.8
  # On 3 devices, which eval_batch_size 128 does not split over (it was refused, naming a
  # 'config.--batch_size' never given): the default batch is rounded up to 129.
  predicted = subprocess.run(
      [sys.executable, '-m', 'electra_jax.predict', f'--workdir={tmp_path}/ft',
       f'--output={tmp_path}/out', f'--input={tmp_path}/unlabelled.parquet'], cwd=REPO_ROOT,
      env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT,
               XLA_FLAGS=xla_flags_with('--xla_force_host_platform_device_count=3')),
      capture_output=True, text=True, timeout=600, check=False)
  assert predicted.returncode == 0, predicted.stderr
  header, rows = _read_tsv(tmp_path / 'out' / 'unlabelled.tsv')
  assert header == 'index\tprediction' and len(rows) == len(table['review'])
  accuracy = np.mean([r[1] == str(y) for r, y in zip(rows, table['stars'])])
  assert accuracy == pytest.approx(summary['median_best_accuracy'])


def test_predict_reads_files_by_the_text_columns_training_read(finetuned, tmp_path):
  """results.json keeps the training file's text columns, and a file to predict must hold them:
  a text_a/text_b file given to a model trained on `text` is named, not read as text_a alone."""
  from electra_jax.finetune import predictions, saved_run  # pylint: disable=import-outside-toplevel
  with open(os.path.join(finetuned['out'], 'results.json'), encoding='utf-8') as f:
    assert json.load(f)['text_columns'] == ['text']
  run = saved_run.load(finetuned['out'])
  assert run.task.file_text == ('text',)
  (tmp_path / 'pairs.jsonl').write_text('{"text_a": "a happy day", "text_b": "and sad"}\n')
  with pytest.raises(UserError, match=r"pairs.jsonl' has text column\(s\) text_a, text_b \(its "
                                      r"columns: \['text_a', 'text_b'\]\) where the run trained "
                                      r'on text;'):
    predictions.file_part(run, str(tmp_path / 'pairs.jsonl'))
  (tmp_path / 'texts.jsonl').write_text('{"text": "a happy day", "id": 3}\n')
  assert predictions.file_part(run, str(tmp_path / 'texts.jsonl')).examples[0]['text_a'] == (
      'a happy day')


def test_a_finetuned_workdir_predicts_without_its_pretraining_workdir(finetuned, tmp_path):
  """FT_DIR/network/ keeps the shape and the vocabulary: a moved copy whose init_checkpoint
  no longer exists predicts what the original does, unlabelled input too."""
  import shutil  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import predictions, saved_run  # pylint: disable=import-outside-toplevel
  moved = tmp_path / 'moved'
  shutil.copytree(finetuned['out'], moved)
  with open(moved / 'config.json', encoding='utf-8') as f:
    config = json.load(f)
  config['init_checkpoint'] = str(tmp_path / 'deleted')
  (moved / 'config.json').write_text(json.dumps(config))
  rows = _read_tsv(finetuned['root'] / 'eval.tsv')[1][:20]
  (tmp_path / 'texts.jsonl').write_text(''.join(json.dumps({'text': r[0]}) + '\n' for r in rows))
  original = saved_run.load(finetuned['out'])
  copy = saved_run.load(str(moved))
  assert copy.model_config == original.model_config and copy.task == original.task
  got = {}
  for name, run in (('original', original), ('moved', copy)):
    part = predictions.file_part(run, str(tmp_path / 'texts.jsonl'))
    assert not part.labelled
    result = predictions.predict(run, [part], str(tmp_path / 'predictions' / name), seed=1,
                                 say=lambda *a, **k: None)
    assert 'metrics' not in result['parts'][0] and result['seed'] == 1
    got[name] = (tmp_path / 'predictions' / name / 'texts.jsonl').read_text()
  assert got['moved'] == got['original'] and len(got['moved'].splitlines()) == 20
  # A workdir from before network/ existed resolves the network from its init_checkpoint.
  shutil.rmtree(os.path.join(str(moved), 'network'))
  with pytest.raises(UserError, match='is not a directory'):
    saved_run.load(str(moved))
  config['init_checkpoint'] = original.config.init_checkpoint
  (moved / 'config.json').write_text(json.dumps(config))
  assert saved_run.load(str(moved)).model_config == original.model_config
  with pytest.raises(UserError, match=r'--seed=5 is not a run of .*; its seeds: \[0, 1\]'):
    original.read_params(5)
  pretraining = original.config.init_checkpoint
  with pytest.raises(UserError, match=re.escape(
      f"'{pretraining}' holds a pretraining run (python -m electra_jax.train); predictions "
      'come from a fine-tuned one')):
    saved_run.load(pretraining)
  # Nor a pretraining run before its first checkpoint, the run's network/, or a model's folder:
  # each named as what it is, not as an unfinished fine-tuning run.
  unsaved = tmp_path / 'unsaved'
  unsaved.mkdir()
  shutil.copy(os.path.join(pretraining, 'config.json'), unsaved)
  with pytest.raises(UserError, match=re.escape(f"'{unsaved}' holds a pretraining run")):
    saved_run.load(str(unsaved))
  with pytest.raises(UserError, match=re.escape(
      f"is the network/ folder of the fine-tuning run in '{original.workdir}'; pass "
      f'--workdir={original.workdir}')):
    saved_run.load(os.path.join(original.workdir, 'network'))
  model = tmp_path / 'model'
  model.mkdir()
  (model / 'config.json').write_text('{"model_type": "electra"}')
  with pytest.raises(UserError, match=re.escape(
      f"'{model}' holds a config.json that python -m electra_jax.finetune did not write")):
    saved_run.load(str(model))


def test_glue_test_splits_become_leaderboard_files(tokenizer, tmp_path):
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import predictions, saved_run  # pylint: disable=import-outside-toplevel
  # TFDS marks GLUE's hidden test labels -1: unlabelled, keyed by GLUE's idx.
  source = [dict(sentence=b'a fine film', label=-1, idx=7),
            dict(sentence=b'dull', label=-1, idx=3)]
  examples = tasks.glue_examples(tasks.TASKS['sst2'], source)
  assert [(e['index'], e['label']) for e in examples] == [(7, None), (3, None)]
  run = saved_run.FinetunedRun(workdir='', config=ft_config(task='mnli'),
                               task=tasks.TASKS['mnli'], model_config=None, network=None,
                               tokenizer=tokenizer, runs=[])
  with tfds.testing.mock_data(num_examples=5):
    parts = predictions.split_parts(run, 'test')
    validation = predictions.split_parts(run, 'validation_matched', max_examples=3)
  assert [(p.name, len(p.examples), p.leaderboard) for p in parts] == [
      ('MNLI-m', 5, True), ('MNLI-mm', 5, True), ('AX', 5, True)]
  assert [(p.name, len(p.examples), p.leaderboard, p.labelled) for p in validation] == [
      ('mnli_validation_matched', 3, False, True)]
  # Leaderboard files: class names for MNLI/QNLI/RTE/AX, class ids for the others.
  outputs = dict(prediction=np.array([2, 0]), probabilities=np.array([[.1, .2, .7], [.5, .3, .2]]))
  mnli_part = predictions.Part('MNLI-m', [dict(examples[0], label=None),
                                          dict(examples[1], label=None)], False, True)
  predictions.write_part(str(tmp_path), tasks.TASKS['mnli'], mnli_part, outputs)
  assert _read_tsv(tmp_path / 'MNLI-m.tsv')[1] == [['7', 'contradiction'], ['3', 'entailment']]
  sst_part = predictions.Part('SST-2', examples, False, True)
  outputs = dict(prediction=np.array([1, 0]), probabilities=np.array([[.4, .6], [.9, .1]]))
  predictions.write_part(str(tmp_path), tasks.TASKS['sst2'], sst_part, outputs)
  assert _read_tsv(tmp_path / 'SST-2.tsv')[1] == [['7', '1'], ['3', '0']]
  with open(tmp_path / 'SST-2.jsonl', encoding='utf-8') as f:
    assert json.loads(f.readline()) == dict(index=7, prediction='positive',
                                            probabilities=dict(negative=0.4, positive=0.6))
  # STS-B on GLUE's 0-5 scale (trained on targets / 5).
  stsb = predictions.Part('STS-B', examples, False, True)
  predictions.write_part(str(tmp_path), tasks.TASKS['stsb'], stsb,
                         dict(prediction=np.array([0.5, 0.912345678])))
  assert _read_tsv(tmp_path / 'STS-B.tsv')[1] == [['7', '2.5'], ['3', '4.56173']]


def test_glue_test_files_become_leaderboard_files_without_tfds(tokenizer, tmp_path):
  """--glue_test=[NAME=]FILE: the Hub's test Parquet or GLUE's test TSV, keyed by the file's own
  ids; MNLI's three files named; STS-B's -1.0 (no score) read as no label; each bad input one
  line."""
  # pylint: disable=import-outside-toplevel
  import pyarrow
  import pyarrow.parquet
  from electra_jax.finetune import predictions, saved_run
  run = lambda task: saved_run.FinetunedRun(workdir='', config=ft_config(task=task),
                                            task=tasks.TASKS[task], model_config=None,
                                            network=None, tokenizer=tokenizer, runs=[])
  pyarrow.parquet.write_table(pyarrow.table(dict(premise=['a', 'b', 'c'], hypothesis=['d', 'e',
                                                                                     'f'],
                                                 label=[-1, -1, -1], idx=[2, 0, 1])),
                              tmp_path / 'test_matched.parquet')
  part = predictions.glue_test_part(run('mnli'), f'MNLI-mm={tmp_path}/test_matched.parquet')
  assert (part.name, part.leaderboard, part.labelled) == ('MNLI-mm', True, False)
  assert [(e['index'], e['text_a'], e['text_b']) for e in part.examples] == [
      (2, 'a', 'd'), (0, 'b', 'e'), (1, 'c', 'f')]
  assert len(predictions.glue_test_part(run('mnli'), f'AX={tmp_path}/test_matched.parquet',
                                        max_examples=2).examples) == 2
  with pytest.raises(UserError, match=r'task mnli has 3 leaderboard files; say which this is: '
                                      r'--glue_test=MNLI-m=FILE \(glue/mnli test_matched\), '):
    predictions.glue_test_part(run('mnli'), f'{tmp_path}/test_matched.parquet')
  with pytest.raises(UserError, match=r"'MNLI' is not a leaderboard file of task mnli; its "
                                      r'files: MNLI-m, MNLI-mm, AX \(--glue_test=NAME=FILE\)'):
    predictions.glue_test_part(run('mnli'), f'MNLI={tmp_path}/test_matched.parquet')
  with pytest.raises(UserError, match='task squad_v2 has no GLUE leaderboard file; pass --input'):
    predictions.glue_test_part(run('squad_v2'), f'{tmp_path}/test_matched.parquet')
  # Without TFDS's copy, --split=test names predict's ways, not fine-tuning's flags.
  offline = dataclasses.replace(run('sst2'), config=ft_config(
      task='sst2', tfds_data_dir=str(tmp_path / 'no_tfds'), tfds_download=False))
  with pytest.raises(UserError, match=r"split 'test' is not available .*; prepare it with `tfds "
                                      r"build glue/sst2 --file_format=array_record --data_dir=.*"
                                      r"no_tfds`, or predict GLUE's test files: --glue_test=FILE"):
    predictions.split_parts(offline, 'test')
  # GLUE's own TSVs: ids in `index` (CoLA's: `id`), no label column (MNLI's and AX's pairs in
  # sentence1/sentence2, not the Hub's premise/hypothesis); one file needs no name.
  (tmp_path / 'diagnostic.tsv').write_text('index\tsentence1\tsentence2\n0\tp\th\n')
  part = predictions.glue_test_part(run('mnli'), f'AX={tmp_path}/diagnostic.tsv')
  assert part.examples == [dict(text_a='p', text_b='h', label=None, index=0)]
  # A run trained on files of its own columns still reads GLUE's test files by the task's.
  renamed = dataclasses.replace(run('mnli'), config=ft_config(
      task='mnli', text_columns='claim,evidence', label_column='verdict'))
  assert predictions.glue_test_part(renamed, f'AX={tmp_path}/diagnostic.tsv').examples == (
      part.examples)
  (tmp_path / 'other.tsv').write_text('index\tsentence\n0\tp\n')
  with pytest.raises(UserError, match=r"lacks column\(s\) text \(or text_a\) \(or the task's "
                                      r'premise, hypothesis or sentence1, sentence2\)'):
    predictions.glue_test_part(run('mnli'), f'AX={tmp_path}/other.tsv')
  (tmp_path / 'test.tsv').write_text('index\tsentence\n5\tfine\n9\t"dull\n')
  part = predictions.glue_test_part(run('sst2'), str(tmp_path / 'test.tsv'))
  assert part.name == 'SST-2' and [(e['index'], e['text_a']) for e in part.examples] == [
      (5, 'fine'), (9, '"dull')]
  (tmp_path / 'bad_id.tsv').write_text('id\tsentence\n5\tfine\nx7\tdull\n')
  with pytest.raises(UserError, match=r"bad_id.tsv' example 2 has id 'x7', not an integer id"):
    predictions.glue_test_part(run('cola'), str(tmp_path / 'bad_id.tsv'))
  (tmp_path / 'digits.tsv').write_text('index\tsentence\n\u00b2\tfine\n')
  with pytest.raises(UserError, match=r"digits.tsv' example 1 has index '\u00b2', not an integer"):
    predictions.glue_test_part(run('sst2'), str(tmp_path / 'digits.tsv'))
  # Excel's byte-order mark is not part of the id column's name; records without an id in the
  # first one still find the column (and then need an id each).
  (tmp_path / 'bom.tsv').write_bytes('\ufeffindex\tsentence\n5\tfine\n'.encode('utf-8'))
  assert predictions.glue_test_part(run('sst2'), str(tmp_path / 'bom.tsv')).examples[0][
      'index'] == 5
  (tmp_path / 'late.jsonl').write_text('{"sentence": "a"}\n{"sentence": "b", "idx": 4}\n')
  with pytest.raises(UserError, match=r"late.jsonl' example 1 has idx None, not an integer"):
    predictions.glue_test_part(run('sst2'), str(tmp_path / 'late.jsonl'))
  (tmp_path / 'twice.tsv').write_text('index\tsentence\n5\tfine\n5\tdull\n')
  with pytest.raises(UserError, match=r"twice.tsv' repeats index 5; a GLUE test file names "):
    predictions.glue_test_part(run('sst2'), str(tmp_path / 'twice.tsv'))
  # The Hub's STS-B test split scores every pair -1.0: unlabelled, not a score of -5.
  rows = [dict(sentence1='a', sentence2='b', label='-1.0', idx='0')]
  columns = tasks.file_columns(ft_config(task='stsb'), tasks.TASKS['stsb'])
  assert tasks.file_examples(tasks.TASKS['stsb'], rows, 'f', need_label=False,
                             columns=columns)[0]['label'] is None
  assert tasks.file_examples(tasks.TASKS['stsb'], [dict(rows[0], label='4.5')], 'f',
                             columns=columns)[0]['label'] == 0.9
  # A test file passed to train on says what it is.
  with pytest.raises(UserError, match=r"'test.tsv' example 2 has label '-1.0', GLUE's mark of a "
                                      r'test example without a label; .* predict --glue_test'):
    tasks.file_examples(tasks.TASKS['stsb'], [dict(rows[0], label='4.5'), rows[0]], 'test.tsv',
                        columns=columns)


def test_a_glue_run_from_hub_files_writes_its_leaderboard_file_offline(
    finetuned, pretrain_workdir, tmp_path):
  """SST-2 fine-tuned from the Hub's Parquet files (ClassLabel labels), then its test file (every
  label -1, ids shuffled) predicted as SST-2.tsv: the file's ids, GLUE's class ids, the same
  classes as the file predicted with --input."""
  # pylint: disable=import-outside-toplevel
  import pyarrow
  import pyarrow.parquet
  features = dict(sentence=dict(dtype='string', _type='Value'),
                  label=dict(names=['negative', 'positive'], _type='ClassLabel'),
                  idx=dict(dtype='int32', _type='Value'))

  def write(name, sentences, labels, ids):
    table = pyarrow.table(dict(sentence=sentences, label=labels, idx=ids))
    pyarrow.parquet.write_table(table.replace_schema_metadata(
        {b'huggingface': json.dumps(dict(info=dict(features=features)))}), tmp_path / name)

  for split in ('train', 'eval'):
    _, rows = _read_tsv(finetuned['root'] / f'{split}.tsv')
    write(f'{split}.parquet', [r[0] for r in rows], [int(r[1] == 'good') for r in rows],
          list(range(len(rows))))
  test_ids = [1000 - 3 * i for i in range(len(rows))]
  write('test.parquet', [r[0] for r in rows], [-1] * len(rows), test_ids)
  flags = [f for f in finetuned['flags'] if not f.startswith((
      '--config=', '--config.train_file', '--config.eval_file',
      '--config.num_seeds', '--config.num_epochs'))]
  proc = run_cli('--config=configs/finetune/glue.py', '--config.task=sst2', *flags,
                 f'--config.train_file={tmp_path}/train.parquet', '--config.num_epochs=2',
                 f'--config.eval_file={tmp_path}/eval.parquet', '--config.num_seeds=1',
                 f'--config.init_checkpoint={pretrain_workdir[0]}', f'--workdir={tmp_path}/ft')
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  assert summary['task'] == 'sst2' and summary['median_best_accuracy'] > 0.8
  predicted = subprocess.run(
      [sys.executable, '-m', 'electra_jax.predict', f'--workdir={tmp_path}/ft',
       f'--output={tmp_path}/out', f'--glue_test={tmp_path}/test.parquet',
       f'--input={tmp_path}/test.parquet'], cwd=REPO_ROOT,
      env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT), capture_output=True,
      text=True, timeout=600, check=False)
  assert predicted.returncode == 0, predicted.stderr
  parts = json.loads(predicted.stdout.strip().splitlines()[-1])['parts']
  assert [(p['name'], p['examples'], 'metrics' in p) for p in parts] == [
      ('test', 64, False), ('SST-2', 64, False)]
  header, leaderboard = _read_tsv(tmp_path / 'out' / 'SST-2.tsv')
  _, named = _read_tsv(tmp_path / 'out' / 'test.tsv')
  assert header == 'index\tprediction' and [r[0] for r in leaderboard] == list(map(str, test_ids))
  assert [('negative', 'positive')[int(r[1])] for r in leaderboard] == [r[1] for r in named]
  truth = ['positive' if r[1] == 'good' else 'negative' for r in rows]
  assert np.mean([r[1] == y for r, y in zip(named, truth)]) > 0.8


def test_squad_files_give_the_official_scripts_inputs(tokenizer, tmp_path):
  from electra_jax.finetune import predictions  # pylint: disable=import-outside-toplevel
  squad = {'version': 'v2.0', 'data': [{'title': 't', 'paragraphs': [{
      'context': 'Emma Woodhouse lived at Hartfield.',
      'qas': [{'id': 'a', 'question': 'Where did Emma live?',
               'answers': [{'text': 'Hartfield', 'answer_start': 24}], 'is_impossible': False},
              {'id': 'b', 'question': 'Who is Mr. Knightley?', 'answers': [],
               'is_impossible': True}]}]}]}
  (tmp_path / 'dev.json').write_text(json.dumps(squad))
  examples, labelled = tasks.squad_file_examples(str(tmp_path / 'dev.json'), True)
  assert labelled and [e['id'] for e in examples] == ['a', 'b']
  assert examples[0]['answers'] == [('Hartfield', 24)] and examples[1]['is_impossible']
  del squad['data'][0]['paragraphs'][0]['qas'][0]['answers']
  (tmp_path / 'test.json').write_text(json.dumps(squad))
  assert not tasks.squad_file_examples(str(tmp_path / 'test.json'), True, need_label=False)[1]
  (tmp_path / 'bad.json').write_text('{"version": 1}')
  with pytest.raises(UserError, match="file '.*bad.json' is not SQuAD-format JSON"):
    tasks.squad_file_examples(str(tmp_path / 'bad.json'), True)
  # The official files train and evaluate SQuAD without TFDS; an eval file without answers is
  # refused, as is a train file without an eval file.
  squad_v2 = tasks.get_task('squad_v2')
  offline = lambda **files: ft_config(task='squad_v2', max_seq_length=32, doc_stride=8,
                                      max_query_length=8, **files)
  data = loop.load_data(offline(train_file=str(tmp_path / 'dev.json'),
                                eval_file=str(tmp_path / 'dev.json')), squad_v2, tokenizer)
  assert data.task == squad_v2 and [e['id'] for e in data.evals[0].examples] == ['a', 'b']
  np.testing.assert_array_equal(data.evals[0].features['input_ids'],
                                features.encode_squad(tokenizer, examples, 32, 8, 8)['input_ids'])
  with pytest.raises(UserError, match=r"test.json' question 'a' has no answers \(nor is_impossible"
                                      r': true\); fine-tuning trains and scores answered'):
    loop.load_data(offline(train_file=str(tmp_path / 'dev.json'),
                           eval_file=str(tmp_path / 'test.json')), squad_v2, tokenizer)
  with pytest.raises(UserError, match=r'config.task=squad_v2 needs --config.eval_file=PATH '
                                      r'\(SQuAD-format JSON'):
    loop.load_data(offline(train_file=str(tmp_path / 'dev.json')), squad_v2, tokenizer)
  c = ft_config(task='squad_v2', max_seq_length=32, doc_stride=8, max_query_length=8)
  feats = features.encode_squad(tokenizer, examples, 32, 8, 8)
  n = len(feats['example_index'])
  outputs = dict(start_index=np.zeros((n, 1), np.int32), start_score=np.zeros((n, 1)),
                 end_index=np.zeros((n, 1, 1), np.int32), end_score=np.zeros((n, 1, 1)),
                 answerable_prob=np.where(feats['example_index'] == 0, 0.9, 0.2))
  # Each window's best start is its first context token, ending there: 'Emma' for both.
  first = np.argmax(feats['context_mask'], axis=1)
  outputs.update(start_index=first[:, None], end_index=first[:, None, None])
  part = predictions.Part('dev', examples, True)
  decoded = loop.decode(tasks.TASKS['squad_v2'], c, feats, outputs, examples)
  files = predictions.write_part(str(tmp_path), tasks.TASKS['squad_v2'], part, outputs, decoded)
  assert [os.path.basename(f) for f in files] == ['dev_predictions.json', 'dev_null_odds.json',
                                                  'dev_best_spans.json']
  with open(tmp_path / 'dev_null_odds.json', encoding='utf-8') as f:
    assert json.load(f) == {'a': pytest.approx(0.1), 'b': pytest.approx(0.8)}
  with open(tmp_path / 'dev_predictions.json', encoding='utf-8') as f:
    assert json.load(f) == {'a': 'Emma', 'b': ''}  # b: 0.8 no-answer probability.
  with open(tmp_path / 'dev_best_spans.json', encoding='utf-8') as f:
    assert json.load(f) == {'a': 'Emma', 'b': 'Emma'}


_GOOD_QA = {'id': 'q1', 'question': 'Who sat?', 'answers': [{'text': 'cat', 'answer_start': 4}]}


def _squad_with(qa=None, paragraph=None, data=None) -> dict:
  """A one-question SQuAD file, with the question, its paragraph or `data` replaced."""
  paragraph = paragraph or {'context': 'The cat sat on the mat.', 'qas': [qa or _GOOD_QA]}
  return {'data': [{'paragraphs': [paragraph]}] if data is None else data}


@pytest.mark.parametrize('squad, message', [
    (_squad_with(dict(_GOOD_QA, answers=[{'text': 'cat'}])),
     "question 'q1' answer 1 has no answer_start"),
    (_squad_with(dict(_GOOD_QA, answers=[{'text': 'cat', 'answer_start': 'four'}])),
     "question 'q1' answer 1 has answer_start 'four', not a character offset into the context"),
    (_squad_with(dict(_GOOD_QA, answers=[{'text': 'cat', 'answer_start': -1}])),
     "question 'q1' answer 1 has answer_start -1, not a character offset"),
    (_squad_with(dict(_GOOD_QA, answers=[{'text': None, 'answer_start': 4}])),
     "question 'q1' answer 1 has no text"),
    (_squad_with(dict(_GOOD_QA, answers='cat')), "question 'q1' has answers 'cat', not a list"),
    (_squad_with(dict(_GOOD_QA, question=None)), "question 'q1' has no question"),
    (_squad_with(dict(_GOOD_QA, question=7)), "question 'q1' has question 7, not a string"),
    (_squad_with(dict(_GOOD_QA, is_impossible='no')),
     "question 'q1' has is_impossible 'no', not true or false"),
    (_squad_with(dict(_GOOD_QA, id=7)),
     'article 1 paragraph 1 question 1 has id 7, not a string'),
    (_squad_with(paragraph={'context': 'x', 'qas': [_GOOD_QA, _GOOD_QA]}),
     "question 'q1' repeats an earlier question's id"),
    (_squad_with(paragraph={'qas': [_GOOD_QA]}), 'article 1 paragraph 1 has no context'),
    (_squad_with(paragraph={'context': 'x', 'qas': {}}),
     r'article 1 paragraph 1 has qas \{\}, not a list of questions'),
    (_squad_with(data=['article']), 'article 1 is not an object with a list of paragraphs'),
    (_squad_with(data={'paragraphs': []}), r'is not SQuAD-format JSON \(no list at "data"\)'),
    ([1, 2], r'is not SQuAD-format JSON \(no list at "data"\)'),
])
def test_a_malformed_squad_file_is_one_line_naming_the_question(tmp_path, squad, message):
  """Each wrong type or missing field of a SQuAD-format file names the question (its id) or
  paragraph and the file's expected shape, instead of a KeyError, a ValueError, or a null
  question reaching the tokenizer."""
  path = tmp_path / 'bad.json'
  path.write_text(json.dumps(squad))
  shape = r'; a SQuAD-format file is \{"data": \[\{"paragraphs"'
  with pytest.raises(UserError, match=f"file '{re.escape(str(path))}' {message}.*{shape}"):
    tasks.squad_file_examples(str(path), True)
  path.write_text(json.dumps(_squad_with()))
  assert tasks.squad_file_examples(str(path), True) == ([dict(
      id='q1', question='Who sat?', context='The cat sat on the mat.', answers=[('cat', 4)],
      is_impossible=False)], True)


def test_squad_v1_refuses_squad_v2_files_whose_unanswerable_questions_it_cannot_get_right(
    tokenizer, tmp_path):
  """squad_v1 never predicts no answer: a SQuAD 2.0 file's unanswerable question (is_impossible,
  or an empty answers list) would train towards [CLS] and cap its F1 silently, so it is an error
  naming the question and squad_v2; fine-tuning's files need every question answered, while a
  file to predict may carry no answers at all."""
  answered = dict(_GOOD_QA, is_impossible=False)
  unanswerable = {'id': 'u', 'question': 'Who left?', 'answers': [], 'is_impossible': True}
  def write(name, *qas):
    (tmp_path / name).write_text(json.dumps(_squad_with(
        paragraph={'context': 'The cat sat on the mat.', 'qas': list(qas)})))
    return str(tmp_path / name)
  v2 = write('v2.json', answered, unanswerable)
  c = lambda task, train, eval_file: ft_config(task=task, train_file=train, eval_file=eval_file,
                                               max_seq_length=32, doc_stride=8,
                                               max_query_length=8)
  v1_of = lambda train, eval_file: loop.read_examples(c('squad_v1', train, eval_file),
                                                      tasks.get_task('squad_v1'))
  v1 = write('v1.json', answered)
  for train, eval_file in ((v2, v1), (v1, v2)):
    with pytest.raises(UserError, match=f"file '{re.escape(v2)}' question 'u' is unanswerable "
                                        r'\(is_impossible\), a SQuAD 2.0 question, which squad_v1 '
                                        r'.*; use --config.task=squad_v2 for SQuAD 2.0 files$'):
      v1_of(train, eval_file)
  empty = write('empty.json', answered, dict(unanswerable, is_impossible=False))
  with pytest.raises(UserError, match=r"question 'u' is unanswerable \(answers: \[\]\), a SQuAD"):
    v1_of(empty, v1)
  assert [e['id'] for e in v1_of(v1, v1)[2][0][1]] == ['q1']
  # SQuAD 2.0 as the Hub writes it (answers: [], no is_impossible) is unanswerable to squad_v2.
  hub = loop.read_examples(c('squad_v2', empty, empty), tasks.get_task('squad_v2'))[1]
  assert [(e['id'], e['is_impossible']) for e in hub] == [('q1', False), ('u', True)]
  assert [e['id'] for e in loop.read_examples(c('squad_v2', v2, v2),
                                              tasks.get_task('squad_v2'))[1]] == ['q1', 'u']
  # A training file's question without answers is no unanswerable one (nor is_impossible).
  unlabelled = write('unlabelled.json', answered, {'id': 'x', 'question': 'Who?'})
  for task in ('squad_v1', 'squad_v2'):
    with pytest.raises(UserError, match=r"unlabelled.json' question 'x' has no answers"):
      loop.read_examples(c(task, unlabelled, v2 if task == 'squad_v2' else v1),
                         tasks.get_task(task))
  # Predictions: a file without answers is unlabelled; a SQuAD 2.0 file still refused by v1.
  from electra_jax.finetune import predictions, saved_run  # pylint: disable=import-outside-toplevel
  run = lambda task: saved_run.FinetunedRun(workdir='', config=ft_config(task=task),
                                            task=tasks.TASKS[task], model_config=None,
                                            network=None, tokenizer=tokenizer, runs=[])
  test = write('test.json', {'id': 'x', 'question': 'Who?'})
  assert not predictions.file_part(run('squad_v1'), test).labelled
  with pytest.raises(UserError, match="question 'u' is unanswerable"):
    predictions.file_part(run('squad_v1'), v2)
  assert predictions.file_part(run('squad_v2'), v2).labelled


def test_squad_training_leaves_out_answers_not_at_their_answer_start(tokenizer, tmp_path,
                                                                     caplog):
  context = 'Emma Woodhouse lived at Hartfield with her father.'
  qa = lambda i, start, text='Hartfield': {'id': str(i), 'question': 'Where did Emma live?',
                                           'answers': [{'text': text, 'answer_start': start}]}
  unanswerable = {'id': 'u', 'question': 'Who?', 'answers': [], 'is_impossible': True}
  def write(name, qas, context=context):
    squad = {'data': [{'paragraphs': [{'context': context, 'qas': qas}]}]}
    (tmp_path / name).write_text(json.dumps(squad))
    return str(tmp_path / name)
  # Two in place, one a character off, one in place by its first answer (the one trained on).
  train = write('train.json', [qa(0, 24), qa(1, 25), unanswerable, qa(2, 24),
                               dict(qa(3, 24), answers=[{'text': 'Hartfield', 'answer_start': 24},
                                                        {'text': 'Emma', 'answer_start': 9}])])
  config = lambda train_file: ft_config(task='squad_v2', max_seq_length=32, doc_stride=8,
                                       max_query_length=8, train_file=train_file,
                                       eval_file=train)
  with caplog.at_level('WARNING'):
    data = loop.load_data(config(train), tasks.get_task('squad_v2'), tokenizer)
  kept = [e for e in tasks.squad_file_examples(train, True)[0] if e['id'] != '1']
  np.testing.assert_array_equal(data.train['input_ids'],
                                features.encode_squad(tokenizer, kept, 32, 8, 8)['input_ids'])
  assert len(data.evals[0].examples) == 5  # Evaluation reads the answers' texts: all kept.
  assert [r.getMessage() for r in caplog.records] == [
      f"left 1 of the 4 answered questions of '{train}' out of training: the answer is not in "
      "the context at its answer_start (question '1': answer 'Hartfield' at 25, the context "
      "there 'artfield ')"]
  # Most answers elsewhere: offsets of another unit (here UTF-8 bytes after a 2-byte 'é').
  in_bytes = write('bytes.json', [qa(0, 25), qa(1, 25), qa(2, 0, 'Émma')],
                   'Émma Woodhouse lived at Hartfield with her father.')
  with pytest.raises(UserError, match=r"bytes.json': 2 of its 3 answers are not in the context "
                                      r"at their answer_start \(question '0': answer 'Hartfield' "
                                      r"at 25, .*answer_start must count characters"):
    loop.load_data(config(in_bytes), tasks.get_task('squad_v2'), tokenizer)


@pytest.mark.parametrize('span_head', heads.SPAN_HEADS)
def test_squad_v2_end_to_end_on_tfds_mock_data(tmp_path, span_head):
  """Fine-tune, then predict the same split: the prediction command scores what the run's best
  epoch scored, SQuAD 2.0's breakdown and threshold search included."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import predictions, saved_run  # pylint: disable=import-outside-toplevel
  c = ft_config(task='squad_v2', random_init=True, model_size='demo', max_seq_length=64,
                doc_stride=16, max_query_length=16, num_epochs=1, train_batch_size=8,
                eval_batch_size=8, max_train_examples=16, max_eval_examples=8, num_seeds=1,
                span_head=span_head)
  with tfds.testing.mock_data(num_examples=16):
    loop.finetune(c, str(tmp_path / 'ft'))
    run = saved_run.load(str(tmp_path / 'ft'))
    parts = predictions.split_parts(run, 'validation', max_examples=8)
    result = predictions.predict(run, parts, str(tmp_path / 'out'), say=lambda *a, **k: None)
  best = run.runs[0]['best']
  metrics = result['parts'][0]['metrics']
  assert {'has_answer_f1', 'no_answer_f1', 'best_f1', 'best_f1_threshold'} <= set(metrics)
  assert metrics == pytest.approx({k[5:]: v for k, v in best.items() if k.startswith('eval_')})
  with open(tmp_path / 'out' / 'squad_v2_validation_predictions.json', encoding='utf-8') as f:
    answers = json.load(f)
  assert list(answers) == [e['id'] for e in parts[0].examples]
  if span_head != 'bert':
    return
  # The 'bert' head exports as transformers' ElectraForQuestionAnswering: its start and end
  # logits are ours wherever a span may start or end.
  transformers = pytest.importorskip('transformers')
  import torch  # pylint: disable=import-outside-toplevel
  from electra_jax import export  # pylint: disable=import-outside-toplevel
  summary = export.export_finetuned(str(tmp_path / 'ft'), str(tmp_path / 'hf'))
  assert summary['what'] == 'ElectraForQuestionAnswering'
  hf_model = transformers.ElectraForQuestionAnswering.from_pretrained(str(tmp_path / 'hf'))
  feats = predictions.Predictor(run, 0, 8).features(parts[0])
  batch = {k: feats[k][:8] for k in ('input_ids', 'segment_ids', 'input_mask', 'context_mask',
                                     'start_position')}
  model = loop.make_model(run.task, run.model_config, span_head='bert')
  start, end, _ = model.apply({'params': run.read_params(0)[0]}, batch)
  with torch.no_grad():
    theirs = hf_model.eval()(input_ids=torch.tensor(batch['input_ids']),
                             token_type_ids=torch.tensor(batch['segment_ids']),
                             attention_mask=torch.tensor(batch['input_mask']))
  allowed = np.asarray(heads.span_positions(batch['context_mask']))
  np.testing.assert_allclose(theirs.start_logits.numpy()[allowed], np.asarray(start)[allowed],
                             atol=1e-4)
  np.testing.assert_allclose(theirs.end_logits.numpy()[allowed], np.asarray(end)[allowed],
                             atol=1e-4)
  # Its tokenizer makes our window's inputs from the question and the context.
  example = parts[0].examples[0]
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
  ids = tok(example['question'], example['context'])['input_ids']
  assert len(ids) <= 64 and ids == feats['input_ids'][0][:len(ids)].tolist()  # One window.


def test_the_bert_span_head_decodes_as_berts_run_squad():
  """span_head=bert answers as BERT's run_squad (and transformers' run_qa) would from the same
  logits: the best valid span (in the context, starting where its window has the start token's
  most context, end >= start, at most max_answer_length tokens) by start + end logit over all
  of a question's windows; no answer where the lowest [CLS] start + end logit over its windows
  beats that span. Found here by brute force over every span, with a beam as wide as a
  window."""
  head = heads.LinearSpanHead()
  rng = np.random.default_rng(0)
  num_questions, length, stride, max_answer_length = 8, 12, 3, 3
  num_windows = 2 * num_questions
  hidden = rng.normal(size=(num_windows, length, 8)) * 50
  hidden[:, 0] *= 4  # [CLS]'s score: spread over the range of the best span's.
  hidden = jnp.asarray(hidden, jnp.float32)
  # Two windows a question; window w holds words w%2*stride.. at positions 4..10.
  example_index = np.repeat(np.arange(num_questions), 2)
  context_mask = np.zeros((num_windows, length), np.int32)
  context_mask[:, 4:11] = 1
  context_mask[5, 9:] = 0
  word = np.where(context_mask > 0, np.arange(length) - 4 + (np.arange(num_windows) % 2 *
                                                               stride)[:, None], -1)
  contexts = [' '.join(f'q{q}w{k}' for k in range(11)) for q in range(num_questions)]
  starts_at = lambda q, k: contexts[q].index(f'q{q}w{k}')
  begin = np.array([[starts_at(q, k) if k >= 0 else -1 for k in row]
                    for q, row in zip(example_index, word)])
  end = np.array([[starts_at(q, k) + len(f'q{q}w{k}') if k >= 0 else -1 for k in row]
                  for q, row in zip(example_index, word)])
  max_context = (rng.random((num_windows, length)) < 0.7).astype(np.int32)
  feats = dict(example_index=example_index, token_begin=begin, token_end=end,
               token_is_max_context=max_context)
  examples = [dict(id=f'q{q}', context=contexts[q]) for q in range(num_questions)]
  params = head.init(jax.random.key(0), hidden, context_mask, None)
  start, end_logits, answerable = head.apply(params, hidden, context_mask, None)
  assert answerable is None
  beam = head.apply(params, hidden, context_mask, length, max_answer_length, method=head.beam)
  start, end_logits = np.asarray(start, np.float64), np.asarray(end_logits, np.float64)
  np.testing.assert_allclose(  # Raw logits, not log-probabilities.
      beam['start_score'], np.take_along_axis(start, np.asarray(beam['start_index']), 1))
  outputs = jax.tree.map(np.asarray, beam)
  decoded = spans.decode(feats, outputs, examples, max_answer_length, True,
                         spans.NULL_THRESHOLDS['bert'])
  for q in range(num_questions):
    windows = np.nonzero(example_index == q)[0]
    spans_ = [(start[w, i] + end_logits[w, j], w, i, j) for w in windows
              for i in range(length) for j in range(length)
              if begin[w, i] >= 0 and end[w, j] >= 0 and max_context[w, i]
              and 0 <= j - i < max_answer_length]
    score, w, i, j = max(spans_)
    null = min(start[v, 0] + end_logits[v, 0] for v in windows)
    text = contexts[q][begin[w, i]:end[w, j]]
    assert decoded.best_spans[f'q{q}'] == text
    assert decoded.answers[f'q{q}'] == ('' if null - score > 0 else text)
    assert decoded.no_answer[f'q{q}'] == pytest.approx(1 / (1 + np.exp(score - null)))
  assert 0 < list(decoded.answers.values()).count('') < num_questions  # Both outcomes.


def test_berts_no_answer_rule_compares_windows_with_each_other():
  """A question answers where its best span over all windows outscores its lowest [CLS] score
  over all windows, even when no window's own best span outscores its own [CLS]."""
  context = 'alpha beta'
  feats = dict(example_index=np.array([0, 0]), token_begin=np.array([[-1, 0, 6]] * 2),
               token_end=np.array([[-1, 5, 10]] * 2),
               token_is_max_context=np.array([[1, 1, 0], [1, 0, 1]]))
  outputs = dict(start_index=np.array([[1], [2]]), start_score=np.array([[2.0], [1.0]]),
                 end_index=np.array([[[1]], [[2]]]), end_score=np.array([[[3.0]], [[2.0]]]),
                 null_score=np.array([6.0, 4.0]))  # Spans: 'alpha' 5 (window 0), 'beta' 3.
  examples = [dict(id='q', context=context)]
  decoded = spans.decode(feats, outputs, examples, 3, True, spans.NULL_THRESHOLDS['bert'])
  assert decoded.answers == {'q': 'alpha'}
  assert decoded.no_answer['q'] == pytest.approx(1 / (1 + np.exp(1.0)))
  outputs['null_score'] = np.array([6.0, 5.5])
  assert spans.decode(feats, outputs, examples, 3, True, 0.5).answers == {'q': ''}


def test_export_of_a_finetuned_run_is_a_transformers_classifier_that_predicts_as_we_do(
    finetuned, tmp_path):
  """`export --workdir=FT_DIR` writes the best seed's best epoch as
  ElectraForSequenceClassification with its tokenizer and class names: transformers' pipeline
  gives our predictions, its probabilities ours."""
  transformers = pytest.importorskip('transformers')
  import torch  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import predictions, saved_run  # pylint: disable=import-outside-toplevel
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT)
  output = str(tmp_path / 'hf')
  proc = subprocess.run([sys.executable, '-m', 'electra_jax.export',
                         f'--workdir={finetuned["out"]}', f'--output={output}'], cwd=REPO_ROOT,
                        env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  run = saved_run.load(finetuned['out'])
  assert (summary['what'], summary['seed']) == ('ElectraForSequenceClassification',
                                                run.best_seed())
  texts = [r[0] for r in _read_tsv(finetuned['root'] / 'eval.tsv')[1][:24]]
  # One longer than the run's max_seq_length: the exported tokenizer cuts it where we do.
  texts.append(' '.join(texts[:6]))
  assert len(run.tokenizer.encode(texts[-1])) > run.config.max_seq_length
  part = predictions.Part('texts', [dict(text_a=t, text_b=None, label=None, index=i)
                                    for i, t in enumerate(texts)], labelled=False)
  predictor = predictions.Predictor(run, run.best_seed(), 8)
  assert predictor.step == summary['step']
  ours = predictor(predictor.features(part))['probabilities']
  tok = transformers.AutoTokenizer.from_pretrained(output)
  model = transformers.ElectraForSequenceClassification.from_pretrained(output).eval()
  with torch.no_grad():
    theirs = torch.softmax(model(**tok(texts, padding=True, truncation=True,
                                       return_tensors='pt')).logits, -1)
  assert tok.model_max_length == run.config.max_seq_length
  np.testing.assert_allclose(theirs.numpy(), ours, atol=1e-5)
  classify = transformers.pipeline('text-classification', model=model, tokenizer=tok)
  assert [r['label'] for r in classify(texts, truncation=True)] == [
      run.task.label_names[i] for i in np.argmax(ours, -1)]
  assert {'bad', 'good'} == set(model.config.label2id)
  # A fine-tuning workdir has seeds, not steps or networks; a pretraining one no seeds.
  for flag in ('--what=generator', '--step=3'):
    bad = subprocess.run([sys.executable, '-m', 'electra_jax.export',
                          f'--workdir={finetuned["out"]}', f'--output={tmp_path}/x', flag],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert bad.returncode == 2 and 'is a fine-tuning workdir' in bad.stderr
  bad = subprocess.run([sys.executable, '-m', 'electra_jax.export',
                        f'--workdir={run.config.init_checkpoint}', f'--output={tmp_path}/x',
                        '--seed=0'], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=600, check=False)
  assert bad.returncode == 2 and '--seed=0 is for fine-tuning workdirs' in bad.stderr
  import shutil  # pylint: disable=import-outside-toplevel
  from electra_jax import export  # pylint: disable=import-outside-toplevel
  unfinished = tmp_path / 'unfinished'
  shutil.copytree(finetuned['out'], unfinished)
  (unfinished / 'results.json').unlink()
  assert saved_run.is_finetuning_workdir(str(unfinished))
  assert not saved_run.is_finetuning_workdir(run.config.init_checkpoint)
  with pytest.raises(UserError, match='has not finished'):
    export.export_finetuned(str(unfinished), str(tmp_path / 'y'))


def test_predict_names_the_flag_it_lacks(tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'electra_jax.predict', f'--workdir={tmp_path}'],
                        cwd=REPO_ROOT, env=dict(os.environ, JAX_PLATFORMS='cpu'),
                        capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      'error: --output missing; pass --workdir=FT_DIR (a fine-tuning run) and --output=DIR '
      '(where the predictions go)']


def test_predict_names_only_the_bad_flag(tmp_path):
  for flag, error in [('--batch_size=0', "--batch_size=0 must be > 0 (or leave it out: the run's "
                                         'eval_batch_size)'),
                      ('--max_examples=-1', '--max_examples=-1 must be >= 0 (0: every example)')]:
    proc = subprocess.run([sys.executable, '-m', 'electra_jax.predict', f'--workdir={tmp_path}',
                           f'--output={tmp_path}/out', '--input=x.tsv', flag], cwd=REPO_ROOT,
                          env=dict(os.environ, JAX_PLATFORMS='cpu'), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f'error: {error}']
