"""Turns a user's ConfigDict into a fully resolved, validated one.

Size keys left as None take the `model_size` preset; derived keys (max_predictions_per_seq)
are filled; inconsistent values fail here, before any device work, with one line each.
"""
import json
import math

import ml_collections

from electra_jax import objectives
from electra_jax import paths
from electra_jax.errors import UserError

# The paper's architectures (ELECTRA.md) plus a demo size that trains in minutes on a CPU.
MODEL_SIZES = {
    'demo': dict(embedding_size=128, hidden_size=128, num_layers=2, num_heads=2,
                 intermediate_size=512),
    'small': dict(embedding_size=128, hidden_size=256, num_layers=12, num_heads=4,
                  intermediate_size=1024),
    'base': dict(embedding_size=768, hidden_size=768, num_layers=12, num_heads=12,
                 intermediate_size=3072),
    'large': dict(embedding_size=1024, hidden_size=1024, num_layers=24, num_heads=16,
                  intermediate_size=4096),
}

DTYPES = ('float32', 'bfloat16')
ATTENTION_IMPLEMENTATIONS = ('auto', 'xla')
REMAT = ('none', 'save_dots', 'full')

# Generator/discriminator weight sharing (model.py); objectives: the objectives/ registry.
TIES = ('embeddings', 'none', 'all', 'gdes')
# The objectives tie='gdes' is built and tested for (ELECTRA's, as DeBERTa-v3 uses it).
GDES_OBJECTIVES = ('electra', 'electra_15')
# Keys naming files, directories (PATH_KEYS) or comma-separated globs (GLOB_KEYS): resolved
# absolute as found from the cwd (relative where they lie in the repository), so the saved
# config names what the run read, whatever directory a resume or evaluate later starts from.
PATH_KEYS = ('vocab_file', 'train_data_dir', 'tfds_data_dir', 'init_from', 'init_generator_from',
             'extend_vocab_file')
GLOB_KEYS = ('train_files', 'eval_files')
# Keys that must be > 0 whatever reads the config, with a hint for the error line.
POSITIVE_KEYS = (('lr_decay_power', ' (1.0: linear decay)'), ('generator_lr_multiplier', ''),
                 ('initializer_range', ' (BERT: 0.02)'))


def resolve(config: ml_collections.ConfigDict, training: bool = False
            ) -> ml_collections.ConfigDict:
  """Returns a locked copy with presets and derived values filled in, or raises UserError.

  `training`: also refuse what only training reads (the optimizer's numbers, the seed, a
  pairing of tie and objective not built for training): where a run is planned or started
  (init_from.prepare, compare's plans). Loading a finished run's or a released model's config
  (evaluate, export, fine-tuning) leaves it out: what an older version trained still loads."""
  c = ml_collections.ConfigDict(config.to_dict())
  if c.model_size not in MODEL_SIZES:
    raise UserError(f"config.model_size={c.model_size!r} is not one of "
                    f"{sorted(MODEL_SIZES)}; pick one or set the size keys explicitly")
  for key, value in MODEL_SIZES[c.model_size].items():
    if c[key] is None:
      c[key] = value
  # Before the masking budget derived from them (a NaN mask_prob cannot become a count).
  check(c.max_seq_length >= 8, f'config.max_seq_length={c.max_seq_length} must be >= 8')
  check(0 < c.mask_prob < 1, f'config.mask_prob={c.mask_prob} must be in (0, 1)')
  if c.max_predictions_per_seq is None:
    c.max_predictions_per_seq = derived_max_predictions(c)
    check(c.max_predictions_per_seq > 0,
          f'config.mask_prob={c.mask_prob} masks no token of a config.max_seq_length='
          f'{c.max_seq_length} sequence (int((mask_prob + 0.005) * max_seq_length) = 0); raise '
          'mask_prob or set config.max_predictions_per_seq')
  # A smoke run of a long recipe (e.g. small.py for 20 steps) warms up over the whole run
  # (two_stage: over its shorter stage).
  c.num_warmup_steps = min(c.num_warmup_steps, warmup_limit(c))
  paths_as_found(c)
  _validate(c, training)
  c.lock()
  return c


def paths_as_found(c):
  """Makes the PATH_KEYS and GLOB_KEYS of `c` (a ConfigDict or a saved config's dict)
  absolute as found from here, but relative where they lie in the repository (its bundled
  data: the clone may move); a saved config of an older version, which kept them as typed,
  compares equal to today's after this."""
  for key in PATH_KEYS:
    if c.get(key):
      c[key] = paths.in_repository(paths.as_found(c[key]))
  for key in GLOB_KEYS:
    if c.get(key):
      c[key] = ','.join(paths.in_repository(paths.resolve_glob(part))
                        for part in c[key].split(',') if part.strip())


def derived_max_predictions(c) -> int:
  """The masking budget a config (a ConfigDict or a saved config's dict) gets when it leaves
  max_predictions_per_seq unset: the official code's int((mask_prob + 0.005) * length)."""
  return int((c['mask_prob'] + 0.005) * c['max_seq_length'])


def check(condition: bool, message: str):
  """Raises UserError(message) unless condition holds: one line per invalid config value."""
  if not condition:
    raise UserError(message)


def _validate(c, training: bool):
  for key in ('embedding_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
              'vocab_size', 'max_seq_length', 'train_batch_size', 'eval_batch_size',
              'num_train_steps', 'log_every_steps', 'max_predictions_per_seq',
              'keep_checkpoint_max', 'save_checkpoints_steps', 'grad_accum_steps',
              'fsdp_axis_size', 'steps_per_execution'):
    check(c[key] > 0, f'config.{key}={c[key]} must be a positive integer')
  for key in ('num_warmup_steps', 'eval_every_steps', 'num_eval_steps',
              'max_consecutive_nonfinite'):
    check(c[key] >= 0, f'config.{key}={c[key]} must be >= 0')
  check(c.seed >= 0, f'config.seed={c.seed} must be >= 0')
  if training:
    # The data order's shuffle takes 32-bit seeds; jax.random.key(2**32) is key(0).
    check(c.seed < 2**32, f'config.seed={c.seed} must be in [0, 2**32)')
    check(c.type_vocab_size >= 2, f'config.type_vocab_size={c.type_vocab_size} must be >= 2: '
           'pretraining examples hold two segments (token type ids 0 and 1)')
  check(c.hidden_size % c.num_heads == 0,
         f'config.hidden_size={c.hidden_size} is not divisible by config.num_heads='
         f'{c.num_heads}; pick sizes with an integer head width')
  for key in ('generator_hidden_size', 'generator_layers'):
    check(0 < c[key] <= 1, f'config.{key}={c[key]} must be a fraction in (0, 1]')
  check(c.max_seq_length <= c.max_position_embeddings,
         f'config.max_seq_length={c.max_seq_length} exceeds config.max_position_embeddings='
         f'{c.max_position_embeddings}; lower max_seq_length or raise max_position_embeddings')
  check(c.max_predictions_per_seq <= c.max_seq_length,
         f'config.max_predictions_per_seq={c.max_predictions_per_seq} exceeds '
         f'config.max_seq_length={c.max_seq_length}')
  check(c.mask_token_prob >= 0 and c.random_token_prob >= 0
         and c.mask_token_prob + c.random_token_prob <= 1,
         f'config.mask_token_prob={c.mask_token_prob} + config.random_token_prob='
         f'{c.random_token_prob} must be probabilities summing to at most 1')
  check(not (c.whole_word_masking and c.mask_with_replacement),
         'config.whole_word_masking=True chooses distinct words; it cannot draw positions with '
         'replacement: set --config.mask_with_replacement=False')
  check(c.temperature > 0, f'config.temperature={c.temperature} must be > 0')
  check(c.dtype in DTYPES, f'config.dtype={c.dtype!r} must be one of {DTYPES}')
  check(c.remat in REMAT, f'config.remat={c.remat!r} must be one of {REMAT}')
  check(c.attention_implementation in ATTENTION_IMPLEMENTATIONS,
         f'config.attention_implementation={c.attention_implementation!r} must be one of '
         f'{ATTENTION_IMPLEMENTATIONS}')
  for key in ('dropout_rate', 'attention_dropout_rate'):
    check(0 <= c[key] < 1, f'config.{key}={c[key]} must be in [0, 1)')
  check(c.num_data_workers >= 0,
         f'config.num_data_workers={c.num_data_workers} must be >= 0 (0 = no worker processes)')
  check(bool(c.text_key), "config.text_key is empty; set it to the field holding each record's "
         'text in JSON Lines, Parquet or Arrow files or the TFDS dataset (default: text)')
  if c.tfds_name:
    check(bool(c.tfds_split), f'config.tfds_split is empty but config.tfds_name={c.tfds_name!r} '
           'is set; set --config.tfds_split')
  _validate_objective(c, training)
  for key in ('init_generator_from', 'extend_vocab_file'):
    check(not c[key] or bool(c.init_from),
           f'config.{key}={c[key]!r} needs config.init_from (the weights it adds to); set '
           '--config.init_from=PATH')
  for key, hint in POSITIVE_KEYS:
    check(c[key] > 0, f'config.{key}={c[key]} must be > 0{hint}')
  if training:
    _validate_optimization(c)
  check(c.relative_attention_span >= 0,
         f'config.relative_attention_span={c.relative_attention_span} must be >= 0 (0 = off)')
  unknown = [k for k in split_keys(c.allow_config_change) if k not in c]
  check(not unknown, f'config.allow_config_change={c.allow_config_change!r} names unknown '
         f'keys {unknown}; list config keys separated by commas')


def check_optimizer_numbers(c, positive=(), non_negative=()):
  """The optimizer's numbers, for pretraining and fine-tuning: a bad one turns the weights to
  NaN (or stops learning, or quietly stops clipping) only steps later, with nothing naming it.
  `positive`, `non_negative`: further (key, hint) pairs of the loss."""
  for key, hint in (*positive, ('learning_rate', ''), ('adam_epsilon', ' (ELECTRA: 1e-6)')):
    check(math.isfinite(c[key]) and c[key] > 0, f'config.{key}={c[key]} must be > 0{hint}')
  for key, hint in (*non_negative, ('weight_decay_rate', ''),
                    ('max_grad_norm', ' (0: no clipping)')):
    check(math.isfinite(c[key]) and c[key] >= 0, f'config.{key}={c[key]} must be >= 0{hint}')
  for key in ('adam_b1', 'adam_b2'):
    check(0 <= c[key] < 1, f'config.{key}={c[key]} must be in [0, 1)')


def _validate_optimization(c):
  """The optimizer's and the loss's numbers (training only)."""
  check_optimizer_numbers(c, positive=POSITIVE_KEYS,
                          non_negative=(('gen_weight', ''), ('disc_weight', '')))
  check(0 <= c.short_seq_prob <= 1,
         f'config.short_seq_prob={c.short_seq_prob} must be a probability in [0, 1]')
  check(math.isfinite(c.disc_output_bias_init),
         f'config.disc_output_bias_init={c.disc_output_bias_init} must be a finite number')


def _validate_objective(c, training: bool):
  check(c.objective in objectives.OBJECTIVES,
         f'config.objective={c.objective!r} must be one of {tuple(objectives.OBJECTIVES)}')
  check(c.tie in TIES, f'config.tie={c.tie!r} must be one of {TIES}')
  for key in ('generator_hidden_size', 'generator_layers'):
    check(c.tie != 'all' or c[key] == 1.0,
          f"config.tie='all' shares every encoder weight, so config.{key}={c[key]} must be "
          '1.0; set it or pick another tie')
  layout = objectives.get(c.objective).layout_for(c)
  check(c.tie != 'gdes' or ((c.objective in GDES_OBJECTIVES or not training)
                            and layout.generator and not layout.mlm_head),
         f"config.tie='gdes' shares the generator's embeddings with the discriminator of "
         f"objective 'electra' or 'electra_15' with a learned generator, not objective "
         f'{c.objective!r} (uniform_generator={c.uniform_generator}); pick one of them or '
         'another tie')
  # As objective 'mlm' refuses it: without a generator network there is nothing to tie.
  check(not (training and c.uniform_generator and c.tie in ('none', 'all')),
        f'config.tie={c.tie!r} means nothing with config.uniform_generator=True (no generator '
        "network); leave config.tie='embeddings'")
  objectives.get(c.objective).validate(c)


def warmup_limit(c) -> int:
  """The longest warmup `c`'s schedule holds: the run, or its objective's limit."""
  if c.objective not in objectives.OBJECTIVES:  # Refused with its own line by _validate.
    return c.num_train_steps
  return objectives.get(c.objective).warmup_limit(c)


def warmup_note(config) -> str | None:
  """The line that tells a user resolve() shortened the warmup to the run, if it did."""
  limit = warmup_limit(config)
  if config.num_warmup_steps <= limit:
    return None
  if limit < config.num_train_steps:
    return (f'config.num_warmup_steps={config.num_warmup_steps} exceeds a {config.objective} '
            f'stage; warming up over {limit} steps instead (fine for a smoke run; lower the '
            'warmup for a real one)')
  return (f'config.num_warmup_steps={config.num_warmup_steps} exceeds '
          f'config.num_train_steps={config.num_train_steps}; warming up over all '
          f'{config.num_train_steps} steps instead (fine for a smoke run; lower the warmup '
          'for a real one)')


LOOP_INTERVALS = ('log_every_steps', 'eval_every_steps', 'save_checkpoints_steps',
                  'num_train_steps')


def loop_boundaries(config) -> tuple[int, ...]:
  """The intervals the training loop acts at (0: never): a train call ends at each."""
  return tuple(config[key] for key in LOOP_INTERVALS)


def steps_per_execution_note(config) -> str | None:
  """The line that tells a user some train calls run fewer steps than asked, if some do."""
  k = config.steps_per_execution
  off = [f'config.{key}={config[key]}' for key in LOOP_INTERVALS if config[key] % k]
  if not off:
    return None
  return (f'{" and ".join(off)} {"is not a multiple" if len(off) == 1 else "are not multiples"}'
          f' of config.steps_per_execution={k}: calls also end there, so some run fewer steps '
          '(each other length of call is one more compile)')


def split_keys(text: str) -> list[str]:
  """'a, b' -> ['a', 'b'] (for comma-separated config values)."""
  return [part.strip() for part in (text or '').split(',') if part.strip()]


def generator_sizes(c) -> dict:
  """The generator's sizes: hidden, FFN and heads scaled by `generator_hidden_size`, layers by
  `generator_layers` (round(num_layers * fraction), at least 1; the official formula).

  Any fraction in (0, 1] works: the head count is the scaled one, lowered to the nearest
  count that divides the generator's width (e.g. 0.7 of H=256 is 179 wide with 1 head).
  """
  frac = c.generator_hidden_size
  hidden = max(1, int(round(c.hidden_size * frac)))
  heads = max(1, int(round(c.num_heads * frac)))
  while hidden % heads:
    heads -= 1
  layers = max(1, int(round(c.num_layers * c.get('generator_layers', 1.0))))
  return dict(hidden_size=hidden, intermediate_size=max(1, int(round(c.intermediate_size * frac))),
              num_heads=heads, num_layers=layers)


def with_generator(keys: dict, sizes: dict, source: str) -> dict:
  """Discriminator shape `keys` plus the generator fractions that give a source's generator
  `sizes` (hidden_size, intermediate_size, num_heads, num_layers); UserError naming `source`
  where ours, the discriminator scaled by one fraction, cannot hold it."""
  keys = dict(keys, generator_hidden_size=sizes['hidden_size'] / keys['hidden_size'],
              generator_layers=sizes['num_layers'] / keys['num_layers'])
  ours = {k: v for k, v in generator_sizes(ml_collections.ConfigDict(keys)).items()
          if k in sizes}
  if ours != sizes:
    raise UserError(f'the generator sizes {sizes} of {source} are not the discriminator sizes '
                    f'scaled by one fraction (that gives {ours}); our generator cannot hold '
                    'them')
  return keys


def to_json(c: ml_collections.ConfigDict) -> str:
  return json.dumps(c.to_dict(), indent=2, sort_keys=True)
