"""Where fine-tuning starts: a pretraining workdir, a transformers ELECTRA directory, an official
(TF1) checkpoint, or the same architecture from random weights. Only embeddings +
discriminator encoder are kept."""
import dataclasses

import jax
import ml_collections

from configs import base_config
from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import official_checkpoint
from electra_jax import paths
from electra_jax import saved_config
from electra_jax import tf_checkpoint
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError
from electra_jax.hf import configs as hf_configs
from electra_jax.hf import files as hf_files
from electra_jax.hf import tokenizer_files
from electra_jax.hf import weights as hf_weights

DEFAULT_VOCAB = 'data/demo_spm.model'


def _official(path: str) -> official_checkpoint.Checkpoint | None:
  """The official (TF1) checkpoint `path` names, if it names one and is no workdir."""
  if hf_files.is_hf_dir(path) or saved_config.exists(path):
    return None
  prefix = tf_checkpoint.find_prefix(path)
  return None if prefix is None else official_checkpoint.Checkpoint(prefix)


def _official_config(official: official_checkpoint.Checkpoint) -> ml_collections.ConfigDict:
  c = base_config.get_config()
  c.update(official.keys())
  c.model_size = hf_configs.preset_name(c) or c.model_size
  c.max_seq_length = min(c.max_seq_length, c.max_position_embeddings)
  c.vocab_file = official.vocab_file() or ''
  return config_lib.resolve(c)


def _directory(init_checkpoint: str) -> str:
  path = paths.absolute(init_checkpoint)
  if not paths.is_dir(path):
    raise UserError(f"config.init_checkpoint='{init_checkpoint}' is not a directory; pass a "
                    'pretraining workdir, a transformers ELECTRA directory or an official '
                    'checkpoint (its directory or PREFIX)')
  step = saved_config.run_step(path)
  if step:  # train's init_from takes one.
    raise UserError(f"config.init_checkpoint='{init_checkpoint}' is a checkpoint step; pass "
                    f'its run and the step: --config.init_checkpoint={step[0]} '
                    f'--config.init_step={step[1]}')
  return path


def pretraining_config(init_checkpoint: str) -> ml_collections.ConfigDict:
  """The resolved pretraining config of a workdir (its config.json), of a transformers
  directory (sizes from its config.json; vocab_file its spm.model, vocab.txt or tokenizer.json's
  WordPiece vocabulary as a vocab.txt, '' if it has none; do_lower_case from its tokenizer
  files) or of an official checkpoint (sizes from
  its shapes, the official hidden_size // 64 heads; vocab_file as official_checkpoint finds it)."""
  official = _official(paths.absolute(init_checkpoint))
  if official is not None:
    return _official_config(official)
  path = _directory(init_checkpoint)
  if not hf_files.is_hf_dir(path):
    return saved_config.load(path)
  vocab = tokenizer_files.read_vocabulary(path)
  c = ml_collections.ConfigDict(
      hf_configs.config_from_hf(hf_files.read_config(path)).to_dict())
  c.vocab_file, c.do_lower_case = vocab.readable_file() or '', vocab.do_lower_case
  return c


def config_for_size(model_size: str, vocab_size: int) -> ml_collections.ConfigDict:
  """The resolved pretraining config of a `model_size` preset (for random_init without
  init_checkpoint)."""
  c = base_config.get_config()
  c.model_size, c.vocab_size = model_size, vocab_size
  return config_lib.resolve(c)


def _keep_discriminator(params) -> dict:
  """Embeddings + discriminator encoder; the generator and the pretraining heads are dropped."""
  params = model_lib.discriminator_view(params)
  return {'embeddings': params['embeddings'],
          'discriminator': {'encoder': params['discriminator']['encoder']}}


def load_pretrained(init_checkpoint: str,
                    step: int | None = None) -> tuple[dict, model_lib.ModelConfig]:
  """(params {'embeddings', 'discriminator': {'encoder'}} as numpy, ModelConfig) from a
  pretraining workdir (its checkpoint `step`, None: the latest) or a transformers ELECTRA
  directory."""
  official = _official(paths.absolute(init_checkpoint))
  if official is not None:  # Its index read once, for the shapes and the weights.
    c = _official_config(official)
    params = hf_weights.hf_to_params(official.hf_state('discriminator'), c, 'discriminator',
                                     with_head=False)
    return _keep_discriminator(params), model_lib.ModelConfig.from_config(c)
  c = pretraining_config(init_checkpoint)
  path = _directory(init_checkpoint)
  if hf_files.is_hf_dir(path):
    _, state = hf_files.read_dir(path)
    params = hf_weights.hf_to_params(state, c, 'discriminator', with_head=False)
  else:
    params, _ = checkpoint.read_params(path, step)
  return _keep_discriminator(params), model_lib.ModelConfig.from_config(c)


def with_run_settings(model_config: model_lib.ModelConfig, c) -> model_lib.ModelConfig:
  """The pretrained shape with the fine-tuning run's dropout, dtype and remat ('' keeps the
  network's)."""
  return dataclasses.replace(model_config, dropout_rate=c.dropout_rate,
                             attention_dropout_rate=c.attention_dropout_rate,
                             dtype=jax.numpy.dtype(c.dtype),
                             remat=c.remat or model_config.remat)


def network_config(c) -> tuple[ml_collections.ConfigDict, object]:
  """(the pretraining-form config of the network to fine-tune, its tokenizer) from
  init_checkpoint / model_size; the config's vocab_file and do_lower_case are the tokenizer's."""
  if c.init_checkpoint:
    source = pretraining_config(c.init_checkpoint)
    vocab_file = c.vocab_file or source.vocab_file
    if not vocab_file:
      raise UserError(f"config.init_checkpoint='{c.init_checkpoint}' carries no vocabulary "
                      '(spm.model, vocab.txt or a WordPiece tokenizer.json); pass the one it '
                      'was trained with as --config.vocab_file=FILE')
    tokenizer = tokenizer_lib.load_tokenizer(vocab_file, source.vocab_size, source.do_lower_case)
  elif c.random_init:
    vocab_file = c.vocab_file or DEFAULT_VOCAB
    tokenizer = tokenizer_lib.load_tokenizer(vocab_file)
    source = config_for_size(c.model_size, tokenizer.vocab_size)
  else:
    raise UserError('set --config.init_checkpoint=WORKDIR (a pretraining workdir) or '
                    '--config.random_init=true (random weights of config.model_size)')
  source = ml_collections.ConfigDict(source.to_dict())
  source.vocab_file = paths.resolve(vocab_file)
  return source, tokenizer


def fine_tuned_config(source, c) -> model_lib.ModelConfig:
  """The network's shape with the fine-tuning run's dropout and dtype, checked against
  max_seq_length."""
  model_config = with_run_settings(model_lib.ModelConfig.from_config(source), c)
  if c.max_seq_length > model_config.max_position_embeddings:
    raise UserError(f'config.max_seq_length={c.max_seq_length} exceeds the model\'s '
                    f'{model_config.max_position_embeddings} positions; lower it')
  return model_config
