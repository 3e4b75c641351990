"""Fine-tuning tasks by name: what to read, how to label it, how to score it.

GLUE and SQuAD come from TFDS (`tfds.data_source`, random access without TensorFlow; the
dataset is downloaded and prepared as ArrayRecord on first use unless `tfds_download=false`);
`files` reads a user's CSV/TSV/JSON Lines/Parquet/Arrow, `tagging` a user's CoNLL-format files.
Every loader returns plain Python examples: classification/regression: {'text_a', 'text_b' (or
None), 'label', 'index'}; span (SQuAD): {'id', 'question', 'context', 'answers':
[(text, start_char)], 'is_impossible'}; tagging: {'words', 'label' (one tag id per word),
'index' (the sentence's number in its file or split, from 0: a skipped one leaves a gap)}. A
label is None where the data has none (GLUE's test splits, a file to predict without label
values).
"""
import csv
import dataclasses
import itertools
import json
import logging as std_logging
import math
import re

from absl import logging

from electra_jax import paths
from electra_jax.data import sources
from electra_jax.errors import UserError, first_line
from electra_jax.finetune import metrics

CLASSIFICATION, REGRESSION, SPAN, TAGGING = 'classification', 'regression', 'span', 'tagging'


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  kind: str                              # CLASSIFICATION, REGRESSION or SPAN
  main_metric: str                       # picks the best epoch / checkpoint (higher is better)
  num_epochs: int                        # the paper's default
  metric_names: tuple = ('accuracy',)    # classification metrics reported
  label_names: tuple = ()                # class (tagging: tag) names, index = class id
  tfds_name: str | None = None
  text_keys: tuple = ()                  # TFDS feature names of text_a (and text_b; tagging: words)
  tag_key: str | None = None             # tagging: the TFDS feature of the tag ids
  train_split: str = 'train'
  # Eval splits and the prefix their metrics get ('' for the main one).
  eval_splits: tuple = (('validation', ''),)
  label_scale: float = 1.0               # regression targets are divided by it (STS-B: 5)
  # The pair's order carries no meaning (config.double_unordered trains on both orders).
  unordered_pair: bool = False
  # GLUE's test splits as the leaderboard wants them: (TFDS name, split, file name) each.
  glue_test_files: tuple = ()
  # The leaderboard's file holds class names (MNLI, QNLI, RTE, AX), else class ids.
  glue_text_labels: bool = False
  # GLUE's own TSVs (glue_data/, as the official code reads them) where they differ from the
  # Hub's files: the text columns (MNLI's: sentence1, sentence2), the label column (MNLI's
  # gold_label), and the columns of a TSV without a header row (CoLA's train and dev).
  glue_tsv_text_keys: tuple = ()
  glue_tsv_label: str | None = None
  glue_tsv_headerless: tuple = ()
  # The text columns a run's training file was read by where they are none of file_text_choices
  # (the files task's; a GLUE task's file of other names): results.json keeps them, and an eval
  # file or a file to predict must hold the same (a pair model is never fed single texts).
  file_text: tuple = ()

  @property
  def file_text_choices(self) -> tuple:
    """The text columns a file of this GLUE task may hold, each a choice: the Hub's (TFDS's
    names), then GLUE's TSVs' where they differ."""
    return tuple(keys for keys in (self.text_keys, self.glue_tsv_text_keys) if keys)

  @property
  def trained_text_choices(self) -> tuple:
    """The text columns a file read after training (eval, predict) may hold, each a choice:
    the training file's (file_text), else the task's own; () where unknown (an old run)."""
    return (self.file_text,) if self.file_text else self.file_text_choices

  @property
  def num_outputs(self) -> int:
    return len(self.label_names) if self.kind in (CLASSIFICATION, TAGGING) else 1


def _glue(name, file_name, text_keys, label_names, main='accuracy', metrics=('accuracy',),
          epochs=3, **kwargs):
  kind = REGRESSION if not label_names else CLASSIFICATION
  kwargs.setdefault('glue_test_files', ((f'glue/{name}', 'test', file_name),))
  return Task(name=name, kind=kind, main_metric=main, num_epochs=epochs, metric_names=metrics,
              label_names=tuple(label_names), tfds_name=f'glue/{name}',
              text_keys=tuple(text_keys), **kwargs)


# CoNLL-2003's tags in TFDS's ClassLabel order (tensorflow_datasets/core/dataset_builders/conll/
# conll_dataset_builder_utils.py): TFDS gives their ids.
NER_TAGS = ('O', 'B-PER', 'I-PER', 'B-ORG', 'I-ORG', 'B-LOC', 'I-LOC', 'B-MISC', 'I-MISC')
CHUNK_TAGS = ('O', 'B-ADJP', 'I-ADJP', 'B-ADVP', 'I-ADVP', 'B-CONJP', 'I-CONJP', 'B-INTJ',
              'I-INTJ', 'B-LST', 'I-LST', 'B-NP', 'I-NP', 'B-PP', 'I-PP', 'B-PRT', 'I-PRT',
              'B-SBAR', 'I-SBAR', 'B-UCP', 'I-UCP', 'B-VP', 'I-VP')
POS_TAGS = ('"', "''", '#', '$', '(', ')', ',', '.', ':', '``', 'CC', 'CD', 'DT', 'EX', 'FW',
            'IN', 'JJ', 'JJR', 'JJS', 'LS', 'MD', 'NN', 'NNP', 'NNPS', 'NNS', 'NN|SYM', 'PDT',
            'POS', 'PRP', 'PRP$', 'RB', 'RBR', 'RBS', 'RP', 'SYM', 'TO', 'UH', 'VB', 'VBD', 'VBG',
            'VBN', 'VBP', 'VBZ', 'WDT', 'WP', 'WP$', 'WRB')


def _tag_metrics(spans: bool) -> dict:
  """Span tags (O, B-PER, I-PER, ...): chunk precision/recall/F1 (as conlleval counts them)
  beside word accuracy, F1 the main metric; other tags (POS): word accuracy."""
  if spans:
    return dict(main_metric='f1', metric_names=('f1', 'precision', 'recall', 'accuracy'))
  return dict(main_metric='accuracy', metric_names=('accuracy',))


def _conll(name, tag_key, tag_names, spans=True):
  """A CoNLL-2003 tagging task: chosen on dev, reported on dev and test (`test_` metrics)."""
  return Task(name=name, kind=TAGGING, num_epochs=3, label_names=tag_names,
              tfds_name='conll2003', text_keys=('tokens',), tag_key=tag_key,
              eval_splits=(('dev', ''), ('test', 'test_')), **_tag_metrics(spans))


# The paper reports MCC for CoLA, Spearman for STS-B and accuracy for the other GLUE tasks;
# GLUE's F1 is reported beside accuracy for MRPC and QQP.
TASKS = {t.name: t for t in [
    _glue('cola', 'CoLA', ('sentence',), ('unacceptable', 'acceptable'), main='mcc',
          metrics=('mcc', 'accuracy'),
          glue_tsv_headerless=('source', 'label', 'original_mark', 'sentence')),
    _glue('sst2', 'SST-2', ('sentence',), ('negative', 'positive')),
    _glue('mrpc', 'MRPC', ('sentence1', 'sentence2'), ('not_equivalent', 'equivalent'),
          metrics=('accuracy', 'f1'), unordered_pair=True,
          glue_tsv_text_keys=('#1 String', '#2 String'), glue_tsv_label='Quality'),
    _glue('qqp', 'QQP', ('question1', 'question2'), ('not_duplicate', 'duplicate'),
          metrics=('accuracy', 'f1'), glue_tsv_label='is_duplicate'),
    _glue('stsb', 'STS-B', ('sentence1', 'sentence2'), (), main='spearman', epochs=10,
          label_scale=5.0, unordered_pair=True, glue_tsv_label='score'),
    # The diagnostic set AX is labelled by the MNLI classifier.
    _glue('mnli', 'MNLI', ('premise', 'hypothesis'), ('entailment', 'neutral', 'contradiction'),
          eval_splits=(('validation_matched', ''), ('validation_mismatched', 'mismatched_')),
          glue_test_files=(('glue/mnli', 'test_matched', 'MNLI-m'),
                           ('glue/mnli', 'test_mismatched', 'MNLI-mm'),
                           ('glue/ax', 'test', 'AX')), glue_text_labels=True,
          glue_tsv_text_keys=('sentence1', 'sentence2'), glue_tsv_label='gold_label'),
    _glue('qnli', 'QNLI', ('question', 'sentence'), ('entailment', 'not_entailment'),
          glue_text_labels=True),
    _glue('rte', 'RTE', ('sentence1', 'sentence2'), ('entailment', 'not_entailment'), epochs=10,
          glue_text_labels=True),
    _glue('wnli', 'WNLI', ('sentence1', 'sentence2'), ('not_entailment', 'entailment')),
    Task(name='squad_v1', kind=SPAN, main_metric='f1', num_epochs=2,
         tfds_name='squad/v1.1'),
    Task(name='squad_v2', kind=SPAN, main_metric='f1', num_epochs=2,
         tfds_name='squad/v2.0'),
    # A user's files; label names (or regression) are read from the training file.
    Task(name='files', kind=CLASSIFICATION, main_metric='accuracy', num_epochs=3),
    # A user's CoNLL-format files; tag names are read from the training file.
    Task(name='tagging', kind=TAGGING, main_metric='accuracy', num_epochs=3),
    # CoNLL-2003 (English newswire) from TFDS: NER (the usual benchmark), its chunks and POS.
    _conll('conll2003', 'ner', NER_TAGS),
    _conll('conll2003_chunk', 'chunks', CHUNK_TAGS),
    _conll('conll2003_pos', 'pos', POS_TAGS, spans=False),
]}


def get_task(name: str) -> Task:
  if name not in TASKS:
    raise UserError(f'config.task={name!r} is not a task; pick one of {sorted(TASKS)}')
  return TASKS[name]


def is_squad_v2(task: Task) -> bool:
  return task.tfds_name == 'squad/v2.0'


# --- TFDS -------------------------------------------------------------------------------------

def _import_builders():
  """Registers the GLUE and SQuAD builders (tfds skips text datasets when TF is absent)."""
  # pylint: disable=import-outside-toplevel,unused-import
  import tensorflow_datasets.datasets.squad.squad_dataset_builder  # noqa: F401
  import tensorflow_datasets.text.conll2003  # noqa: F401
  import tensorflow_datasets.text.glue  # noqa: F401


def tfds_source(name: str, split: str, data_dir: str | None, download: bool,
                remedy: str | None = None):
  """A random-access TFDS split (ArrayRecord), or a UserError saying how to get it (`remedy`:
  the caller's way, else fine-tuning's flags)."""
  # tensorflow-datasets is a dependency, and imports some of its own only when first used: a
  # broken install fails here or in data_source.
  broken = ("task dataset '{}' needs tensorflow-datasets, which failed to import ({}); "
            'reinstall: pip install -e . (or use config.task=files with your own files)')
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
    _import_builders()
  except ImportError as e:
    raise UserError(broken.format(name, e)) from None
  from electra_jax.data import tfds_source as tfds_data  # pylint: disable=import-outside-toplevel
  local_dir = tfds_data.local_data_dir(data_dir, name)
  absl_logger = logging.get_absl_logger()
  level = absl_logger.level
  # tfds warns of a folder without the dataset before failing: the error below says it once.
  absl_logger.setLevel(max(level, std_logging.ERROR))
  try:
    return tfds.data_source(name, split=split, data_dir=local_dir,
                            download=download and local_dir == (data_dir or None))
  except ImportError as e:
    raise UserError(broken.format(name, e)) from None
  except (AssertionError, FileNotFoundError, ValueError, NotImplementedError) as e:
    remedy = remedy or (f'prepare it with `tfds build {name} --file_format=array_record` or '
                        'set --config.tfds_download=true and --config.tfds_data_dir=DIR')
    # A dataset tfds does not find reads as one in TFRecord files, which it cannot serve.
    cause = (f"not found as ArrayRecord files in {local_dir or 'the default TFDS folder'}"
             if 'Random access data source' in str(e) else first_line(e))
    raise UserError(f"TFDS dataset '{name}' split '{split}' is not available ({cause}); "
                    f'{remedy}') from None
  except OSError as e:  # A download without a network (requests' errors are OSErrors).
    remedy = remedy or (f'build it where there is one (`tfds build {name} '
                        '--file_format=array_record`) and point --config.tfds_data_dir at it')
    raise UserError(f"downloading TFDS dataset '{name}' failed ({first_line(e)}); check the "
                    f'network, or {remedy}') from None
  finally:
    absl_logger.setLevel(level)


def _text(value) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def _limit(n_max: int, n: int) -> int:
  return n if not n_max else min(n, n_max)


def glue_examples(task: Task, source, max_examples: int = 0) -> list[dict]:
  """A GLUE split's examples; `index` is GLUE's idx (what a leaderboard file is keyed by), the
  label None on a test split (TFDS gives -1 there)."""
  examples = []
  for i in range(_limit(max_examples, len(source))):
    record = source[i]
    label = record['label']
    if label == -1:
      label = None
    elif task.kind == REGRESSION:
      label = float(label) / task.label_scale
    else:
      label = int(label)
    texts = [_text(record[k]) for k in task.text_keys]
    examples.append(dict(text_a=texts[0], text_b=texts[1] if len(texts) > 1 else None,
                         label=label, index=int(record.get('idx', i))))
  return examples


def tagging_tfds_examples(task: Task, source, max_examples: int = 0,
                          encoding: str = 'file') -> list[dict]:
  """A CoNLL-2003 split's sentences with `task`'s tag ids (TFDS's ids name the tags of
  TASKS[task.name]; `task` is that task as encoded_task made it for `encoding`)."""
  names = TASKS[task.name].label_names
  sentences = []
  for i in range(_limit(max_examples, len(source))):
    record = source[i]
    words, tags = record[task.text_keys[0]], record[task.tag_key]
    if len(words) != len(tags):
      raise UserError(f'{task.tfds_name} record {i} has {len(words)} words but {len(tags)} '
                      f"'{task.tag_key}' tags; prepare the dataset again")
    sentences.append(([_text(w) for w in words], [names[int(t)] for t in tags], i))
  return tagging_examples(task, encode_tags(sentences, encoding, task.tfds_name),
                          task.tfds_name)


def _answers(field) -> list:
  texts = [_text(t) for t in field['text']]
  starts = [int(s) for s in field['answer_start']]
  return list(zip(texts, starts))


def squad_examples(source, max_examples: int = 0) -> list[dict]:
  examples = []
  for i in range(_limit(max_examples, len(source))):
    record = source[i]
    impossible = bool(record.get('is_impossible', False))
    examples.append(dict(id=_text(record['id']), question=_text(record['question']),
                         context=_text(record['context']),
                         answers=[] if impossible else _answers(record['answers']),
                         is_impossible=impossible))
  return examples


# What every SQuAD-format error points at: the official files' shape.
_SQUAD_SHAPE = ('a SQuAD-format file is {"data": [{"paragraphs": [{"context": "...", "qas": '
                '[{"id": "...", "question": "...", "answers": [{"text": "...", '
                '"answer_start": 0}]}]}]}]}, as the official dev-v2.0.json')


def _squad_error(path: str, where: str, problem: str) -> UserError:
  return UserError(f"file '{path}' {where} {problem}; {_SQUAD_SHAPE}")


def _squad_field(name: str, value, want: str) -> str:
  return f'has no {name}' if value is None else f'has {name} {value!r:.40}, not {want}'


def _squad_answers(path: str, where: str, qa: dict) -> list | None:
  """A question's answers as [(text, start_char)], None where it has no answers field (a file
  to predict); a malformed answer is an error naming it."""
  answers = qa.get('answers')
  if answers is None:
    return None
  if not isinstance(answers, list):
    raise _squad_error(path, where, _squad_field('answers', answers, 'a list'))
  out = []
  for k, answer in enumerate(answers, 1):
    if not isinstance(answer, dict):
      raise _squad_error(path, f'{where} answer {k}', f'is {answer!r:.40}, not an object')
    text, start = answer.get('text'), answer.get('answer_start')
    if not isinstance(text, str):
      raise _squad_error(path, f'{where} answer {k}', _squad_field('text', text, 'a string'))
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
      raise _squad_error(path, f'{where} answer {k}', _squad_field(
          'answer_start', start, 'a character offset into the context (an integer >= 0)'))
    out.append((text, start))
  return out


def _squad_question(path: str, where: str, qa, context: str, ids: set, version_2: bool,
                    need_label: bool) -> dict:
  """One question of a SQuAD-format file as an example (squad_file_examples' checks); `ids`
  (the ids seen so far) gets its id."""
  if not isinstance(qa, dict):
    raise _squad_error(path, where, f'is {qa!r:.40}, not an object')
  qid = qa.get('id')
  if not isinstance(qid, str) or not qid:
    raise _squad_error(path, where, _squad_field(
        'id', None if qid == '' else qid, 'a string (the prediction files are keyed by it)'))
  where = f"question '{qid}'"
  if qid in ids:
    raise _squad_error(path, where, "repeats an earlier question's id; give each its own")
  ids.add(qid)
  question, impossible = qa.get('question'), qa.get('is_impossible', False)
  if not isinstance(question, str):
    raise _squad_error(path, where, _squad_field('question', question, 'a string'))
  if not isinstance(impossible, bool):
    raise _squad_error(path, where, _squad_field('is_impossible', impossible, 'true or false'))
  answers = _squad_answers(path, where, qa)
  # SQuAD 2.0 as the Hugging Face Hub's squad_v2 writes it: no is_impossible, answers: [].
  impossible = impossible or (version_2 and answers == [])
  if not version_2 and (impossible or answers == []):
    raise UserError(f"file '{path}' {where} is unanswerable "
                    f"({'is_impossible' if impossible else 'answers: []'}), a SQuAD 2.0 "
                    'question, which squad_v1 (never predicting no answer) cannot get right; '
                    'use --config.task=squad_v2 for SQuAD 2.0 files')
  if need_label and not (answers or impossible):
    raise UserError(f"file '{path}' {where} has no answers"
                    f"{' (nor is_impossible: true)' if version_2 else ''}; fine-tuning trains "
                    'and scores answered questions (a file to predict may leave them out)')
  return dict(id=qid, question=question, context=context,
              answers=[] if impossible else answers or [], is_impossible=impossible)


def squad_file_examples(path: str, version_2: bool,
                        need_label: bool = True) -> tuple[list[dict], bool]:
  """(examples, labelled) of a SQuAD-format JSON file (the official train/dev files: data ->
  paragraphs -> qas). labelled: every question has its answers (or is_impossible); need_label
  makes one without them an error (fine-tuning's files; predict's may have none). A file of
  another shape is an error naming the question (by id) or paragraph, not a traceback or a
  question the tokenizer chokes on later; so is an unanswerable question for a SQuAD 1.1
  task (version_2 false): trained towards [CLS] and scored against a no-answer it never
  predicts, it would cap F1 silently."""
  resolved = paths.resolve(path)
  _check_file(path, resolved, 'a SQuAD-format JSON file')
  try:
    top = json.loads(paths.read_text(resolved))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"file '{path}' is not JSON ({type(e).__name__}: {first_line(e)}); "
                    f'{_SQUAD_SHAPE}') from None
  articles = top.get('data') if isinstance(top, dict) else None
  if not isinstance(articles, list):
    raise UserError(f"file '{path}' is not SQuAD-format JSON (no list at \"data\"); "
                    f'{_SQUAD_SHAPE}')
  examples, ids = [], set()
  for a, article in enumerate(articles, 1):
    paragraphs = article.get('paragraphs') if isinstance(article, dict) else None
    if not isinstance(paragraphs, list):
      raise _squad_error(path, f'article {a}', 'is not an object with a list of paragraphs')
    for p, paragraph in enumerate(paragraphs, 1):
      where = f'article {a} paragraph {p}'
      if not isinstance(paragraph, dict):
        raise _squad_error(path, where, f'is {paragraph!r:.40}, not an object')
      context, qas = paragraph.get('context'), paragraph.get('qas')
      if not isinstance(context, str):
        raise _squad_error(path, where, _squad_field('context', context, 'a string'))
      if not isinstance(qas, list):
        raise _squad_error(path, where, _squad_field('qas', qas, 'a list of questions'))
      for q, qa in enumerate(qas, 1):
        examples.append(_squad_question(path, f'{where} question {q}', qa, context, ids,
                                        version_2, need_label))
  if not examples:
    raise UserError(f"file '{path}' holds no questions")
  return examples, all(e['answers'] or e['is_impossible'] for e in examples)


def answers_in_place(examples: list[dict], path: str) -> list[dict]:
  """The training questions of a SQuAD-format file whose answer (the first, the one trained on)
  is in the context at its answer_start, and the unanswerable ones. Another answer would train
  the span head on other text: they are left out with a warning, as the official code leaves
  out answers it cannot find. Most answers elsewhere means the file's answer_start is not a
  character offset (bytes, tokens): an error."""
  kept, misplaced = [], []
  for e in examples:
    (misplaced if e['answers'] and not _answer_in_place(e) else kept).append(e)
  if not misplaced:
    return examples
  answered = [e for e in examples if e['answers']]
  text, start = misplaced[0]['answers'][0]
  first = (f"question '{misplaced[0]['id']}': answer {text!r} at {start}, the context there "
           f"{misplaced[0]['context'][start:start + len(text)]!r}")
  if len(misplaced) > len(answered) / 2:
    raise UserError(f"file '{path}': {len(misplaced)} of its {len(answered)} answers are not in "
                    f'the context at their answer_start ({first}); answer_start must count '
                    "characters of the context, from 0")
  logging.warning("left %d of the %d answered questions of '%s' out of training: the answer is "
                  'not in the context at its answer_start (%s)', len(misplaced), len(answered),
                  path, first)
  return kept


def _answer_in_place(example: dict) -> bool:
  text, start = example['answers'][0]
  return example['context'][start:start + len(text)] == text


# --- User files (task=files) ------------------------------------------------------------------

_DELIMITED = {'.csv': ',', '.tsv': '\t'}
_FLOAT_LITERAL = re.compile(r'^[+-]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][+-]?\d+)$')
FILE_FORMATS = 'CSV/TSV (a header row), JSON Lines, Parquet or Arrow'


def _cell(value) -> str | None:
  """A value as the text a CSV cell would hold (numbers as JSON: 1, 0.5; dates and the like as
  str); a missing one (null) stays None."""
  if value is None or isinstance(value, str):
    return value
  return json.dumps(value, default=str)


def _skip_hint(skip_bad_rows: bool | None) -> str:
  """How an error offers skipping (False: fine-tuning, where it is off; None: not offered)."""
  return '' if skip_bad_rows is None else ', or set --config.skip_bad_rows=true to skip such rows'


def _note_skipped(path: str, count: int, what: str, unit: str = 'row(s)') -> None:
  if count:
    logging.warning("skipped %d %s of '%s' %s (skip_bad_rows)", count, unit, path, what)


# After a \r that ends a line without a \n (old Mac Excel's CSVs).
_LONE_CR = re.compile(r'(?<=\r)(?=[^\n])')


def _csv_lines(lines, ended: list):
  r"""read_lines' lines (UTF-8 checked, no byte-order mark, each ending at a \n) split as csv
  wants them, as a file opened with newline='' splits (at \r\n, \n or \r); `ended` gets an
  item once the last is read."""
  for line in lines:
    yield from _LONE_CR.split(line)
  ended.append(True)


def _check_file(path: str, resolved: str, what: str):
  """A data file named by the user exists and is a file; else one line saying which it is not,
  naming a directory's data files (e.g. `datasets`' save_to_disk writes data-*.arrow)."""
  if paths.is_file(resolved):
    return
  if not paths.is_dir(resolved):
    raise UserError(f"file '{path}' not found; pass {what}")
  files = sorted(n for n in paths.listdir(resolved) if not n.startswith(('.', 'state.json',
                                                                          'dataset_info.json')))
  example = f" (it holds e.g. '{paths.join(resolved, files[0])}')" if files else ''
  raise UserError(f"'{path}' is a directory{example}; pass {what}, one file")


def read_rows(path: str, fieldnames: tuple = (), skip_bad_rows: bool | None = None) -> list[dict]:
  """Rows of a CSV/TSV (header row required), JSON Lines (.gz, .zst too), Parquet or Arrow file
  (the Hugging Face Hub's datasets, `datasets`' save_to_disk) as dicts of strings (None where a
  value is missing). `fieldnames`: a TSV's columns where it may lack its header row (CoLA's
  GLUE TSVs): a first line of as many fields, none of them one of these names, is a row.
  `skip_bad_rows`: True drops (and counts in the log) CSV/TSV rows of more fields than the
  header, False names the first and offers the option, None (predictions) names it."""
  resolved = paths.resolve(path)
  _check_file(path, resolved, f'an existing {FILE_FORMATS} file')
  records = _records(resolved)
  if records is None:
    delimiter = next((d for ext, d in _DELIMITED.items() if resolved.lower().endswith(ext)),
                     None)
    if delimiter is None:
      raise UserError(f"file '{path}' is not .csv, .tsv, JSON Lines (.jsonl, .ndjson, .json; "
                      '.gz, .zst), .parquet or .arrow; rename it or convert it')
    quoting = csv.QUOTE_MINIMAL if delimiter == ',' else csv.QUOTE_NONE
    ended = []  # Gets an item once the last line is read.
    lines = _csv_lines(sources.read_lines(resolved, flags=None), ended)
    first = next(lines, '')
    header = next(csv.reader([first], delimiter=delimiter, quoting=quoting), [])
    headerless = bool(fieldnames) and delimiter == '\t' and (
        len(header) == len(fieldnames) and not set(header) & set(fieldnames))
    reader = csv.DictReader(itertools.chain([first], lines),
                            fieldnames=list(fieldnames) if headerless else None,
                            delimiter=delimiter, quoting=quoting)
    rows, skipped, row_end = [], 0, 1
    for row in reader:
      # csv ends a row at the end of a line, or where a quote left open made the rest of the
      # file one field: at its end (a test file would read as one unlabelled example).
      if ended:
        raise UserError(f"file '{path}' line {row_end + 1} opens a quoted field that no later "
                        'line closes; close the quote (write a quote inside a quoted field '
                        'twice: "")')
      row_end = reader.line_num
      # More fields than the header's would shift every later column, a label read from the
      # text; empty ones (a trailing delimiter) are dropped.
      extra = row.pop(None, None)  # DictReader's key for the fields past the header's.
      if not extra or not any(field.strip() for field in extra):
        rows.append(row)
      elif skip_bad_rows:
        skipped += 1
      else:
        fix = ('a TSV field cannot hold a tab (TSVs are read unquoted)' if delimiter == '\t'
               else 'quote a field that holds a comma')
        raise UserError(f"file '{path}' line {reader.line_num} has "
                        f'{len(reader.fieldnames) + len(extra)} fields, its header '
                        f'{len(reader.fieldnames)}; {fix}: fix the line, or write the file as '
                        f'JSON Lines{_skip_hint(skip_bad_rows)}')
    _note_skipped(path, skipped, 'with more fields than the header')
    return rows
  return [{k: _cell(v) for k, v in record.items()} for record in records]


def _records(resolved: str) -> list[dict] | None:
  """A JSON Lines, Parquet or Arrow file's records as they are (ClassLabel ids as names); None
  for any other file."""
  if sources.is_json_lines(resolved):
    return [row for _, row in sources.read_json_records(resolved, flags=None)]
  if sources.is_columnar(resolved):
    with sources.open_columnar(resolved) as columnar:
      return _with_class_names(columnar.rows(), columnar.schema)
  return None


def _class_label_names(feature) -> list | None:
  if isinstance(feature, dict) and feature.get('_type') == 'ClassLabel':
    return feature['names'] if isinstance(feature.get('names'), list) else None
  return None


def _with_class_names(records: list[dict], schema) -> list[dict]:
  """Class ids of the columns a `datasets` file declares ClassLabel (its schema's 'huggingface'
  metadata: the Hub's GLUE label is 0/1 of ['negative', 'positive']), or a list of ClassLabel
  (conll2003's ner_tags), as their names; -1 (the Hub's test splits: no label) as None."""
  try:
    features = json.loads((schema.metadata or {})[b'huggingface'])['info']['features']
  except (KeyError, TypeError, ValueError):
    return records
  names, listed = {}, {}
  for column, feature in features.items():
    if labels := _class_label_names(feature):
      names[column] = labels
    elif isinstance(feature, dict) and feature.get('_type') in ('List', 'Sequence'):
      if labels := _class_label_names(feature.get('feature')):
        listed[column] = labels

  def name(value, labels):
    if not isinstance(value, int):
      return value
    return labels[value] if 0 <= value < len(labels) else None

  for record in records:
    for column, labels in names.items():
      if column in record:
        record[column] = name(record[column], labels)
    for column, labels in listed.items():
      if isinstance(record.get(column), list):
        record[column] = [name(value, labels) for value in record[column]]
  return records


@dataclasses.dataclass(frozen=True)
class FileColumns:
  """Which columns of a classification file hold the text(s) and the label."""
  text: tuple = ()        # One or two names; () = the task's, else text, or text_a (and text_b).
  label: str = 'label'
  # A GLUE task's own names, each a choice: (('sentence1', 'sentence2'),); MNLI's: the Hub's
  # and TFDS's (premise, hypothesis), then GLUE's TSVs' (sentence1, sentence2).
  task_text: tuple = ()
  # Where `label` (the default label_column) is absent: the GLUE TSVs' (MNLI's gold_label).
  task_label: str | None = None
  # The text columns the file must be read by, each a choice (Task.trained_text_choices): a
  # file read after training; () for the training file itself.
  trained: tuple = ()


def file_columns(c, task: Task | None = None, trained: bool = False) -> FileColumns:
  """The columns a fine-tuning config names (config.text_columns, config.label_column), and a
  GLUE task's own column names to try first when it names none. trained: for a file read
  after training (eval, predict), which must hold the text columns training read."""
  names = tuple(n.strip() for n in (c.get('text_columns') or '').split(',') if n.strip())
  task_text, task_label, text_choices = (), None, ()
  if task is not None and task.kind in (CLASSIFICATION, REGRESSION):
    text_choices = task.trained_text_choices if trained else ()
    if task.text_keys:
      task_text = task.file_text_choices
      task_label = task.glue_tsv_label if c.get('label_column', 'label') in ('', 'label') else None
  return FileColumns(names, c.get('label_column') or 'label', task_text, task_label,
                     text_choices)


def with_file_text(task: Task, rows: list[dict], path: str, columns: FileColumns) -> Task:
  """`task` keeping the text columns its training file `rows` was read by (Task.file_text),
  unless they are one of the task's own."""
  text_a, text_b, _ = _columns(rows, path, columns=columns)
  found = (text_a, text_b) if text_b else (text_a,)
  return task if found in task.file_text_choices else dataclasses.replace(task, file_text=found)


def _columns(rows, path, need_label: bool = True,
             columns: FileColumns = FileColumns()) -> tuple[str, str | None, str]:
  """The columns of text_a, text_b (None: no pair) and the label; a UserError naming what
  the file lacks, or text columns other than columns.trained allows."""
  present = set().union(*rows)  # JSON Lines records need not all hold every field.
  named = columns.text or next((t for t in columns.task_text if set(t) <= present), ())
  if named:
    text_a, text_b = named[0], (named[1:] or [None])[0]
    missing = [name for name in named if name not in present]
  else:
    text_a = 'text' if 'text' in present else 'text_a' if 'text_a' in present else None
    text_b = 'text_b' if 'text_b' in present else None
    own = (f" (or the task's {' or '.join(', '.join(t) for t in columns.task_text)})"
           if columns.task_text else '')
    missing = [] if text_a else [f'text (or text_a){own}']
  found = tuple(name for name in (text_a, text_b) if name)
  # The generic names are fine as long as they hold as many texts as training read.
  generic = found in (('text',), ('text_a',), ('text_a', 'text_b')) and any(
      len(t) == len(found) for t in columns.trained)
  if columns.trained and found not in columns.trained and not generic:
    raise UserError(f"file '{path}' has text column(s) {', '.join(found) or 'none'} (its "
                    f'columns: {sorted(present)}) where the run trained on '
                    f"{' or '.join(', '.join(t) for t in columns.trained)}; give it the "
                    "training file's text columns (a pair model reads pairs, a one-text model "
                    'one text)')
  label = columns.label
  if label not in present and columns.task_label in present:
    label = columns.task_label
  if need_label and label not in present:
    missing.append(f'{label} (or {columns.task_label})' if columns.task_label else label)
  if missing:
    raise UserError(f"file '{path}' lacks column(s) {', '.join(missing)} (has "
                    f'{sorted(present)}); name them text or text_a/text_b, and label (CSV/TSV: '
                    'in a header row), or name yours when fine-tuning: --config.text_columns, '
                    '--config.label_column')
  return text_a, text_b, label


def _label_value(row: dict, column: str) -> str | None:
  """A row's label, None where it has none: absent, null, or blank (a CSV/TSV cannot write
  null, so an empty cell is its missing value, not a class named '')."""
  value = row.get(column)
  # Stripped: 'good' and ' good' (a space after a CSV comma) are one class.
  return None if value is None or not value.strip() else value.strip()


def complete_rows(rows: list[dict], path: str, columns: FileColumns = FileColumns(),
                  skip_bad_rows: bool = False) -> list[dict]:
  """The rows of a fine-tuning file that hold a label and a text value (a short CSV/TSV row, a
  record without them, lacks them); `skip_bad_rows` drops and counts the others, else the
  first is an error."""
  if not rows:
    raise UserError(f"file '{path}' has no examples")
  text_a, text_b, label = _columns(rows, path, columns=columns)
  if all(_label_value(row, label) is None for row in rows):
    raise UserError(f"file '{path}' has no {label} values (a test split?); fine-tune and "
                    'evaluate on labelled files, and predict this one with python -m '
                    'electra_jax.predict --input')
  kept = []
  for n, row in enumerate(rows, 1):
    missing = (label if _label_value(row, label) is None else
               text_a if row.get(text_a) is None else
               text_b if text_b and row.get(text_b) is None else None)  # A pair: both texts.
    if missing is None:
      kept.append(row)
    elif not skip_bad_rows:
      raise UserError(f"file '{path}' example {n} has no {missing} value; give every example "
                      f'one{_skip_hint(False)}')
  _note_skipped(path, len(rows) - len(kept), 'without a label or text value')
  return kept


def files_task(train_rows: list[dict], label_type: str = 'auto',
               path: str = 'the training file', columns: FileColumns = FileColumns()) -> Task:
  """The files task with its label names (sorted), or regression if the labels are floats."""
  if not train_rows:
    raise UserError(f"file '{path}' has no examples")
  label = _columns(train_rows, path, columns=columns)[2]
  labels = [_label_value(r, label) for r in train_rows]
  if None in labels:
    raise UserError(f"file '{path}' example {labels.index(None) + 1} has no label value; give "
                    'every training example one')
  if label_type == 'auto':
    floats = all(_is_float(x) for x in labels) and any(_FLOAT_LITERAL.match(x.strip())
                                                       for x in labels)
    label_type = 'regression' if floats else 'class'
  if label_type == 'regression':
    return named_files_task(())
  names = tuple(sorted(set(labels)))
  if len(names) < 2:
    raise UserError(f'the training file has a single label value {names}; a classifier needs '
                    'at least two classes')
  return named_files_task(names)


def named_files_task(label_names: tuple) -> Task:
  """The files task of these class names (none: a regression), as a run's results.json names
  them."""
  if not label_names:
    return dataclasses.replace(TASKS['files'], kind=REGRESSION, main_metric='spearman',
                               metric_names=())
  metrics = ('accuracy', 'f1', 'mcc') if len(label_names) == 2 else ('accuracy',)
  return dataclasses.replace(TASKS['files'], label_names=tuple(label_names),
                             metric_names=metrics)


def _is_float(x: str | None) -> bool:
  try:
    float(x)
    return True
  except (TypeError, ValueError):
    return False


def file_examples(task: Task, rows: list[dict], path: str, max_examples: int = 0,
                  need_label: bool = True, columns: FileColumns = FileColumns()) -> list[dict]:
  """Rows -> examples; labels become class ids (or floats) of `task`. need_label=False: a file
  without a label column gives unlabelled examples (label None; for predictions)."""
  if not rows:
    raise UserError(f"file '{path}' has no examples")
  text_a, text_b, label_column = _columns(rows, path, need_label, columns)

  def raw_label(row):
    # The Hub's GLUE test splits mark no label -1 (a ClassLabel's reads as None already; STS-B's
    # scores, 0 to 5, are floats: -1.0).
    raw = _label_value(row, label_column)
    return None if task.glue_test_files and _is_float(raw) and float(raw) == -1 else raw

  # A file to predict may have a label column without values.
  labelled = need_label or any(raw_label(row) is not None for row in rows)
  index = {name: i for i, name in enumerate(task.label_names)}
  examples = []
  for n, row in enumerate(rows[:_limit(max_examples, len(rows))], 1):
    raw = raw_label(row)
    if labelled and raw is None:
      if _label_value(row, label_column) is not None:  # -1: GLUE's mark of a test example.
        raise UserError(f"file '{path}' example {n} has label {row[label_column]!r}, GLUE's "
                        'mark of a test example without a label; fine-tune and evaluate on '
                        'labelled files (a test file is for predict --glue_test)')
      raise UserError(f"file '{path}' example {n} has no label value")
    for column in (text_a, text_b):  # A pair model is never fed a single text.
      if column and row.get(column) is None:
        raise UserError(f"file '{path}' example {n} has no {column} value")
    if not labelled:
      label = None
    elif task.kind == REGRESSION:
      # NaN or inf would make the loss and then every weight NaN, read as a diverged seed.
      if not (_is_float(raw) and math.isfinite(float(raw))):
        raise UserError(f"file '{path}' example {n} has label {raw!r}, not a finite number "
                        '(the training labels are floats: regression); give it a value or '
                        'remove the example')
      label = float(raw) / task.label_scale
    elif raw in index:
      label = index[raw]
    elif task.name != 'files' and re.fullmatch('[0-9]+', raw) and int(raw) < len(index):
      label = int(raw)  # A GLUE file's class id (GLUE's own TSVs write 0/1).
    else:
      raise UserError(f"file '{path}' example {n} has label {raw!r}, which the training file "
                      f'never uses (its labels: {list(task.label_names)}); the model cannot '
                      'predict it: remove such examples or add some to the training file')
    examples.append(dict(text_a=row[text_a], text_b=row.get(text_b) if text_b else None,
                         label=label, index=n - 1))
  return examples


# --- Tagging files (task=tagging) -------------------------------------------------------------

# A tagging file's sentence: its words, their tags (None: a file to predict without them) and
# its number in the file from 0 (the example's index: predictions name the input's sentence).
Sentence = tuple[list[str], list[str] | None, int]

# Tags of labelled spans: O, or a B/I/E/S (IOB1, IOB2, BIOES; L/U for E/S) prefix and a type.
_SPAN_TAG = re.compile(r'^(O|[BIESLU]-.+)$')


def read_conll(path: str, need_label: bool = True,
               skip_bad_rows: bool | None = None) -> list[Sentence]:
  """Sentences of a CoNLL-format file: one word per line, its tag in the last whitespace-
  separated column (CoNLL-2003's `word POS chunk NER` reads as word and NER), a blank line
  between sentences, -DOCSTART- lines skipped. Lines of one column are words without tags
  (a file to predict). Every line has the first's column count (a word holding a space,
  `New York`, would otherwise read as `New` and lose the rest): `skip_bad_rows` drops (and
  counts) the sentences of other lines, else the first is an error (None: skipping not
  offered, predict)."""
  resolved = paths.resolve(path)
  _check_file(path, resolved, 'a CoNLL-format file (one word and its tag per line, a blank '
              'line between sentences)')
  sentences, words, tags, width, bad, skipped, number = [], [], [], None, False, 0, 0
  text = ''.join(sources.read_lines(resolved, flags=None))  # UTF-8, or an error naming the file
  # Lines end at \n, \r\n or \r only: splitlines() also ends one at a form feed or U+2028,
  # which would cut a sentence in two and shift every later sentence's index.
  for n, line in enumerate(re.split(r'\r\n|\r|\n', text) + [''], 1):
    columns = line.split()
    if columns and columns[0] == '-DOCSTART-':
      continue
    if not columns:
      if words and not bad:
        sentences.append((words, tags if width > 1 else None, number))
      skipped += bad
      number += bool(words)
      words, tags, bad = [], [], False
      continue
    width = width or len(columns)
    if len(columns) != width:
      if not skip_bad_rows:
        raise UserError(f"file '{path}' line {n} has {len(columns)} column(s) where the file's "
                        f'first word has {width}; give every line the same columns (a word '
                        'without spaces and its tag; a file to predict: words alone)'
                        f'{_skip_hint(skip_bad_rows)}')
      bad = True
    words.append(columns[0])
    tags.append(columns[-1])
  _note_skipped(path, skipped, 'with a line of another column count', 'sentence(s)')
  if not sentences:
    raise UserError(f"file '{path}' holds no sentences; write one word (and its tag) per line, "
                    'a blank line between sentences')
  if need_label and width == 1:
    raise UserError(f"file '{path}' has no tags (one column); training and evaluation need "
                    'a tag after each word')
  return sentences


def tagging_task(sentences: list, path: str = 'the training file',
                 encoding: str = 'file') -> Task:
  """The tagging task of a training file's tags (sorted; its sentences in `encoding`). BIOES
  learns every prefix of the file's types, as encoded_task does, so a one-word chunk of a type
  the training file spans only over several words still has its S- tag."""
  names = tuple(sorted({t for _, tags, _ in sentences for t in tags}))
  if len(names) < 2:
    raise UserError(f"file '{path}' uses a single tag {names}; a tagger needs at least two")
  return encoded_task(named_tagging_task(names), encoding)


def named_tagging_task(tag_names: tuple) -> Task:
  """The files tagging task of these tags, scored as _tag_metrics says for them."""
  return dataclasses.replace(TASKS['tagging'], label_names=tuple(tag_names),
                             **_tag_metrics(all(_SPAN_TAG.match(t) for t in tag_names)))


TAG_ENCODINGS = ('file', 'bioes')


def to_bioes(tags: list[str]) -> list[str]:
  """The same chunks tagged BIOES: S-X alone, B-X I-X ... E-X, O outside (what the official
  tagging code trains on)."""
  out = ['O'] * len(tags)
  for start, end, kind in metrics.tag_spans(tags):
    if end - start == 1:
      out[start] = f'S-{kind}'
    else:
      out[start:end] = [f'B-{kind}'] + [f'I-{kind}'] * (end - start - 2) + [f'E-{kind}']
  return out


def _check_span_tags(tags, where: str):
  bad = sorted({t for t in tags if not _SPAN_TAG.match(t)})
  if bad:
    raise UserError(f"config.tag_encoding='bioes' re-encodes span tags (O, B-X, I-X, E-X, S-X); "
                    f"{where} has {bad[:5]}; use tag_encoding='file'")


def encode_tags(sentences: list, encoding: str, where: str) -> list:
  """Sentences [(words, tags or None, index)] with their tags in `encoding` ('file': as they
  are)."""
  if encoding == 'file':
    return sentences
  _check_span_tags({t for _, tags, _ in sentences for t in tags or ()}, where)
  return [(words, None if tags is None else to_bioes(tags), i) for words, tags, i in sentences]


def read_tagged_records(path: str, records: list[dict], columns: FileColumns,
                        need_label: bool = True, skip_bad_rows: bool | None = None
                        ) -> list[Sentence]:
  """Sentences of a JSON Lines, Parquet or Arrow file, a record each: its words (column
  text_columns, default tokens, as the Hub's and TFDS's conll2003) and tags (label_column, e.g.
  ner_tags: names, or ids of a `datasets` ClassLabel list); `skip_bad_rows` as read_conll's,
  for records without a list of words or of one tag per word. A record of no words has nothing
  to tag: it is skipped with a warning. A sentence's number is its record's, so predictions
  name their records whatever was skipped."""
  present = set().union(*records)
  words_column = columns.text[0] if columns.text else 'tokens'
  missing = [name for name, needed in ((words_column, True), (columns.label, need_label))
             if needed and name not in present]
  if missing:
    raise UserError(f"file '{path}' lacks column(s) {', '.join(missing)} (has {sorted(present)}); "
                    'name the words and tags columns when fine-tuning: --config.text_columns, '
                    '--config.label_column (e.g. tokens, ner_tags)')
  tagged = columns.label in present
  sentences, skipped, empty = [], 0, 0
  for n, record in enumerate(records, 1):
    words, tags = record.get(words_column), record.get(columns.label) if tagged else None
    problem = None
    if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
      problem = f'{words_column!r} is not a list of words'
    elif tagged and not (isinstance(tags, list) and len(tags) == len(words)
                         and all(isinstance(t, str) for t in tags)):
      problem = (f"{columns.label!r} is not a list of one tag name per word (ids need the "
                 "file's ClassLabel names)")
    if problem and not skip_bad_rows:
      raise UserError(f"file '{path}' record {n}: {problem}{_skip_hint(skip_bad_rows)}")
    skipped += bool(problem)
    empty += not problem and not words
    if words and not problem:
      sentences.append((words, tags, n - 1))
  _note_skipped(path, skipped, 'without a list of words and of one tag per word')
  if empty:
    logging.warning("skipped %d record(s) of '%s' without words (an empty %r list): nothing to "
                    'tag', empty, path, words_column)
  if not sentences:
    raise UserError(f"file '{path}' holds no sentences")
  return sentences


def read_tagged_file(path: str, encoding: str, need_label: bool = True,
                     columns: FileColumns = FileColumns(),
                     skip_bad_rows: bool | None = None) -> list:
  """A CoNLL-format file's sentences (read_conll), or a JSON Lines, Parquet or Arrow file's
  (read_tagged_records), with their tags in `encoding` (encode_tags)."""
  resolved = paths.resolve(path)
  records = _records(resolved) if paths.is_file(resolved) else None
  sentences = (read_conll(path, need_label, skip_bad_rows) if records is None else
               read_tagged_records(path, records, columns, need_label, skip_bad_rows))
  return encode_tags(sentences, encoding, f"file '{path}'")


def encoded_task(task: Task, encoding: str) -> Task:
  """A tagging task with the tag names the model learns under `encoding` (bioes: O and B/I/E/S
  of every type)."""
  if encoding == 'file':
    return task
  _check_span_tags(task.label_names, f'task {task.name}')
  kinds = {t[2:] for t in task.label_names if t != 'O'}
  return dataclasses.replace(task, label_names=tuple(sorted(
      {'O'} | {f'{p}-{k}' for k in kinds for p in 'BIES'})))


def is_span_tagging(task: Task) -> bool:
  return task.kind == TAGGING and 'f1' in task.metric_names


def tagging_examples(task: Task, sentences: list, path: str,
                     max_examples: int = 0) -> list[dict]:
  """Sentences -> examples with tag ids of `task` (label None for an untagged file), each
  keeping its sentence's own index."""
  ids = {name: i for i, name in enumerate(task.label_names)}
  examples = []
  for words, tags, index in sentences[:_limit(max_examples, len(sentences))]:
    unknown = sorted({t for t in tags or () if t not in ids})
    if unknown:
      raise UserError(f"file '{path}' sentence {index + 1} uses tag(s) {unknown} the training "
                      f'file never uses (its tags: {list(task.label_names)}); the model cannot '
                      'predict them: remove such sentences or add some to the training file')
    examples.append(dict(words=list(words), label=None if tags is None else
                         [ids[t] for t in tags], index=index))
  return examples
