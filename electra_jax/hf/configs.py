"""HF ElectraConfig fields <-> our config keys."""
import ml_collections
import numpy as np

from configs import base_config
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError
from electra_jax.hf import weights

ARCHITECTURES = {'discriminator': 'ElectraForPreTraining', 'generator': 'ElectraForMaskedLM'}


def hf_config_dict(config, network: str = 'discriminator',
                   pad_token_id: int = tokenizer_lib.PAD_ID) -> dict:
  """ElectraConfig fields for one of our networks (what goes in the export's config.json);
  pad_token_id: the vocabulary's [PAD] (a WordPiece vocab.txt may hold it anywhere)."""
  weights.check_network(network)
  cfg = weights.model_config(config)
  gen = network == 'generator'
  return dict(
      architectures=[ARCHITECTURES[network]], model_type='electra',
      vocab_size=cfg.vocab_size, embedding_size=cfg.embedding_size,
      hidden_size=cfg.generator_hidden_size if gen else cfg.hidden_size,
      num_hidden_layers=cfg.generator_num_layers if gen else cfg.num_layers,
      num_attention_heads=cfg.generator_num_heads if gen else cfg.num_heads,
      intermediate_size=cfg.generator_intermediate_size if gen else cfg.intermediate_size,
      hidden_act='gelu', hidden_dropout_prob=cfg.dropout_rate,
      attention_probs_dropout_prob=cfg.attention_dropout_rate,
      max_position_embeddings=cfg.max_position_embeddings,
      type_vocab_size=cfg.type_vocab_size, layer_norm_eps=model_lib.LAYER_NORM_EPS,
      initializer_range=cfg.initializer_range, position_embedding_type='absolute',
      pad_token_id=pad_token_id, tie_word_embeddings=True)


def is_generator(hf: dict, where: str = 'the HF config') -> bool:
  """Whether a config names ElectraForMaskedLM; "architectures": null (transformers' default,
  as a config saved on its own writes it) names none."""
  architectures = hf.get('architectures') or []
  if not isinstance(architectures, list):
    raise UserError(f'{where} has architectures={architectures!r}, not a list of class names '
                    '(e.g. ["ElectraForPreTraining"]); repair it or save the model again')
  return ARCHITECTURES['generator'] in architectures


def check_hf_config(hf: dict, where: str):
  """Refuses HF configs our model cannot reproduce exactly."""
  if hf.get('model_type', 'electra') != 'electra':
    raise UserError(f"{where} has model_type={hf.get('model_type')!r}; pass an ELECTRA "
                    'checkpoint directory')
  if hf.get('hidden_act', 'gelu') != 'gelu':
    raise UserError(f"{where} uses hidden_act={hf.get('hidden_act')!r}; our model has exact "
                    "GELU only ('gelu')")
  if hf.get('position_embedding_type', 'absolute') != 'absolute':
    raise UserError(f"{where} uses position_embedding_type="
                    f"{hf.get('position_embedding_type')!r}; only 'absolute' converts")
  for key in ('layer_norm_eps', 'hidden_dropout_prob', 'attention_probs_dropout_prob'):
    value = hf.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise UserError(f'{where} has {key}={value!r}, not a number; repair it or save the '
                      'model again')
  for key in HF_SIZE_DEFAULTS:
    value = hf.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
      raise UserError(f'{where} has {key}={value!r}, not a whole number; repair it or save the '
                      'model again')
  eps = hf.get('layer_norm_eps', model_lib.LAYER_NORM_EPS)
  if not np.isclose(eps, model_lib.LAYER_NORM_EPS, rtol=1e-3, atol=0):
    raise UserError(f'{where} has layer_norm_eps={eps}; our model uses '
                    f'{model_lib.LAYER_NORM_EPS}')


# transformers.ElectraConfig's defaults: what it builds where a config.json leaves a size out.
HF_SIZE_DEFAULTS = dict(vocab_size=30522, embedding_size=128, hidden_size=256,
                        num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024,
                        max_position_embeddings=512, type_vocab_size=2)


def _with_size_defaults(hf: dict) -> dict:
  return {**HF_SIZE_DEFAULTS, **hf}


def shape_keys(hf: dict, hf_generator: dict | None = None) -> dict:
  """Our shape keys (sizes, vocabulary, positions; the generator's width when its config is
  given) for an HF discriminator config and optionally its generator's (a size left out: what
  transformers builds, HF_SIZE_DEFAULTS)."""
  check_hf_config(hf, 'the HF config')
  hf = _with_size_defaults(hf)
  keys = dict(embedding_size=hf['embedding_size'],
              hidden_size=hf['hidden_size'], num_layers=hf['num_hidden_layers'],
              num_heads=hf['num_attention_heads'], intermediate_size=hf['intermediate_size'],
              vocab_size=hf['vocab_size'],
              max_position_embeddings=hf['max_position_embeddings'],
              type_vocab_size=hf['type_vocab_size'],
              # transformers' ELECTRA has absolute positions only.
              relative_attention_span=0)
  if hf_generator is None:
    return keys
  check_hf_config(hf_generator, 'the HF generator config')
  hf_generator = _with_size_defaults(hf_generator)
  for key in ('vocab_size', 'embedding_size', 'max_position_embeddings', 'type_vocab_size'):
    if hf_generator.get(key) != hf.get(key):
      raise UserError(f'the generator has {key}={hf_generator.get(key)} but the '
                      f'discriminator {hf.get(key)}; our generator shares these with it')
  if hf_generator['num_hidden_layers'] > hf['num_hidden_layers']:
    raise UserError(f"the generator has {hf_generator['num_hidden_layers']} layers, more than "
                    f"the discriminator's {hf['num_hidden_layers']}; our generator is at most "
                    'as deep (config.generator_layers <= 1)')
  # A shallower generator (official generator_layers < 1) as the fraction that gives its depth.
  return config_lib.with_generator(keys, dict(
      hidden_size=hf_generator['hidden_size'], intermediate_size=hf_generator['intermediate_size'],
      num_heads=hf_generator['num_attention_heads'],
      num_layers=hf_generator['num_hidden_layers']), 'the HF generator')


def preset_name(keys: dict) -> str | None:
  """The model_size preset whose sizes these are, if any."""
  sizes = {k: keys[k] for k in config_lib.MODEL_SIZES['base']}
  return next((name for name, values in config_lib.MODEL_SIZES.items() if values == sizes), None)


def config_from_hf(hf: dict, vocab_file: str | None = None) -> ml_collections.ConfigDict:
  """A resolved config (configs/base_config.py + the HF shapes and dropout) for reading an HF
  discriminator, e.g. to fine-tune it. The generator width stays a valid fraction (0.25 if the
  heads allow it)."""
  c = base_config.get_config()
  c.update(shape_keys(hf))
  c.model_size = preset_name(c) or c.model_size
  c.max_seq_length = min(c.max_seq_length, c.max_position_embeddings)
  c.dropout_rate = float(hf.get('hidden_dropout_prob', 0.1))
  c.attention_dropout_rate = float(hf.get('attention_probs_dropout_prob', 0.1))
  if vocab_file is not None:
    c.vocab_file = vocab_file
  last_error = None
  for fraction in (0.25, 1 / 3, 0.5, 1.0):
    c.generator_hidden_size = fraction
    try:
      return config_lib.resolve(c)
    except UserError as e:
      last_error = e
  raise last_error
