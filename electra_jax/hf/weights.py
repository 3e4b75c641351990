"""Our parameter tree <-> HF ELECTRA state-dict names, both ways.

One name table per network (`name_table`) is read in both directions, so the round trip
HF -> ours -> HF is exact. Our parameters keep their names; HF's generator carries its own copy
of the shared embeddings, so export writes the shared arrays into both models.
"""
import functools

import jax
import numpy as np

from electra_jax import model as model_lib
from electra_jax.errors import UserError

NETWORKS = ('discriminator', 'generator')
# HF state-dict entries that carry nothing of their own: buffers and the tied output matrix.
_IGNORED_HF_KEYS = ('electra.embeddings.position_ids', 'electra.embeddings.token_type_ids',
                    'generator_lm_head.weight')


def model_config(config) -> model_lib.ModelConfig:
  """A resolved ConfigDict or a ModelConfig, as a ModelConfig."""
  if isinstance(config, model_lib.ModelConfig):
    return config
  return model_lib.ModelConfig.from_config(config)


def check_network(network: str):
  if network not in NETWORKS:
    raise ValueError(f'network={network!r} must be one of {NETWORKS}')


def _dense(ours: tuple, hf: str) -> list:
  # flax kernels are [in, out], torch Linear weights [out, in].
  return [(ours + ('kernel',), f'{hf}.weight', True), (ours + ('bias',), f'{hf}.bias', False)]


def _layer_norm(ours: tuple, hf: str) -> list:
  return [(ours + ('scale',), f'{hf}.weight', False), (ours + ('bias',), f'{hf}.bias', False)]


def name_table(cfg: model_lib.ModelConfig, network: str, with_head: bool = True) -> list:
  """[(our param path, HF state-dict name, transpose?)] for the shared embeddings + one network."""
  rows = [(('embeddings', name), f'electra.embeddings.{name}.weight', False)
          for name in ('word_embeddings', 'position_embeddings', 'token_type_embeddings')]
  rows += _layer_norm(('embeddings', 'LayerNorm'), 'electra.embeddings.LayerNorm')
  hidden = cfg.hidden_size if network == 'discriminator' else cfg.generator_hidden_size
  encoder = (network, 'encoder')
  if cfg.embedding_size != hidden:
    rows += _dense(encoder + ('embeddings_project',), 'electra.embeddings_project')
  for i in range(cfg.num_layers if network == 'discriminator' else cfg.generator_num_layers):
    ours, hf = encoder + (f'layer_{i}',), f'electra.encoder.layer.{i}'
    for name in ('query', 'key', 'value'):
      rows += _dense(ours + ('attention', name), f'{hf}.attention.self.{name}')
    rows += _dense(ours + ('attention', 'output'), f'{hf}.attention.output.dense')
    rows += _layer_norm(ours + ('attention_LayerNorm',), f'{hf}.attention.output.LayerNorm')
    rows += _dense(ours + ('intermediate',), f'{hf}.intermediate.dense')
    rows += _dense(ours + ('output',), f'{hf}.output.dense')
    rows += _layer_norm(ours + ('output_LayerNorm',), f'{hf}.output.LayerNorm')
  if not with_head:
    return rows
  if network == 'discriminator':
    rows += _dense(('discriminator', 'head', 'dense'), 'discriminator_predictions.dense')
    rows += _dense(('discriminator', 'head', 'dense_prediction'),
                   'discriminator_predictions.dense_prediction')
  else:
    rows += _dense(('generator', 'head', 'dense'), 'generator_predictions.dense')
    rows += _layer_norm(('generator', 'head', 'LayerNorm'), 'generator_predictions.LayerNorm')
    rows.append((('generator', 'output_bias'), 'generator_lm_head.bias', False))
  return rows


def _get(tree, path: tuple):
  for key in path:
    tree = tree[key]
  return tree


def params_to_hf(params, config, network: str = 'discriminator',
                 with_head: bool = True) -> dict[str, np.ndarray]:
  """Our params -> the HF state dict of ElectraForPreTraining ('discriminator') or
  ElectraForMaskedLM ('generator'), as float32 numpy arrays.

  `params` needs 'embeddings' and the chosen network; `config` is a resolved ConfigDict or a
  model.ModelConfig. The generator's tied `generator_lm_head.weight` is left out, as
  save_pretrained does; transformers ties it to the word embeddings on load. with_head=False
  leaves out the pretraining head (a fine-tuned encoder has none).
  """
  check_network(network)
  if network == 'discriminator':
    params = model_lib.discriminator_view(params)
  state = {}
  for path, name, transpose in name_table(model_config(config), network, with_head):
    value = np.asarray(jax.device_get(_get(params, path)), dtype=np.float32)
    state[name] = np.ascontiguousarray(value.T if transpose else value)
  return state


def _with_electra_prefix(state_dict: dict) -> dict:
  """A bare ElectraModel's keys ('embeddings.…', 'encoder.…') under the 'electra.' prefix."""
  if any(k.startswith('electra.') for k in state_dict):
    return state_dict
  return {f'electra.{k}': v for k, v in state_dict.items()}


# The pretraining head's HF names, by network.
HEAD_PREFIXES = {'discriminator': ('discriminator_predictions.',),
                 'generator': ('generator_predictions.', 'generator_lm_head.')}


def hf_to_params(state_dict: dict, config, network: str = 'discriminator',
                 with_head: bool = True) -> dict:
  """An HF ELECTRA state dict -> {'embeddings': ..., network: ...} in our naming (numpy).

  The inverse of params_to_hf: exact, every array copied or transposed. Keys of a bare
  ElectraModel (no 'electra.' prefix) are accepted; with_head=False skips the pretraining head
  (what fine-tuning needs). Keys outside the converted parts (e.g. a classifier) are ignored;
  a missing or wrongly shaped tensor, or an untied generator output matrix, is a UserError.
  """
  check_network(network)
  state_dict = _with_electra_prefix(state_dict)
  table = name_table(model_config(config), network, with_head)
  missing = [name for _, name, _ in table if name not in state_dict]
  if missing and all(name.startswith(HEAD_PREFIXES[network]) for name in missing):
    raise UserError(f'the HF checkpoint has no {network} pretraining head '
                    f"({HEAD_PREFIXES[network][0]}*: a bare ElectraModel or a fine-tuned "
                    'model); start from its ElectraForPreTraining / ElectraForMaskedLM '
                    'checkpoint, or fine-tune this one (finetune --config.init_checkpoint)')
  if missing:
    raise UserError(f'the HF checkpoint lacks {len(missing)} tensor(s) the {network} needs, '
                    f'e.g. {missing[:3]}; check its config.json matches its weights')
  known = {name for _, name, _ in table}
  own_prefixes = ('electra.',) + HEAD_PREFIXES[network]
  if not with_head:
    own_prefixes = ('electra.',)
  unexpected = sorted(k for k in state_dict if k not in known and k not in _IGNORED_HF_KEYS
                      and k.startswith(own_prefixes))
  if unexpected:
    raise UserError(f'the HF checkpoint has {len(unexpected)} tensor(s) this {network} '
                    f'config does not, e.g. {unexpected[:3]}; check its config.json')
  params = {}
  expected = param_shapes(model_config(config))
  for path, name, transpose in table:
    value = np.asarray(state_dict[name], dtype=np.float32)
    value = np.ascontiguousarray(value.T if transpose else value)
    want = tuple(_get(expected, path).shape)
    if tuple(value.shape) != want:
      raise UserError(f'HF tensor {name} has shape {tuple(value.shape)}, expected {want} for '
                      'this config')
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  lm_head = state_dict.get('generator_lm_head.weight')
  if network == 'generator' and with_head and lm_head is not None and not np.array_equal(
      np.asarray(lm_head, np.float32), params['embeddings']['word_embeddings']):
    raise UserError('the HF generator_lm_head.weight differs from the word embeddings; our '
                    'generator ties its output layer to the embeddings and cannot hold it')
  return params


@functools.lru_cache(maxsize=8)
def param_shapes(cfg: model_lib.ModelConfig):
  """Our params' shapes for a model config, without allocating them."""
  return jax.eval_shape(lambda r: model_lib.init_params(model_lib.Electra(cfg), r, 8, 1),
                        jax.random.key(0))
