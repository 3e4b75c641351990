"""Where fine-tuning starts: a pretraining workdir, a transformers ELECTRA directory, or the same
architecture from random weights. Only embeddings + discriminator encoder are kept."""
import dataclasses
import json
import os

import jax
import ml_collections
import numpy as np

from configs import base_config
from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax.errors import UserError

_HF_WEIGHTS = ('model.safetensors', 'pytorch_model.bin')


def is_hf_dir(path: str) -> bool:
  """A transformers ELECTRA directory: config.json with model_type 'electra' plus weights."""
  config_file = os.path.join(path, 'config.json')
  if not os.path.isfile(config_file):
    return False
  with open(config_file, encoding='utf-8') as f:
    try:
      model_type = json.load(f).get('model_type')
    except (json.JSONDecodeError, AttributeError):
      return False
  return model_type == 'electra' and any(os.path.isfile(os.path.join(path, w))
                                         for w in _HF_WEIGHTS)


def pretraining_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved pretraining config saved in WORKDIR/config.json (current defaults underneath,
  so a workdir written before a key existed still loads)."""
  path = os.path.join(workdir, 'config.json')
  if not os.path.isfile(path):
    raise UserError(f"config.init_checkpoint='{workdir}' has no config.json; pass a pretraining "
                    '--workdir (python -m electra_jax.train) or a transformers ELECTRA directory')
  with open(path, encoding='utf-8') as f:
    saved = json.load(f)
  c = base_config.get_config()
  c.update({k: v for k, v in saved.items() if k in c})
  return config_lib.resolve(c)


def model_config_for_size(model_size: str, vocab_size: int) -> model_lib.ModelConfig:
  """The architecture of a `model_size` preset (for random_init without init_checkpoint)."""
  c = base_config.get_config()
  c.model_size, c.vocab_size = model_size, vocab_size
  return model_lib.ModelConfig.from_config(config_lib.resolve(c))


def _keep_discriminator(params) -> dict:
  """Embeddings + discriminator encoder; the generator and the RTD head are dropped."""
  return {'embeddings': params['embeddings'],
          'discriminator': {'encoder': params['discriminator']['encoder']}}


def load_pretrained(init_checkpoint: str) -> tuple[dict, model_lib.ModelConfig]:
  """(params {'embeddings', 'discriminator': {'encoder'}} as numpy, ModelConfig) from a
  pretraining workdir (latest checkpoint) or a transformers ELECTRA directory."""
  path = os.path.abspath(os.path.expanduser(init_checkpoint))
  if not os.path.isdir(path):
    raise UserError(f"config.init_checkpoint='{init_checkpoint}' is not a directory; pass a "
                    'pretraining workdir or a transformers ELECTRA directory')
  if is_hf_dir(path):
    from electra_jax import export  # pylint: disable=import-outside-toplevel
    c, params = export.load_hf_discriminator(path, with_head=False)
    return _keep_discriminator(params), model_lib.ModelConfig.from_config(c)
  c = pretraining_config(path)
  ckpt, step = checkpoint.open_for_reading(path)
  ckpt.close()
  state = checkpoint.restore_on_one_device(os.path.join(ckpt.directory, str(step), 'state'))
  params = jax.tree.map(np.asarray, _keep_discriminator(state['params']))
  return params, model_lib.ModelConfig.from_config(c)


def with_dropout(model_config: model_lib.ModelConfig, c) -> model_lib.ModelConfig:
  """The pretrained shape with the fine-tuning run's dropout and dtype."""
  return dataclasses.replace(model_config, dropout_rate=c.dropout_rate,
                             attention_dropout_rate=c.attention_dropout_rate,
                             dtype=jax.numpy.dtype(c.dtype))
