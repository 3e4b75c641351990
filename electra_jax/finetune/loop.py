"""The fine-tuning driver: data -> one run per seed (train, evaluate every epoch, keep the best
epoch's params) -> median over seeds. Writes FT_DIR/{config.json, network/, init.json,
results.json, seed_<k>/metrics.jsonl, seed_<k>/best/<step>/, seed_<k>/run.json}; a killed run
resumes from seed_<k>/resume/ (progress.py)."""
import dataclasses
import itertools
import sys
import time

import jax
import ml_collections
import numpy as np
import tqdm

from electra_jax import atomic
from electra_jax import checkpoint
from electra_jax import experiment as experiment_lib
from electra_jax import optim
from electra_jax import parallel
from electra_jax import paths
from electra_jax import saved_config
from electra_jax import stop_request
from electra_jax import train_state as ts
from electra_jax.errors import UserError
from electra_jax.finetune import features as features_lib
from electra_jax.finetune import heads
from electra_jax.finetune import metrics as metrics_lib
from electra_jax.finetune import pretrained
from electra_jax.finetune import progress
from electra_jax.finetune import saved_run
from electra_jax.finetune import settings
from electra_jax.finetune import spans
from electra_jax.finetune import steps
from electra_jax.finetune import tasks as tasks_lib

@dataclasses.dataclass
class EvalSet:
  prefix: str          # metric-name prefix ('' for the main split, 'mismatched_' for MNLI-mm)
  features: dict       # numpy arrays, one row per example (per window for SQuAD)
  examples: list       # the raw examples (SQuAD answers are decoded against them)


@dataclasses.dataclass
class Data:
  task: tasks_lib.Task
  train: dict
  evals: list


# --- Data ---------------------------------------------------------------------------------------

def encode(c, task, tokenizer, examples):
  if task.kind == tasks_lib.SPAN:
    return features_lib.encode_squad(tokenizer, examples, c.max_seq_length, c.doc_stride,
                                     c.max_query_length)
  if task.kind == tasks_lib.TAGGING:
    return features_lib.encode_tagging(tokenizer, examples, c.max_seq_length, c.doc_stride,
                                       segment_id=int(c.tag_head == 'official'))
  return features_lib.encode_classification(tokenizer, examples, c.max_seq_length,
                                            task.kind == tasks_lib.REGRESSION)


# The tasks that read a user's train_file / eval_file, and the format each takes.
_FILE_FORMATS = {'files': f'{tasks_lib.FILE_FORMATS} with columns text or text_a/text_b, and '
                          'label (or --config.text_columns, --config.label_column)',
                 'tagging': 'CoNLL format: a word and its tag per line, a blank line between '
                            'sentences'}


def reads_files(c, task) -> bool:
  """The task reads config.train_file / eval_file: files and tagging always, a GLUE or SQuAD
  task when given them (its TFDS dataset otherwise)."""
  return task.name in _FILE_FORMATS or (
      task.kind in (tasks_lib.CLASSIFICATION, tasks_lib.REGRESSION, tasks_lib.SPAN)
      and bool(c.train_file or c.eval_file))


def _file_formats(task) -> str:
  if task.name in _FILE_FORMATS:
    return _FILE_FORMATS[task.name]
  if task.kind == tasks_lib.SPAN:
    return 'SQuAD-format JSON, as the official train-v2.0.json and dev-v2.0.json'
  names = ' or '.join(', '.join(keys) for keys in task.file_text_choices)
  label = f'label (or {task.glue_tsv_label})' if task.glue_tsv_label else 'label'
  return f"{tasks_lib.FILE_FORMATS} with the task's columns ({names}) and {label}"


def load_data(c, task, tokenizer) -> Data:
  """Reads and encodes the train split and every eval split of the task."""
  task, train, evals = read_examples(c, task)
  return Data(task=task, train=encode(c, task, tokenizer, train),
              evals=[EvalSet(prefix, encode(c, task, tokenizer, ex), ex) for prefix, ex in evals])


def read_examples(c, task) -> tuple:
  """(task, train examples, [(eval prefix, eval examples)]): the task's data read, before any
  tokenizer (a file task's labels come from its train file)."""
  from_files = reads_files(c, task)
  for key in ('train_file', 'eval_file') if from_files else ():
    if not c[key]:
      raise UserError(f'config.task={task.name} needs --config.{key}=PATH '
                      f'({_file_formats(task)})')
  if task.name == 'tagging':
    columns = tasks_lib.file_columns(c)
    read = lambda path: tasks_lib.read_tagged_file(path, c.tag_encoding, columns=columns,
                                                   skip_bad_rows=c.skip_bad_rows)
    train_sentences = read(c.train_file)
    task = tasks_lib.tagging_task(train_sentences, c.train_file, c.tag_encoding)
    train = tasks_lib.tagging_examples(task, train_sentences, c.train_file, c.max_train_examples)
    evals = [('', tasks_lib.tagging_examples(task, read(c.eval_file), c.eval_file,
                                             c.max_eval_examples))]
  elif from_files and task.kind == tasks_lib.SPAN:  # The official JSON files.
    read = lambda path: tasks_lib.squad_file_examples(path, tasks_lib.is_squad_v2(task))[0]
    train = tasks_lib.answers_in_place(read(c.train_file),
                                       c.train_file)[:c.max_train_examples or None]
    evals = [('', read(c.eval_file)[:c.max_eval_examples or None])]
  elif from_files:  # Your files, or a GLUE task's own copies (GLUE's, the Hub's).
    read = lambda path, columns: tasks_lib.complete_rows(
        tasks_lib.read_rows(path, task.glue_tsv_headerless, c.skip_bad_rows), path, columns,
        c.skip_bad_rows)
    columns = tasks_lib.file_columns(c, task)
    train_rows = read(c.train_file, columns)
    if task.name == 'files':
      task = tasks_lib.files_task(train_rows, c.label_type, c.train_file, columns)
    # The eval file is read by the training file's text columns (a pair model on pairs).
    task = tasks_lib.with_file_text(task, train_rows, c.train_file, columns)
    eval_columns = tasks_lib.file_columns(c, task, trained=True)
    eval_rows = read(c.eval_file, eval_columns)
    train = tasks_lib.file_examples(task, train_rows, c.train_file, c.max_train_examples,
                                    columns=columns)
    evals = [('', tasks_lib.file_examples(task, eval_rows, c.eval_file, c.max_eval_examples,
                                          columns=eval_columns))]
  else:
    source = lambda split: tasks_lib.tfds_source(task.tfds_name, split, c.tfds_data_dir,
                                                 c.tfds_download)
    if task.kind == tasks_lib.SPAN:
      read = tasks_lib.squad_examples
    elif task.kind == tasks_lib.TAGGING:
      task = tasks_lib.encoded_task(task, c.tag_encoding)
      read = lambda src, n: tasks_lib.tagging_tfds_examples(task, src, n, c.tag_encoding)
    else:
      read = lambda src, n: tasks_lib.glue_examples(task, src, n)
    train = read(source(task.train_split), c.max_train_examples)
    evals = [(prefix, read(source(split), c.max_eval_examples))
             for split, prefix in task.eval_splits]
  if c.double_unordered and task.unordered_pair:
    train += [dict(e, text_a=e['text_b'], text_b=e['text_a']) for e in train]
  if not train:
    raise UserError(f'task {task.name}: the training split has no examples')
  return task, train, evals


def _num_rows(features: dict) -> int:
  return len(next(iter(features.values())))


def _model_inputs(features: dict) -> dict:
  """The arrays the model reads (SQuAD's character spans, tagging's word indices, and the
  windows' example ids and max-context marks stay on the host)."""
  return {k: v for k, v in features.items()
          if k not in ('token_begin', 'token_end', 'example_index', 'token_is_max_context',
                       'word_index', 'word_is_max_context')}


def train_batches(features: dict, batch_size: int, seed: int, epoch: int, mesh):
  """One epoch of shuffled global batches, this process's rows of each (parallel.process_rows
  of `mesh`): the rows a last partial batch would hold sit this epoch out (other rows each
  epoch); fewer rows than one batch fill it by repeating."""
  n = _num_rows(features)
  order = np.random.default_rng([seed, epoch]).permutation(n)
  held = parallel.process_rows(mesh, batch_size)
  for start in range(0, max(n // batch_size, 1) * batch_size, batch_size):
    rows = order[(start + held) % n]
    yield {k: v[rows] for k, v in _model_inputs(features).items()}


def steps_per_epoch(features: dict, batch_size: int) -> int:
  return max(_num_rows(features) // batch_size, 1)


def predict_all(predict_step, params, features: dict, batch_size: int, mesh) -> dict:
  """Predictions for every row, in order; the last batch is padded and the padding dropped."""
  n = _num_rows(features)
  inputs = _model_inputs(features)
  outputs = []
  rng = jax.random.key(0)
  held = parallel.process_rows(mesh, batch_size)
  for start in range(0, n, batch_size):
    rows = np.minimum(start + held, n - 1)
    local = {k: v[rows] for k, v in inputs.items()}
    out = predict_step(params, parallel.global_batch(local, mesh), rng)
    outputs.append(jax.tree.map(np.asarray, jax.device_get(out)))
  merged = {k: np.concatenate([o[k] for o in outputs])[:n] for k in outputs[0]}
  return merged


def word_tags(task, features: dict, outputs: dict, examples: list) -> list[list[str]]:
  """Each sentence's predicted tag names, one per word, each read from the word's max-context
  window (encode_tagging)."""
  tags = [[None] * len(e['words']) for e in examples]
  read = features['word_is_max_context'] > 0
  for row, word, tag in zip(np.nonzero(read)[0], features['word_index'][read],
                            outputs['prediction'][read]):
    tags[features['example_index'][row]][word] = task.label_names[tag]
  return tags


def decode(task, c, features: dict, outputs: dict, examples: list):
  """What an eval set's metrics and prediction files both read, decoded once: SQuAD's answers
  (spans.Decoded), a tagger's word tags (word_tags), None for the other tasks."""
  if task.kind == tasks_lib.SPAN:
    return spans.decode(features, outputs, examples, c.max_answer_length,
                        tasks_lib.is_squad_v2(task), spans.NULL_THRESHOLDS[c.span_head])
  if task.kind == tasks_lib.TAGGING:
    return word_tags(task, features, outputs, examples)
  return None


def score(task, c, eval_set: EvalSet, outputs: dict, decoded=None) -> dict:
  """Task metrics (and mean eval loss) for one eval split; from `decoded` (decode's) when the
  caller has decoded it already."""
  f = eval_set.features
  if decoded is None:
    decoded = decode(task, c, f, outputs, eval_set.examples)
  result = dict(loss=float(np.mean(outputs['loss'])))
  if task.kind == tasks_lib.CLASSIFICATION:
    result.update(metrics_lib.classification_metrics(f['label'], outputs['prediction'],
                                                     task.metric_names))
  elif task.kind == tasks_lib.TAGGING:
    gold = [[task.label_names[t] for t in e['label']] for e in eval_set.examples]
    result.update(metrics_lib.tagging_metrics(gold, decoded, tasks_lib.is_span_tagging(task)))
  elif task.kind == tasks_lib.REGRESSION:
    # Scores on the original scale (STS-B targets were divided by label_scale for training).
    result.update(metrics_lib.regression_metrics(f['label'] * task.label_scale,
                                                 outputs['prediction'] * task.label_scale))
  else:
    gold = {e['id']: [a for a, _ in e['answers']] for e in eval_set.examples}
    # SQuAD 2.0 also gets the official script's breakdown and threshold search.
    result.update(metrics_lib.squad_metrics(decoded.answers, gold, decoded.best_spans,
                                            decoded.no_answer))
  return {eval_set.prefix + k: v for k, v in result.items()}


# --- Model and initialisation ---------------------------------------------------------------------

def make_model(task, model_config, pooling: str = 'cls', head_init: str = 'normal',
               span_head: str = 'xlnet', tag_head: str = 'transformers') -> heads.FinetuneModel:
  if task.kind == tasks_lib.SPAN and span_head == 'bert':
    head = heads.LinearSpanHead(model_config.dtype, head_init)
  elif task.kind == tasks_lib.SPAN:
    head = heads.SpanHead(model_config.hidden_size, model_config.dtype, head_init, span_head)
  elif task.kind == tasks_lib.TAGGING:
    head = heads.TokenHead(task.num_outputs,
                           0.0 if tag_head == 'official' else model_config.dropout_rate,
                           model_config.dtype, head_init)
  else:
    head = heads.ClassificationHead(task.num_outputs, model_config.dropout_rate,
                                    model_config.dtype, pooling, head_init)
  return heads.FinetuneModel(model_config, head)


def init_params(model, sample: dict, rng, pretrained_params=None):
  """Fresh params from `rng`; the encoder is replaced by the pretrained one when given."""
  batch = {k: v[:1] for k, v in _model_inputs(sample).items()}
  params = jax.jit(lambda r: model.init({'params': r}, batch)['params'])(rng)
  if pretrained_params is None:
    return params
  fresh = jax.tree_util.tree_structure(params['electra'])
  if jax.tree_util.tree_structure(pretrained_params) != fresh:
    raise UserError('the pretrained parameters do not match the fine-tuning model '
                    '(different architecture or format); check config.init_checkpoint')
  for got, want in zip(jax.tree.leaves(pretrained_params), jax.tree.leaves(params['electra'])):
    if got.shape != want.shape:
      raise UserError(f'pretrained parameter shape {got.shape} differs from the model\'s '
                      f'{want.shape}; check config.init_checkpoint')
  return dict(params, electra=jax.tree.map(jax.numpy.asarray, pretrained_params))


# --- One seed -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Trainer:
  """What every seed shares: the model, optimizer and the compiled steps."""
  model: heads.FinetuneModel
  tx: object
  schedule: object
  train_step: object
  predict_step: object
  init_state: object


def make_trainer(c, task, model, model_config, sample_params, num_steps: int, mesh) -> Trainer:
  warmup = int(round(c.warmup_fraction * num_steps))
  tx, schedule = optim.make_finetune_optimizer(c, sample_params, model_config.num_layers,
                                               num_steps, warmup)
  rep = parallel.replicated(mesh)
  init_state = jax.jit(lambda p: ts.TrainState(step=jax.numpy.zeros((), jax.numpy.int32),
                                               params=p, opt_state=tx.init(p)),
                       out_shardings=rep)
  objective = steps.TaskObjective(model, task, c.answerable_weight, c.loss_reduction,
                                  c.span_head)
  train_step = ts.make_train_step(objective, tx, c.grad_accum_steps)
  return Trainer(model, tx, schedule, ts.jit_train_step(train_step, mesh),
                 ts.jit_eval_step(steps.make_predict(model, task, c), mesh), init_state)


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tree)


def _best_record(history: list, main_key: str):
  """The first epoch with the highest main metric (later ties do not replace it; NaN ranks
  below every number)."""
  best = None
  for record in history:
    if best is None or metrics_lib.ranked(record[main_key]) > metrics_lib.ranked(best[main_key]):
      best = record
  return best


def run_seed(c, data: Data, trainer: Trainer, pretrained_params, seed: int, mesh,
             seed_dir: str, bar, stop) -> dict | None:
  """Trains one run for c.num_epochs, evaluating after each, from its resume state if it has
  one; returns its history and best, or None if `stop` asked it to stop (its state saved)."""
  task = data.task
  main_key = f'eval_{task.main_metric}'
  params = init_params(trainer.model, data.train, jax.random.key(seed), pretrained_params)
  state = trainer.init_state(jax.device_put(params, parallel.replicated(mesh)))
  train_step, predict_step, schedule = trainer.train_step, trainer.predict_step, trainer.schedule
  base_rng = jax.random.fold_in(jax.random.key(seed), 1)
  per_epoch = steps_per_epoch(data.train, c.train_batch_size)

  # The resume state is the commit point: saves after it (a best epoch, metrics rows) that it
  # does not reach are dropped and made again, identically.
  resume_ckpt = checkpoint.Checkpointer(paths.join(seed_dir, progress.RESUME), keep=1,
                                        async_save=False)
  position, committed = progress.Position(), resume_ckpt.latest_step()
  if committed is not None:
    with resume_ckpt.reading(committed, other_tree=(
        f'remove {resume_ckpt.step_path(committed)} to train seed {seed} again from its '
        'start; ')):
      state, loop_state = resume_ckpt.restore(committed, _abstract(state), with_loop=True)
    position = progress.Position.from_json(loop_state)
    bar.write(f'seed {seed}: resuming at epoch {position.epoch}, step {committed}',
              file=sys.stdout)
  history = position.history
  best = _best_record(history, main_key)
  best_ckpt = None
  if c.save_best_checkpoint:
    best_ckpt = progress.open_best(seed_dir)
    progress.prune_best(best_ckpt, best['step'] if best else None)  # Uncommitted bests go.
  progress.write_metrics(seed_dir, history)

  def close():
    resume_ckpt.close()
    if best_ckpt is not None:
      best_ckpt.close()

  bar.update((position.epoch - 1) * per_epoch + position.batches_done)

  def save_position(step: int):
    resume_ckpt.save(step, state, force=True, loop_state=position.to_json())

  for epoch in range(position.epoch, c.num_epochs + 1):
    batches = train_batches(data.train, c.train_batch_size, seed, epoch, mesh)
    for batch in itertools.islice(batches, position.batches_done, None):
      state, sums = train_step(state, parallel.global_batch(batch, mesh), base_rng)
      sums = jax.device_get(sums)
      position.loss_sum += float(sums['loss_sum'])
      position.count += float(sums['num_examples'])
      position.batches_done += 1
      step = (epoch - 1) * per_epoch + position.batches_done
      bar.update(1)
      bar.set_postfix(seed=seed, epoch=epoch,
                      loss=f'{position.loss_sum / max(position.count, 1):.4f}', refresh=False)
      if position.batches_done == per_epoch:
        break  # The epoch's end saves.
      save_now = stop.signal is not None or (c.save_checkpoints_steps
                                             and step % c.save_checkpoints_steps == 0)
      # A diverged state is not saved: the epoch's end ends the seed (a resume redoes it).
      if save_now and checkpoint.all_finite(state):
        save_position(step)
      if stop.signal is not None:
        close()
        return None
    step = epoch * per_epoch
    record = dict(seed=seed, epoch=epoch, step=step,
                  train_loss=position.loss_sum / max(position.count, 1),
                  learning_rate=float(schedule(step - 1)))
    for eval_set in data.evals:
      outputs = predict_all(predict_step, state.params, eval_set.features, c.eval_batch_size,
                            mesh)
      record.update({f'eval_{k}': v for k, v in score(task, c, eval_set, outputs).items()})
    diverged = not checkpoint.all_finite(state.params)
    if diverged:  # NaN weights predict nothing (an argmax of NaN logits is no class): NaN.
      record.update({k: float('nan') for k in record if k.startswith('eval_')})
    history.append(record)
    bar.write(f'seed {seed} epoch {epoch}/{c.num_epochs} | train loss {record["train_loss"]:.4f}'
              f' | eval loss {record["eval_loss"]:.4f} | {task.main_metric} '
              f'{record[main_key]:.4f}', file=sys.stdout)
    best = _best_record(history, main_key)
    if diverged:
      # Fine-tuning takes every step (no skip), so NaN/inf weights stay: the seed ends here with
      # the epochs it has (its NaN metrics rank below every number) and the other seeds go on.
      bar.write(f'seed {seed} diverged in epoch {epoch} (NaN/inf weights) and stops there; a '
                'lower config.learning_rate may keep it finite', file=sys.stdout)
      close()
      progress.write_metrics(seed_dir, history)
      kept = best_ckpt is not None and best is not record  # Saved when it was the best.
      run = dict(seed=seed, best=best, final=record, history=history, diverged_in_epoch=epoch,
                 checkpoint=best_ckpt.step_path(best['step']) if kept else None)
      progress.finish_seed(seed_dir, run)
      return run
    if best is record and best_ckpt is not None:
      best_ckpt.save(step, state.params, force=True)
    if epoch == c.num_epochs:
      break  # The last epoch commits with the seed's run.json (finish_seed prunes the bests).
    position = progress.Position(epoch=epoch + 1, history=history)
    save_position(step)
    progress.write_metrics(seed_dir, history)
    if best_ckpt is not None:
      progress.prune_best(best_ckpt, best['step'])  # Committed: the superseded best goes.
    if stop.signal is not None:
      close()
      return None
  close()
  progress.write_metrics(seed_dir, history)
  run = dict(seed=seed, best=best, final=history[-1], history=history,
             checkpoint=best_ckpt.step_path(best['step']) if best_ckpt else None)
  progress.finish_seed(seed_dir, run)
  return run


# --- All seeds ----------------------------------------------------------------------------------

def _network(c):
  """(the network's pretraining-form config, its ModelConfig with c's dropout, dtype and remat,
  its tokenizer)."""
  source, tokenizer = pretrained.network_config(c)
  return source, pretrained.fine_tuned_config(source, c), tokenizer


def _pretrained_params(c, step: int | None):
  """The encoder to start from (step: the pretraining checkpoint's), None for random weights
  (random_init: the same architecture)."""
  if c.init_checkpoint and not c.random_init:
    return pretrained.load_pretrained(c.init_checkpoint, step)[0]
  return None


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs config.num_seeds fine-tuning runs, or resumes them in `workdir`; returns the summary
  (also in results.json), or status 'interrupted' if SIGTERM / Ctrl-C stopped it."""
  start_time = time.time()
  task = tasks_lib.get_task(config.task)
  source, model_config, tokenizer = _network(config)
  c = settings.resolve(config, task, model_config.hidden_size)
  workdir, resuming = progress.open_workdir(workdir, c)
  init_step = progress.init_step(workdir, c, resuming)
  params = _pretrained_params(c, init_step)
  mesh = parallel.make_mesh()
  parallel.check_batch_divides(c.train_batch_size, mesh, 'config.train_batch_size',
                               c.grad_accum_steps)
  parallel.check_batch_divides(c.eval_batch_size, mesh, 'config.eval_batch_size')
  data = load_data(c, task, tokenizer)
  task = data.task
  segment = max(int(f['segment_ids'].max(initial=0))
                for f in [data.train] + [e.features for e in data.evals])
  if segment >= model_config.type_vocab_size:  # jnp.take would read NaN rows past the table.
    fix = ("--config.tag_head=transformers (segment 0)" if task.kind == tasks_lib.TAGGING else
           'a single-text task' if task.kind != tasks_lib.SPAN else
           'a network with two segments (SQuAD feeds the context as the second)')
    raise UserError(f'this task feeds segment id {segment} (a second text, or tag_head='
                    f"'official'), but the network has type_vocab_size="
                    f'{model_config.type_vocab_size}; use {fix}')
  workdir = experiment_lib.prepare_workdir(workdir)
  if not resuming:
    progress.clear_unsaved(workdir)
    saved_run.write_network(workdir, source)
    progress.write_init(workdir, c, init_step)
    saved_config.write(workdir, c)  # Last: a config.json means the rest is there.
  model = make_model(task, model_config, c.classifier_pooling, c.head_init, c.span_head,
                     c.tag_head)
  origin = ('random init' if params is None else f'init from {c.init_checkpoint}'
            + (f' (step {init_step})' if init_step is not None else ''))
  eval_rows = ', '.join(f'{_num_rows(e.features)} eval rows'
                        + (f' ({e.prefix.strip("_")})' if e.prefix else '') for e in data.evals)
  print(f'{"Resuming in" if resuming else "Writing to"} {workdir} | task {task.name} '
        f'({task.kind}) | {origin} | {_num_rows(data.train)} train rows, {eval_rows} | '
        f'{c.num_seeds} seed(s) x {c.num_epochs} epoch(s), lr {c.learning_rate:g}, layer decay '
        f'{c.layerwise_lr_decay:g}', flush=True)
  per_epoch = steps_per_epoch(data.train, c.train_batch_size)
  bar = tqdm.tqdm(total=c.num_seeds * c.num_epochs * per_epoch, unit='step', file=sys.stderr,
                  dynamic_ncols=True, disable=not c.progress_bar,
                  mininterval=1.0 if sys.stderr.isatty() else 30.0)
  sample_params = jax.eval_shape(lambda: init_params(model, data.train, jax.random.key(0)))
  trainer = make_trainer(c, task, model, model_config, sample_params,
                         c.num_epochs * per_epoch, mesh)
  runs = []
  stop = stop_request.StopRequest().install()
  try:
    for seed in range(c.seed, c.seed + c.num_seeds):
      seed_dir = paths.join(workdir, f'seed_{seed}')
      run = progress.read_run(seed_dir)
      if run is not None:
        bar.update(c.num_epochs * per_epoch)
      elif stop.signal is None:
        paths.make_dirs(seed_dir)
        run = run_seed(c, data, trainer, params, seed, mesh, seed_dir, bar, stop)
      if run is None:
        bar.close()
        saved = paths.join(seed_dir, progress.RESUME)
        where = (f'its state is saved in {saved}' if paths.exists(saved)
                 else 'before it started')
        print(f'Stopped in seed {seed} (signal {stop.signal}); {where}. Re-run the same '
              'command to resume.', flush=True)
        return dict(status='interrupted', workdir=workdir, seed=seed,
                    seeds_done=[r['seed'] for r in runs])
      runs.append(run)
  finally:
    stop.restore()
  bar.close()
  summary = summarize(task, runs)
  summary.update(task=task.name, label_names=list(task.label_names), workdir=workdir,
                 init_checkpoint=c.init_checkpoint, init_step=init_step,
                 random_init=bool(c.random_init or not c.init_checkpoint),
                 wall_time_sec=round(time.time() - start_time, 2))
  # The training file's text columns (predict reads files by them; saved_run.load).
  results = dict(summary, text_columns=list(task.file_text), runs=runs, config=c.to_dict())
  atomic.write_json(paths.join(workdir, progress.RESULTS), results)
  return summary


def summarize(task, runs: list[dict]) -> dict:
  """Median over seeds of each run's best-epoch and final-epoch eval metrics (a diverged
  seed's NaN counted as its worst: metrics_lib.seed_median)."""
  metric_keys = [k for k in runs[0]['best'] if k.startswith('eval_')]
  summary = dict(main_metric=task.main_metric, num_seeds=len(runs))
  for epoch in ('best', 'final'):
    for key in metric_keys:
      summary[f'median_{epoch}_{key[5:]}'] = metrics_lib.seed_median(
          [r[epoch][key] for r in runs],
          lower_is_better=key.endswith(metrics_lib.LOWER_IS_BETTER))
  summary['best_' + task.main_metric + '_per_seed'] = [
      r['best'][f'eval_{task.main_metric}'] for r in runs]
  return summary
