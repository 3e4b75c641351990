"""A fine-tuned run's predictions on new data: GLUE's test splits as leaderboard files, any TFDS
split of the task, or a file; scored too where the data has labels.

Classification / regression: OUT/<name>.tsv (`index<TAB>prediction`: class names, or class ids
where the GLUE leaderboard wants them; regression on the task's own scale) and
OUT/<name>.jsonl (per example: index, prediction, the class probabilities, the label if known).
Tagging: OUT/<name>.conll (each word and its predicted tag, a blank line between sentences: the
input's format; whitespace in a word, which the format cannot hold, written as '_', as is an
empty word) and OUT/<name>.jsonl (per sentence: index, its number in the input, so a
sentence skipped leaves a gap; words, predicted tags, the tags if known). SQuAD:
OUT/<name>_predictions.json (question id -> answer, '' for none: what the official
evaluation script and the leaderboard read); SQuAD 2.0 also OUT/<name>_null_odds.json (each
question's no-answer probability: the script's --na-prob-file) and OUT/<name>_best_spans.json
(each question's best span however unanswerable it looks: with the null odds, what the script's
threshold search, best_f1, needs).
"""
import collections
import dataclasses
import json
import os
import re

import jax

from electra_jax import atomic
from electra_jax import parallel
from electra_jax import paths
from electra_jax import saved_config
from electra_jax import train_state as ts
from electra_jax.errors import UserError
from electra_jax.finetune import loop
from electra_jax.finetune import saved_run as saved_run_lib
from electra_jax.finetune import steps
from electra_jax.finetune import tasks as tasks_lib


@dataclasses.dataclass
class Part:
  """One set of examples to predict and the file names it gets."""
  name: str
  examples: list
  labelled: bool
  leaderboard: bool = False  # a GLUE test split, written as the leaderboard wants it
  source: str | None = None  # the file it was read from (None: a TFDS split)


def _limit(examples: list, max_examples: int) -> list:
  return examples[:max_examples] if max_examples else examples


def split_parts(run: saved_run_lib.FinetunedRun, split: str, max_examples: int = 0) -> list:
  """The task's TFDS `split`; 'test' of a GLUE task: its leaderboard splits (MNLI: matched,
  mismatched and the AX diagnostic)."""
  task, c = run.task, run.config
  if task.tfds_name is None:
    raise UserError(f'task {task.name} reads files, not TFDS splits; pass --input=FILE')
  if split == 'test' and task.glue_test_files:
    specs, leaderboard = task.glue_test_files, True
  else:
    specs, leaderboard = ((task.tfds_name, split, f'{task.name}_{split}'),), False
  parts = []
  for tfds_name, tfds_split, name in specs:
    into = f' --data_dir={c.tfds_data_dir}' if c.tfds_data_dir else ''
    files = ("GLUE's test files: --glue_test=FILE (the Hub's Parquet, GLUE's TSVs)" if leaderboard
             else 'the split as a file: --input=FILE')
    remedy = (f'prepare it with `tfds build {tfds_name} --file_format=array_record{into}`, or '
              f'predict {files}')
    source = tasks_lib.tfds_source(tfds_name, tfds_split, c.tfds_data_dir, c.tfds_download,
                                   remedy)
    if task.kind == tasks_lib.SPAN:
      examples = tasks_lib.squad_examples(source, max_examples)
      labelled = True
    elif task.kind == tasks_lib.TAGGING:
      examples = tasks_lib.tagging_tfds_examples(task, source, max_examples, c.tag_encoding)
      labelled = True
    else:
      examples = tasks_lib.glue_examples(task, source, max_examples)
      labelled = all(e['label'] is not None for e in examples)
    parts.append(Part(name, examples, labelled, leaderboard))
  return parts


def file_part(run: saved_run_lib.FinetunedRun, path: str, max_examples: int = 0) -> Part:
  """A CSV/TSV/JSON Lines/Parquet/Arrow file (label column optional), or for SQuAD a
  SQuAD-format JSON file."""
  name = os.path.splitext(paths.name(path))[0]
  if run.task.kind == tasks_lib.TAGGING:
    sentences = tasks_lib.read_tagged_file(path, run.config.tag_encoding, need_label=False,
                                           columns=tasks_lib.file_columns(run.config))
    examples = tasks_lib.tagging_examples(run.task, sentences, path, max_examples)
    return Part(name, examples, examples[0]['label'] is not None, source=path)
  if run.task.kind == tasks_lib.SPAN:
    examples, labelled = tasks_lib.squad_file_examples(path, tasks_lib.is_squad_v2(run.task),
                                                       need_label=False)
    return Part(name, _limit(examples, max_examples), labelled, source=path)
  examples = _file_examples(run, path, max_examples)[1]
  return Part(name, examples, examples[0]['label'] is not None, source=path)


def _file_examples(run: saved_run_lib.FinetunedRun, path: str, max_examples: int,
                   columns: tasks_lib.FileColumns | None = None):
  """A classification or regression file's rows and examples (default: the run's columns, its
  text columns those training read)."""
  rows = tasks_lib.read_rows(path, run.task.glue_tsv_headerless)
  columns = columns or tasks_lib.file_columns(run.config, run.task, trained=True)
  return rows, tasks_lib.file_examples(run.task, rows, path, max_examples, need_label=False,
                                       columns=columns)


# A GLUE test file's own example ids: the Hub's `idx`, GLUE's TSVs' `index` (CoLA's and QQP's:
# `id`). The leaderboard matches predictions to examples by them.
GLUE_ID_COLUMNS = ('idx', 'index', 'id')


def glue_test_part(run: saved_run_lib.FinetunedRun, spec: str, max_examples: int = 0) -> Part:
  """--glue_test=[NAME=]FILE: a GLUE test file (the Hub's Parquet, GLUE's TSV; read as --input
  reads files) as the leaderboard's NAME.tsv, keyed by the file's own example ids (its row
  numbers where it has none). NAME may be left out where the task has one leaderboard file."""
  task = run.task
  names = [name for _, _, name in task.glue_test_files]
  if not names:
    raise UserError(f'--glue_test={spec}: task {task.name} has no GLUE leaderboard file; pass '
                    '--input=FILE')
  name, named, path = spec.partition('=')
  if not named or name not in names:
    if named and not paths.exists(paths.resolve(spec)):
      raise UserError(f'--glue_test={spec}: {name!r} is not a leaderboard file of task '
                      f"{task.name}; its files: {', '.join(names)} (--glue_test=NAME=FILE)")
    if len(names) > 1:
      raise UserError(f'--glue_test={spec}: task {task.name} has {len(names)} leaderboard files; '
                      'say which this is: ' + ', '.join(
                          f'--glue_test={n}=FILE ({tfds_name} {split})'
                          for tfds_name, split, n in task.glue_test_files))
    name, path = names[0], spec
  # GLUE's own files: the task's columns, whatever the run's training files named theirs.
  glue_columns = tasks_lib.file_columns({}, task)
  rows, examples = _file_examples(run, path, max_examples, glue_columns)
  present = set().union(*rows)  # JSON Lines records need not all hold every field.
  column = next((c for c in GLUE_ID_COLUMNS if c in present), None)
  if column is not None:
    for n, (example, row) in enumerate(zip(examples, rows), 1):
      value = row.get(column)
      if value is None or not re.fullmatch(r'[0-9]+', value.strip()):
        raise UserError(f"file '{path}' example {n} has {column} {value!r}, not an integer id; "
                        "a GLUE test file's ids are integers (the leaderboard matches by them)")
      example['index'] = int(value)
  ids = [e['index'] for e in examples]
  if len(set(ids)) < len(ids):
    repeated = next(i for i, count in collections.Counter(ids).items() if count > 1)
    raise UserError(f"file '{path}' repeats {column} {repeated}; a GLUE test file names each "
                    'example once')
  return Part(name, examples, examples[0]['label'] is not None, leaderboard=True,
              source=path)


def file_names(task, part: Part) -> list[str]:
  if task.kind == tasks_lib.TAGGING:
    return [f'{part.name}.conll', f'{part.name}.jsonl']
  if task.kind != tasks_lib.SPAN:
    return [f'{part.name}.tsv', f'{part.name}.jsonl']
  return [f'{part.name}_predictions.json'] + (
      [f'{part.name}_null_odds.json', f'{part.name}_best_spans.json']
      if tasks_lib.is_squad_v2(task) else [])


def check_output(output: str, task, parts: list, overwrite: bool) -> str:
  """The output directory, created; a UserError if a file it would write exists (and
  `overwrite` is off), is an input file (--input=DIR/eval.tsv --output=DIR: `overwrite` is for
  old predictions, never the user's data), two parts would write the same file, or it is a
  run's folder (a run or model's, with its config.json, or a run's own folder: a fine-tuning
  run's seed and network folders, whose metrics.jsonl is no prediction file, or a checkpoint
  step its rotation deletes)."""
  names = [n for part in parts for n in file_names(task, part)]
  if len(set(names)) < len(names):
    raise UserError(f'two inputs would write the same files ({sorted(names)}); give the files '
                    'different names')
  inputs = {part.source: paths.resolve(part.source) for part in parts if part.source is not None}
  directory = paths.absolute(output)
  if saved_config.exists(directory):
    raise UserError(f"--output '{output}' holds a run or a model ({saved_config.path(directory)})"
                    '; pass a folder of its own for the predictions')
  inside = saved_run_lib.run_folder_above(directory)
  if inside is not None:
    raise UserError(f"--output '{output}' lies in {inside[1]}/ of the run in '{inside[0]}'; "
                    'pass a folder of its own for the predictions (e.g. FT_DIR/predictions)')
  for name in names:
    target = paths.join(directory, name)
    # contains: the same path (symlinks resolved); nothing lies below a file.
    clash = next((i for i, found in inputs.items() if paths.contains(target, found)), None)
    if clash is not None:
      raise UserError(f"--output '{output}' would write {name} over the input file '{clash}'; "
                      'pass another --output')
  output = paths.check_writable_dir(output, '--output')
  folders = [n for n in names if paths.is_dir(paths.join(output, n))]
  if folders:  # Not even --overwrite replaces a folder: it may hold anything.
    raise UserError(f"--output '{output}' holds a folder named {folders[0]}, where a prediction "
                    'file goes; pass another --output or move it away')
  existing = [n for n in names if paths.exists(paths.join(output, n))]
  if existing and not overwrite:
    raise UserError(f"--output '{output}' already holds {', '.join(existing)}; pass another "
                    '--output or --overwrite')
  return output


class Predictor:
  """The run's model at one seed's best epoch, jitted over the mesh."""

  def __init__(self, run: saved_run_lib.FinetunedRun, seed: int, batch_size: int | None):
    """batch_size None: the run's eval_batch_size, rounded up to a multiple of the devices
    (predictions do not depend on the batch)."""
    self.mesh = parallel.make_mesh()
    if batch_size is None:
      batch_size = parallel.fill_up_to_devices(run.config.eval_batch_size, self.mesh)
    parallel.check_batch_divides(batch_size, self.mesh, '--batch_size')
    self.run, self.batch_size = run, batch_size
    model = loop.make_model(run.task, run.model_config, run.config.classifier_pooling,
                            run.config.head_init, run.config.span_head, run.config.tag_head)
    params, self.step = run.read_params(seed)
    self.params = jax.device_put(params, parallel.replicated(self.mesh))
    self._predict = ts.jit_eval_step(steps.make_predict(model, run.task, run.config), self.mesh)

  def features(self, part: Part) -> dict:
    return loop.encode(self.run.config, self.run.task, self.run.tokenizer, part.examples)

  def __call__(self, features: dict) -> dict:
    return loop.predict_all(self._predict, self.params, features, self.batch_size, self.mesh)


def _class_text(task, part: Part, class_id: int) -> str:
  if part.leaderboard and not task.glue_text_labels:
    return str(class_id)
  return task.label_names[class_id]


def _json(value, **dump_args) -> str:
  """JSON with text as written (the files are UTF-8): a tagged word or an answer in any script
  reads as itself, not as \\u escapes."""
  return json.dumps(value, ensure_ascii=False, **dump_args)


def _conll_word(word: str) -> str:
  """A word as one CoNLL column: a JSON Lines file's `New York` (or '') would be two columns
  (or none), which conlleval and read_conll misread."""
  return re.sub(r'\s', '_', word) or '_'


def write_part(output: str, task, part: Part, outputs: dict, decoded=None) -> list:
  """Writes the part's files (each whole, atomically; SQuAD's and a tagger's from `decoded`,
  loop.decode's); returns their paths."""
  written = []

  def write(name, text):
    written.append(paths.join(output, name))
    atomic.write_text(written[-1], text)

  if task.kind == tasks_lib.SPAN:
    write(f'{part.name}_predictions.json', _json(decoded.answers, indent=2) + '\n')
    if decoded.no_answer is not None:
      write(f'{part.name}_null_odds.json', _json(decoded.no_answer, indent=2) + '\n')
      write(f'{part.name}_best_spans.json', _json(decoded.best_spans, indent=2) + '\n')
    return written
  if task.kind == tasks_lib.TAGGING:
    conll, details = [], []
    for example, tags in zip(part.examples, decoded):
      conll.append(''.join(f'{_conll_word(w)}\t{t}\n' for w, t in zip(example['words'], tags)))
      detail = dict(index=example['index'], words=example['words'], prediction=tags)
      if example['label'] is not None:
        detail['label'] = [task.label_names[t] for t in example['label']]
      details.append(_json(detail))
    write(f'{part.name}.conll', '\n'.join(conll))
    write(f'{part.name}.jsonl', '\n'.join(details) + '\n')
    return written
  lines, details = ['index\tprediction'], []
  for i, example in enumerate(part.examples):
    detail = dict(index=example['index'])
    if task.kind == tasks_lib.CLASSIFICATION:
      class_id = int(outputs['prediction'][i])
      lines.append(f"{example['index']}\t{_class_text(task, part, class_id)}")
      detail['prediction'] = task.label_names[class_id]
      detail['probabilities'] = {name: round(float(p), 6) for name, p in
                                 zip(task.label_names, outputs['probabilities'][i])}
      if example['label'] is not None:
        detail['label'] = task.label_names[example['label']]
    else:
      value = float(outputs['prediction'][i]) * task.label_scale
      lines.append(f"{example['index']}\t{value:.6g}")
      detail['prediction'] = round(value, 6)
      if example['label'] is not None:
        detail['label'] = round(example['label'] * task.label_scale, 6)
    details.append(_json(detail))
  write(f'{part.name}.tsv', '\n'.join(lines) + '\n')
  write(f'{part.name}.jsonl', '\n'.join(details) + '\n')
  return written


def predict(run: saved_run_lib.FinetunedRun, parts: list, output: str, seed: int | None = None,
            batch_size: int | None = None, overwrite: bool = False, say=print) -> dict:
  """Predicts every part with the run's best (or `seed`'s) checkpoint; returns the summary."""
  with paths.new_dirs_removed_on_failure(output):  # A refused seed leaves no empty --output.
    return _predict(run, parts, check_output(output, run.task, parts, overwrite),
                    seed, batch_size, say)


def _predict(run, parts, output, seed, batch_size, say) -> dict:
  task = run.task
  seed = run.best_seed() if seed is None else seed
  predictor = Predictor(run, seed, batch_size)
  say(f'Predicting with {run.workdir} (task {task.name}, seed {seed}, step {predictor.step}) '
      f'into {output}', flush=True)
  results = []
  for part in parts:
    features = predictor.features(part)
    outputs = predictor(features)
    decoded = loop.decode(task, run.config, features, outputs, part.examples)
    files = write_part(output, task, part, outputs, decoded)
    result = dict(name=part.name, examples=len(part.examples), files=files)
    if part.labelled:
      eval_set = loop.EvalSet(prefix='', features=features, examples=part.examples)
      result['metrics'] = loop.score(task, run.config, eval_set, outputs, decoded)
    metrics = ', '.join(f'{k} {v:.4f}' for k, v in result.get('metrics', {}).items())
    say(f'{part.name}: {len(part.examples)} examples -> {", ".join(map(paths.name, files))}'
        + (f' | {metrics}' if metrics else ''), flush=True)
    results.append(result)
  return dict(workdir=run.workdir, task=task.name, seed=seed, step=predictor.step,
              output=output, parts=results)
