"""Fills the fine-tuning config's None keys with the paper's values and validates it.

Learning rate and layer-wise decay follow the model size (ELECTRA.md: 3e-4 Small, 1e-4 Base,
5e-5 Large; decay 0.8 Small/Base, 0.9 Large), epochs follow the task.
"""
import math

import ml_collections

from electra_jax import config as config_lib
from electra_jax import paths
from electra_jax.finetune import heads
from electra_jax.finetune import tasks as tasks_lib

LEARNING_RATES = {'demo': 1e-3, 'small': 3e-4, 'base': 1e-4, 'large': 5e-5}
LAYERWISE_DECAY = {'demo': 0.8, 'small': 0.8, 'base': 0.8, 'large': 0.9}
# Keys naming files or directories: saved absolute, so the saved config names what was read.
PATH_KEYS = ('train_file', 'eval_file', 'init_checkpoint', 'vocab_file', 'tfds_data_dir')


def size_name(hidden_size: int) -> str:
  """The preset whose width is nearest: picks the paper's fine-tuning LR for custom shapes."""
  return min(config_lib.MODEL_SIZES,
             key=lambda s: abs(config_lib.MODEL_SIZES[s]['hidden_size'] - hidden_size))


def resolve(config, task, hidden_size: int) -> ml_collections.ConfigDict:
  """A locked copy with learning_rate, layerwise_lr_decay, num_epochs and doc_stride filled
  in."""
  c = ml_collections.ConfigDict(config.to_dict())
  size = size_name(hidden_size)
  if c.learning_rate is None:
    c.learning_rate = LEARNING_RATES[size]
  if c.layerwise_lr_decay is None:
    c.layerwise_lr_decay = LAYERWISE_DECAY[size]
  if c.num_epochs is None:
    c.num_epochs = task.num_epochs
  if c.doc_stride is None:
    c.doc_stride = (c.max_seq_length - 2) // 2 if task.kind == tasks_lib.TAGGING else 128
  for key in PATH_KEYS:  # As found from here: a resumed run elsewhere must name the same.
    if c[key]:
      c[key] = paths.as_found(c[key])
  validate(c, task)
  c.lock()
  return c


def validate(c, task):
  for key in ('max_seq_length', 'train_batch_size', 'eval_batch_size', 'num_seeds', 'doc_stride',
              'max_query_length', 'max_answer_length', 'beam_size', 'num_epochs',
              'grad_accum_steps'):
    config_lib.check(c[key] is not None and c[key] > 0,
                     f'config.{key}={c[key]} must be a positive integer')
  for key in ('max_train_examples', 'max_eval_examples', 'seed', 'save_checkpoints_steps'):
    config_lib.check(c[key] >= 0, f'config.{key}={c[key]} must be >= 0')
  # Seeds seed .. seed + num_seeds - 1: jax.random.key(2**32) is key(0), as pretraining says.
  config_lib.check(c.seed + c.num_seeds <= 2**32,
                   f'config.seed={c.seed} with num_seeds={c.num_seeds} runs seeds past 2**32 - 1 '
                   '(jax.random.key(2**32) is key(0)); lower config.seed')
  config_lib.check(c.classifier_pooling in heads.POOLINGS,
                   f'config.classifier_pooling={c.classifier_pooling!r} is not one of '
                   f"{', '.join(heads.POOLINGS)}")
  config_lib.check(c.head_init in heads.HEAD_INITS,
                   f'config.head_init={c.head_init!r} is not one of {", ".join(heads.HEAD_INITS)}')
  config_lib.check(c.tag_encoding in tasks_lib.TAG_ENCODINGS,
                   f'config.tag_encoding={c.tag_encoding!r} is not one of '
                   f'{", ".join(tasks_lib.TAG_ENCODINGS)}')
  config_lib.check(c.tag_head in heads.TAG_HEADS,
                   f'config.tag_head={c.tag_head!r} is not one of {", ".join(heads.TAG_HEADS)}')
  config_lib.check(c.span_head in heads.SPAN_HEADS,
                   f'config.span_head={c.span_head!r} is not one of {", ".join(heads.SPAN_HEADS)}')
  config_lib.check_optimizer_numbers(c, non_negative=(('answerable_weight', ''),))
  config_lib.check(0 < c.layerwise_lr_decay <= 1,
                   f'config.layerwise_lr_decay={c.layerwise_lr_decay} must be in (0, 1] '
                   '(1 disables it)')
  config_lib.check(c.loss_reduction in ('mean', 'sum'),
                   f"config.loss_reduction={c.loss_reduction!r} must be 'mean' or 'sum'")
  config_lib.check(math.isfinite(c.lr_decay_power) and c.lr_decay_power > 0,
                   f'config.lr_decay_power={c.lr_decay_power} must be > 0 (1.0: linear decay)')
  config_lib.check(0 <= c.warmup_fraction < 1,
                   f'config.warmup_fraction={c.warmup_fraction} must be in [0, 1)')
  for key in ('dropout_rate', 'attention_dropout_rate'):
    config_lib.check(0 <= c[key] < 1, f'config.{key}={c[key]} must be in [0, 1)')
  config_lib.check(c.remat in ('',) + config_lib.REMAT,
                   f"config.remat={c.remat!r} must be '' (the pretraining config's) or one of "
                   f'{", ".join(config_lib.REMAT)}')
  config_lib.check(c.dtype in config_lib.DTYPES, f'config.dtype={c.dtype!r} must be one of '
                   f'{config_lib.DTYPES}')
  config_lib.check(c.label_type in ('auto', 'class', 'regression'),
                   f"config.label_type={c.label_type!r} must be 'auto', 'class' or 'regression'")
  columns = tasks_lib.file_columns(c)
  config_lib.check(len(columns.text) <= 2 and len(set(columns.text)) == len(columns.text),
                   f'config.text_columns={c.text_columns!r} must name one column, or two '
                   'different ones for a pair (first,second)')
  config_lib.check(columns.label not in columns.text,
                   f'config.text_columns={c.text_columns!r} names the label column '
                   f'{columns.label!r} (config.label_column); pick the text columns')
  # A TFDS tagging task reads no files; tagging.py's default files would otherwise be ignored.
  given = [f'{key}={c[key]!r}' for key in ('train_file', 'eval_file') if c[key]]
  config_lib.check(not (task.kind == tasks_lib.TAGGING and task.tfds_name and given),
                   f'config.task={task.name} reads TFDS\'s {task.tfds_name}, not files '
                   f'(config.{", config.".join(given)}): use --config=configs/finetune/'
                   'conll2003.py, or --config.task=tagging for your own CoNLL-format files')
  config_lib.check(c.model_size in config_lib.MODEL_SIZES,
                   f'config.model_size={c.model_size!r} must be one of '
                   f'{sorted(config_lib.MODEL_SIZES)}')
  config_lib.check(8 <= c.max_seq_length <= 512,
                   f'config.max_seq_length={c.max_seq_length} must be in [8, 512]')
  # A window is [CLS] question [SEP] context [SEP]; BERT's run_squad refuses one without context.
  config_lib.check(task.kind != tasks_lib.SPAN or c.max_seq_length > c.max_query_length + 3,
                   f'config.max_seq_length={c.max_seq_length} leaves no room for context after '
                   f'config.max_query_length={c.max_query_length} question tokens; set '
                   'max_seq_length above max_query_length + 3 (or lower max_query_length)')
