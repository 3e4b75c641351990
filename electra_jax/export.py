"""Convert between our checkpoints and HF transformers ELECTRA directories, both ways.

  python -m electra_jax.export --workdir=WORKDIR --output=DIR [--what=discriminator|generator|both]
  python -m electra_jax.export --from_hf=HF_DIR [--from_hf_generator=HF_GEN_DIR] --output=WORKDIR

Export writes what `transformers.ElectraForPreTraining.from_pretrained(DIR)` (and
`ElectraForMaskedLM` for the generator) loads: config.json, model.safetensors and tokenizer
files that `AutoTokenizer.from_pretrained(DIR)` reads offline. Import turns a transformers
ELECTRA checkpoint (e.g. google/electra-base-discriminator on disk) into a workdir with a step-0
Orbax checkpoint that evaluate and fine-tuning restore.

The conversion is one name table per network (`_name_table`) read in both directions, so the
round trip HF -> ours -> HF is exact. Our parameters keep their names; HF's generator carries
its own copy of the shared embeddings, so export writes the shared arrays into both models.
"""
import functools
import json
import os
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags

from configs import base_config
from electra_jax import checkpoint
from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import experiment as experiment_lib
from electra_jax import model as model_lib
from electra_jax import optim
from electra_jax import parallel
from electra_jax import train_state as ts
from electra_jax.data import paths
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError

NETWORKS = ('discriminator', 'generator')
# The sentencepiece model travels with an export under this name, so --from_hf finds it again.
SPM_FILE = 'spm.model'
WORDPIECE_FILE = 'vocab.txt'
# Objectives whose 'discriminator' is an ELECTRA replaced-token detector (model.LAYOUTS).
EXPORTABLE_OBJECTIVES = ('electra', 'electra_15', 'two_stage')
HF_ARCHITECTURES = {'discriminator': 'ElectraForPreTraining', 'generator': 'ElectraForMaskedLM'}
# HF state-dict entries that carry nothing of their own: buffers and the tied output matrix.
_IGNORED_HF_KEYS = ('electra.embeddings.position_ids', 'electra.embeddings.token_type_ids',
                    'generator_lm_head.weight')
_HF_EXTRA_HINT = "install the transformers extra: pip install -e '.[hf]'"


# --- Parameter names ------------------------------------------------------------------------

def _model_config(config) -> model_lib.ModelConfig:
  if isinstance(config, model_lib.ModelConfig):
    return config
  return model_lib.ModelConfig.from_config(config)


def _dense(ours: tuple, hf: str) -> list:
  # flax kernels are [in, out], torch Linear weights [out, in].
  return [(ours + ('kernel',), f'{hf}.weight', True), (ours + ('bias',), f'{hf}.bias', False)]


def _layer_norm(ours: tuple, hf: str) -> list:
  return [(ours + ('scale',), f'{hf}.weight', False), (ours + ('bias',), f'{hf}.bias', False)]


def _name_table(cfg: model_lib.ModelConfig, network: str, with_head: bool = True) -> list:
  """[(our param path, HF state-dict name, transpose?)] for the shared embeddings + one network."""
  rows = [(('embeddings', name), f'electra.embeddings.{name}.weight', False)
          for name in ('word_embeddings', 'position_embeddings', 'token_type_embeddings')]
  rows += _layer_norm(('embeddings', 'LayerNorm'), 'electra.embeddings.LayerNorm')
  hidden = cfg.hidden_size if network == 'discriminator' else cfg.generator_hidden_size
  encoder = (network, 'encoder')
  if cfg.embedding_size != hidden:
    rows += _dense(encoder + ('embeddings_project',), 'electra.embeddings_project')
  for i in range(cfg.num_layers):
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


def _check_network(network: str):
  if network not in NETWORKS:
    raise ValueError(f'network={network!r} must be one of {NETWORKS}')


def params_to_hf(params, config, network: str = 'discriminator') -> dict[str, np.ndarray]:
  """Our params -> the HF state dict of ElectraForPreTraining ('discriminator') or
  ElectraForMaskedLM ('generator'), as float32 numpy arrays.

  `params` needs 'embeddings' and the chosen network; `config` is a resolved ConfigDict or a
  model.ModelConfig. The generator's tied `generator_lm_head.weight` is left out, as
  save_pretrained does; transformers ties it to the word embeddings on load.
  """
  _check_network(network)
  state = {}
  for path, name, transpose in _name_table(_model_config(config), network):
    value = params
    for key in path:
      value = value[key]
    value = np.asarray(jax.device_get(value), dtype=np.float32)
    state[name] = np.ascontiguousarray(value.T if transpose else value)
  return state


def _with_electra_prefix(state_dict: dict) -> dict:
  """A bare ElectraModel's keys ('embeddings.…', 'encoder.…') under the 'electra.' prefix."""
  if any(k.startswith('electra.') for k in state_dict):
    return state_dict
  return {f'electra.{k}': v for k, v in state_dict.items()}


def hf_to_params(state_dict: dict, config, network: str = 'discriminator',
                 with_head: bool = True) -> dict:
  """An HF ELECTRA state dict -> {'embeddings': ..., network: ...} in our naming (numpy).

  The inverse of params_to_hf: exact, every array copied or transposed. Keys of a bare
  ElectraModel (no 'electra.' prefix) are accepted; with_head=False skips the pretraining head
  (what fine-tuning needs). Keys outside the converted parts (e.g. a classifier) are ignored;
  a missing or wrongly shaped tensor, or an untied generator output matrix, is a UserError.
  """
  _check_network(network)
  state_dict = _with_electra_prefix(state_dict)
  table = _name_table(_model_config(config), network, with_head)
  missing = [name for _, name, _ in table if name not in state_dict]
  if missing:
    raise UserError(f'the HF checkpoint lacks {len(missing)} tensor(s) the {network} needs, '
                    f'e.g. {missing[:3]}; check its config.json matches its weights')
  known = {name for _, name, _ in table}
  own_prefixes = ('electra.',) + (('discriminator_predictions.',) if network == 'discriminator'
                                  else ('generator_predictions.', 'generator_lm_head.'))
  if not with_head:
    own_prefixes = ('electra.',)
  unexpected = sorted(k for k in state_dict if k not in known and k not in _IGNORED_HF_KEYS
                      and k.startswith(own_prefixes))
  if unexpected:
    raise UserError(f'the HF checkpoint has {len(unexpected)} tensor(s) this {network} '
                    f'config does not, e.g. {unexpected[:3]}; check its config.json')
  params = {}
  for path, name, transpose in table:
    value = np.asarray(state_dict[name], dtype=np.float32)
    value = np.ascontiguousarray(value.T if transpose else value)
    node = params
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  expected = _param_shapes(_model_config(config))
  for path, name, _ in table:
    want = expected
    for key in path:
      want = want[key]
    got = params
    for key in path:
      got = got[key]
    if tuple(got.shape) != tuple(want.shape):
      raise UserError(f'HF tensor {name} has shape {tuple(got.shape)}, expected '
                      f'{tuple(want.shape)} for this config')
  lm_head = state_dict.get('generator_lm_head.weight')
  if network == 'generator' and with_head and lm_head is not None and not np.array_equal(
      np.asarray(lm_head, np.float32), params['embeddings']['word_embeddings']):
    raise UserError('the HF generator_lm_head.weight differs from the word embeddings; our '
                    'generator ties its output layer to the embeddings and cannot hold it')
  return params


@functools.lru_cache(maxsize=8)
def _param_shapes(cfg: model_lib.ModelConfig):
  """Our params' shapes for a model config, without allocating them."""
  return jax.eval_shape(lambda r: model_lib.init_params(model_lib.Electra(cfg), r, 8, 1),
                        jax.random.key(0))


# --- HF config <-> our config ---------------------------------------------------------------

def hf_config_dict(config, network: str = 'discriminator') -> dict:
  """ElectraConfig fields for one of our networks (what goes in the export's config.json)."""
  _check_network(network)
  cfg = _model_config(config)
  gen = network == 'generator'
  return dict(
      architectures=[HF_ARCHITECTURES[network]], model_type='electra',
      vocab_size=cfg.vocab_size, embedding_size=cfg.embedding_size,
      hidden_size=cfg.generator_hidden_size if gen else cfg.hidden_size,
      num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.generator_num_heads if gen else cfg.num_heads,
      intermediate_size=cfg.generator_intermediate_size if gen else cfg.intermediate_size,
      hidden_act='gelu', hidden_dropout_prob=cfg.dropout_rate,
      attention_probs_dropout_prob=cfg.attention_dropout_rate,
      max_position_embeddings=cfg.max_position_embeddings,
      type_vocab_size=cfg.type_vocab_size, layer_norm_eps=model_lib.LAYER_NORM_EPS,
      initializer_range=0.02, position_embedding_type='absolute',
      pad_token_id=tokenizer_lib.PAD_ID, tie_word_embeddings=True)


def _check_hf_config(hf: dict, where: str):
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
  eps = hf.get('layer_norm_eps', model_lib.LAYER_NORM_EPS)
  if not np.isclose(eps, model_lib.LAYER_NORM_EPS, rtol=1e-3, atol=0):
    raise UserError(f'{where} has layer_norm_eps={eps}; our model uses '
                    f'{model_lib.LAYER_NORM_EPS}')


def config_from_hf(hf: dict, hf_generator: dict | None = None,
                   vocab_file: str | None = None) -> ml_collections.ConfigDict:
  """A resolved electra_jax config (configs/base_config.py + HF sizes) for an HF checkpoint.

  Without a generator config the generator width stays a valid fraction (0.25 if the heads
  allow it); with one, the fraction is the generator's width over the discriminator's and every
  generator size must follow from it as in config.generator_sizes.
  """
  _check_hf_config(hf, 'the HF config')
  c = base_config.get_config()
  sizes = dict(embedding_size=hf.get('embedding_size', hf['hidden_size']),
               hidden_size=hf['hidden_size'], num_layers=hf['num_hidden_layers'],
               num_heads=hf['num_attention_heads'], intermediate_size=hf['intermediate_size'])
  c.update(sizes)
  preset = [name for name, values in config_lib.MODEL_SIZES.items() if values == sizes]
  if preset:
    c.model_size = preset[0]
  c.vocab_size = hf['vocab_size']
  c.max_position_embeddings = hf.get('max_position_embeddings', 512)
  c.type_vocab_size = hf.get('type_vocab_size', 2)
  c.max_seq_length = min(c.max_seq_length, c.max_position_embeddings)
  c.dropout_rate = float(hf.get('hidden_dropout_prob', 0.1))
  c.attention_dropout_rate = float(hf.get('attention_probs_dropout_prob', 0.1))
  if vocab_file is not None:
    c.vocab_file = vocab_file
  if hf_generator is not None:
    _check_hf_config(hf_generator, 'the HF generator config')
    for key in ('vocab_size', 'embedding_size', 'num_hidden_layers', 'max_position_embeddings',
                'type_vocab_size'):
      if hf_generator.get(key) != hf.get(key):
        raise UserError(f'the generator has {key}={hf_generator.get(key)} but the '
                        f'discriminator {hf.get(key)}; our generator shares these with it')
    c.generator_hidden_size = hf_generator['hidden_size'] / hf['hidden_size']
    got = config_lib.generator_sizes(c)
    want = dict(hidden_size=hf_generator['hidden_size'],
                intermediate_size=hf_generator['intermediate_size'],
                num_heads=hf_generator['num_attention_heads'])
    if got != want:
      raise UserError(f'the generator sizes {want} are not the discriminator sizes scaled by '
                      f'one fraction (that gives {got}); our generator cannot hold them')
    return config_lib.resolve(c)
  last_error = None
  for fraction in (0.25, 1 / 3, 0.5, 1.0):
    c.generator_hidden_size = fraction
    try:
      return config_lib.resolve(c)
    except UserError as e:
      last_error = e
  raise last_error


# --- Reading and writing HF directories -----------------------------------------------------

def _read_json(path: str) -> dict:
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def load_hf_dir(directory: str) -> tuple[dict, dict[str, np.ndarray]]:
  """(config.json as a dict, float32 numpy state dict) of a transformers checkpoint directory."""
  config_file = os.path.join(directory, 'config.json')
  if not os.path.isfile(config_file):
    raise UserError(f"'{directory}' has no config.json; pass a transformers checkpoint "
                    'directory (config.json + model.safetensors or pytorch_model.bin)')
  hf_config = _read_json(config_file)
  safetensors_file = os.path.join(directory, 'model.safetensors')
  torch_file = os.path.join(directory, 'pytorch_model.bin')
  if os.path.isfile(safetensors_file):
    try:
      from safetensors import safe_open  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise UserError(f'reading {safetensors_file} needs safetensors; {_HF_EXTRA_HINT}') from e
    state = {}
    with safe_open(safetensors_file, framework='numpy') as f:
      for key in f.keys():
        state[key] = np.asarray(f.get_tensor(key), dtype=np.float32)
    return hf_config, state
  if os.path.isfile(torch_file):
    try:
      import torch  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise UserError(f'reading {torch_file} needs torch; {_HF_EXTRA_HINT}') from e
    loaded = torch.load(torch_file, map_location='cpu', weights_only=True)
    return hf_config, {k: v.float().numpy() for k, v in loaded.items()}
  raise UserError(f"'{directory}' has neither model.safetensors nor pytorch_model.bin "
                  '(sharded checkpoints are not supported); re-save it with save_pretrained')


def _save_safetensors(state: dict, path: str):
  try:
    from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise UserError(f'writing safetensors needs safetensors; {_HF_EXTRA_HINT}') from e
  save_file(state, path, metadata={'format': 'pt'})


def _spm_fast_tokenizer(model_file: str):
  """A `tokenizers` pipeline equal to sentencepiece's for our vocabularies.

  Sentencepiece's normaliser (the precompiled NFKC map, whitespace folding, the dummy '▁'
  prefix) is rebuilt from the model proto; the pieces and scores are copied. The one known
  difference: where two segmentations score exactly the same (e.g. '---' as '--' '-' or
  '-' '--') the two Viterbi implementations may break the tie differently.
  """
  # pylint: disable=import-outside-toplevel
  from sentencepiece import sentencepiece_model_pb2
  from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
  from tokenizers import processors
  proto = sentencepiece_model_pb2.ModelProto()
  with open(model_file, 'rb') as f:
    proto.ParseFromString(f.read())
  pieces = [(p.piece, p.score) for p in proto.pieces]
  model_type = proto.trainer_spec.model_type
  if model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=proto.trainer_spec.unk_id,
                                         byte_fallback=proto.trainer_spec.byte_fallback))
  elif model_type == sentencepiece_model_pb2.TrainerSpec.BPE:
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    vocab, merges = SentencePieceExtractor(model_file).extract(pieces)
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=proto.trainer_spec.unk_piece,
                                     fuse_unk=True,
                                     byte_fallback=proto.trainer_spec.byte_fallback))
  else:
    raise UserError(f"vocab_file '{model_file}' is a sentencepiece model of type {model_type}; "
                    'only unigram and bpe models export')
  spec = proto.normalizer_spec
  steps = []
  if spec.precompiled_charsmap:
    steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
  if spec.remove_extra_whitespaces:
    steps += [normalizers.Replace(Regex(' {2,}'), ' '), normalizers.Strip()]
  if steps:
    tokenizer.normalizer = normalizers.Sequence(steps)
  scheme = 'always' if spec.add_dummy_prefix else 'never'
  tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement='▁', prepend_scheme=scheme)
  tokenizer.decoder = decoders.Metaspace(replacement='▁', prepend_scheme=scheme)
  cls, sep = tokenizer_lib.SPECIAL_TOKENS[tokenizer_lib.CLS_ID], tokenizer_lib.SPECIAL_TOKENS[
      tokenizer_lib.SEP_ID]
  tokenizer.post_processor = processors.TemplateProcessing(
      single=f'{cls}:0 $A:0 {sep}:0', pair=f'{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1',
      special_tokens=[(cls, tokenizer_lib.CLS_ID), (sep, tokenizer_lib.SEP_ID)])
  return tokenizer


def write_tokenizer(vocab_file: str, directory: str, model_max_length: int, config=None):
  """Tokenizer files AutoTokenizer loads offline: a fast tokenizer from a sentencepiece model
  (plus the model itself as spm.model), or vocab.txt with an ElectraTokenizerFast config."""
  try:
    import transformers  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise UserError(f'writing tokenizer files needs transformers; {_HF_EXTRA_HINT}') from e
  path = paths.resolve_path(vocab_file)
  if not os.path.isfile(path):
    raise UserError(f"vocab_file '{vocab_file}' (from the workdir's config.json) not found; "
                    'restore it or run from the directory training ran in')
  names = dict(unk_token='[UNK]', pad_token='[PAD]', cls_token='[CLS]', sep_token='[SEP]',
               mask_token='[MASK]')
  if path.endswith('.txt'):
    lower = bool(config.get('do_lower_case', True)) if config is not None else True
    shutil.copyfile(path, os.path.join(directory, WORDPIECE_FILE))
    with open(path, encoding='utf-8') as f:
      vocab = {line.rstrip('\n'): i for i, line in enumerate(f)}
    tokenizer = transformers.ElectraTokenizerFast(vocab=vocab, do_lower_case=lower,
                                                  model_max_length=model_max_length, **names)
  else:
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_spm_fast_tokenizer(path), model_max_length=model_max_length,
        model_input_names=['input_ids', 'token_type_ids', 'attention_mask'], **names)
    shutil.copyfile(path, os.path.join(directory, SPM_FILE))
  tokenizer.save_pretrained(directory)
  # transformers 5 records its internal backend class; name the public one 4.x also loads.
  config_file = os.path.join(directory, 'tokenizer_config.json')
  tokenizer_config = _read_json(config_file)
  tokenizer_config['tokenizer_class'] = ('ElectraTokenizer' if path.endswith('.txt')
                                         else 'PreTrainedTokenizerFast')
  with open(config_file, 'w', encoding='utf-8') as f:
    json.dump(tokenizer_config, f, indent=2, sort_keys=True)


def write_hf_model(params, config, network: str, directory: str):
  """config.json + model.safetensors for one network into an existing directory."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'config.json'), 'w', encoding='utf-8') as f:
    json.dump(hf_config_dict(config, network), f, indent=2, sort_keys=True)
  _save_safetensors(params_to_hf(params, config, network),
                    os.path.join(directory, 'model.safetensors'))


# --- Workdirs -------------------------------------------------------------------------------

def load_workdir_config(workdir: str) -> ml_collections.ConfigDict:
  path = experiment_lib.config_path(workdir)
  if not os.path.isfile(path):
    raise UserError(f"'{path}' not found; --workdir must be a training workdir (train writes "
                    'config.json there)')
  return config_lib.resolve(ml_collections.ConfigDict(_read_json(path)))


def restore_params(workdir: str, config, step: int | None = None):
  """(params as numpy, step) of the latest (or `step`) checkpoint in a workdir."""
  ckpt, latest = experiment_lib.open_checkpoints(workdir)
  try:
    step = latest if step is None else step
    if step not in ckpt.all_steps():
      raise UserError(f'--step={step} is not a checkpoint in {ckpt.directory}; available: '
                      f'{ckpt.all_steps()}')
    model = model_lib.Electra(model_lib.ModelConfig.from_config(config))
    tx, _ = optim.make_optimizer(config)
    abstract = ts.abstract_state(parallel.make_mesh(), model, tx, config.max_seq_length,
                                 config.max_predictions_per_seq)
    state = ckpt.restore(step, abstract)
  finally:
    ckpt.close()
  return jax.device_get(state.params), step


def _check_output(output: str, overwrite: bool) -> str:
  output = os.path.abspath(os.path.expanduser(output))
  if os.path.exists(output):
    if not os.path.isdir(output):
      raise UserError(f"--output '{output}' is a file; pass a directory path")
    if os.listdir(output) and not overwrite:
      raise UserError(f"--output '{output}' exists and is not empty; pass --overwrite to "
                      'replace it or choose another directory')
  parent = os.path.dirname(output)
  try:
    os.makedirs(parent, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create '{parent}': {e.strerror}; pick a writable --output") from e
  return output


def _publish(tmp: str, output: str):
  """Moves a finished temp directory to `output`, replacing what was there only at the end."""
  old = None
  if os.path.exists(output):
    old = tempfile.mkdtemp(prefix=os.path.basename(output) + '.old-',
                           dir=os.path.dirname(output))
    os.rmdir(old)
    os.rename(output, old)
  os.rename(tmp, output)
  if old is not None:
    shutil.rmtree(old)


def _in_temp_dir(output: str, write) -> None:
  tmp = tempfile.mkdtemp(prefix=os.path.basename(output) + '.tmp-', dir=os.path.dirname(output))
  try:
    write(tmp)
    _publish(tmp, output)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def export_workdir(workdir: str, output: str, what: str = 'discriminator',
                   step: int | None = None, overwrite: bool = False) -> dict:
  """Writes a workdir's checkpoint as transformers directories; returns a summary.

  'discriminator' or 'generator': that model in `output`; 'both': the discriminator in
  `output` and the generator in `output/generator`. Each directory has its tokenizer files.
  """
  if what not in ('discriminator', 'generator', 'both'):
    raise UserError(f"--what={what!r} must be 'discriminator', 'generator' or 'both'")
  if not os.path.isdir(workdir):
    raise UserError(f"--workdir '{workdir}' does not exist; pass a training workdir")
  output = _check_output(output, overwrite)
  config = load_workdir_config(workdir)
  layout = {'discriminator': {'discriminator': ''}, 'generator': {'generator': ''},
            'both': {'discriminator': '', 'generator': 'generator'}}[what]
  _check_exportable(config, layout)
  params, step = restore_params(workdir, config, step)

  def write(tmp):
    for network, sub in layout.items():
      directory = os.path.join(tmp, sub)
      print(f'Writing the {network} to {os.path.join(output, sub)}', flush=True)
      write_hf_model(params, config, network, directory)
      write_tokenizer(config.vocab_file, directory, config.max_position_embeddings, config)

  _in_temp_dir(output, write)
  return dict(output=output, what=what, step=int(step), workdir=os.path.abspath(workdir),
              directories={n: os.path.join(output, s) if s else output
                           for n, s in layout.items()})


def _check_exportable(config, networks):
  """HF ELECTRA has one layout: an RTD discriminator and a generator sharing embeddings."""
  if config.objective not in EXPORTABLE_OBJECTIVES:
    raise UserError(f'objective {config.objective!r} has no ELECTRA discriminator to export '
                    f'(export supports {EXPORTABLE_OBJECTIVES}); fine-tune the workdir directly '
                    'with --config.init_checkpoint=WORKDIR')
  if 'generator' in networks and config.tie != 'embeddings':
    raise UserError(f"config.tie={config.tie!r}: the generator does not use the shared "
                    "embeddings HF expects; export only --what=discriminator")


def _hf_vocab_file(hf_dir: str) -> str | None:
  """The vocabulary an HF directory carries in a form our tokenizer reads, if any."""
  return next((n for n in (SPM_FILE, WORDPIECE_FILE) if os.path.isfile(os.path.join(hf_dir, n))),
              None)


def load_hf_discriminator(hf_dir: str, with_head: bool = True):
  """(resolved config, {'embeddings', 'discriminator'} numpy params) from a transformers
  discriminator directory, for starting fine-tuning from it without writing a workdir.

  config.vocab_file points at the directory's spm.model or vocab.txt when it has one.
  """
  hf_config, state = load_hf_dir(hf_dir)
  vocab_name = _hf_vocab_file(hf_dir)
  config = config_from_hf(hf_config,
                          vocab_file=os.path.join(hf_dir, vocab_name) if vocab_name else None)
  return config, hf_to_params(state, config, 'discriminator', with_head)


def import_hf(hf_dir: str, output: str, hf_generator_dir: str | None = None,
              overwrite: bool = False, seed: int = 0) -> dict:
  """Converts transformers ELECTRA checkpoint directories into a workdir with a step-0 Orbax
  checkpoint (fresh optimizer state) and config.json; returns a summary."""
  if not os.path.isdir(hf_dir):
    raise UserError(f"--from_hf '{hf_dir}' is not a directory; pass a transformers checkpoint "
                    'directory')
  output = _check_output(output, overwrite)
  hf_config, hf_state = load_hf_dir(hf_dir)
  hf_gen_config, hf_gen_state = (None, None)
  if hf_generator_dir:
    hf_gen_config, hf_gen_state = load_hf_dir(hf_generator_dir)
  if HF_ARCHITECTURES['generator'] in hf_config.get('architectures', ()):
    raise UserError(f"'{hf_dir}' holds a generator (ElectraForMaskedLM); pass the "
                    'discriminator as --from_hf and this one as --from_hf_generator')
  vocab_name = _hf_vocab_file(hf_dir)
  config = config_from_hf(hf_config, hf_gen_config,
                          os.path.join(output, vocab_name) if vocab_name else None)
  params = hf_to_params(hf_state, config, 'discriminator')
  notes = []
  if hf_gen_state is not None:
    gen = hf_to_params(hf_gen_state, config, 'generator')
    if not all(np.array_equal(gen['embeddings'][k], params['embeddings'][k])
               for k in ('word_embeddings', 'position_embeddings', 'token_type_embeddings')):
      notes.append("the generator's embeddings differ from the discriminator's; kept the "
                   "discriminator's (our networks share one table)")
    params['generator'] = gen['generator']
  else:
    model = model_lib.Electra(model_lib.ModelConfig.from_config(config))
    init = jax.jit(lambda r: model_lib.init_params(model, r, config.max_seq_length,
                                                   config.max_predictions_per_seq))
    params['generator'] = jax.device_get(init(jax.random.key(seed))['generator'])
    notes.append('no --from_hf_generator: the generator is randomly initialised (fine for '
                 'fine-tuning and evaluating the discriminator)')
  if vocab_name is None:
    notes.append(f"'{hf_dir}' has no {SPM_FILE} or {WORDPIECE_FILE}: config.vocab_file still "
                 'points at the demo vocabulary; set it to your vocabulary')
  for note in notes:
    print(f'Note: {note}', flush=True)

  def write(tmp):
    if vocab_name is not None:
      shutil.copyfile(os.path.join(hf_dir, vocab_name), os.path.join(tmp, vocab_name))
    tx, _ = optim.make_optimizer(config)
    jax_params = jax.tree.map(jnp.asarray, params)
    state = ts.TrainState(step=jnp.zeros((), jnp.int32), params=jax_params,
                          opt_state=tx.init(jax_params))
    ckpt = checkpoint.Checkpointer(os.path.join(tmp, 'checkpoints'), async_save=False)
    ckpt.save(0, state, force=True)
    ckpt.close()
    experiment_lib.write_config(tmp, config)

  print(f'Writing a step-0 checkpoint and config.json to {output}', flush=True)
  _in_temp_dir(output, write)
  shape_flags = [f'--config.{k}={config[k]}' for k in experiment_lib.SHAPE_KEYS]
  return dict(output=output, from_hf=os.path.abspath(hf_dir),
              from_hf_generator=os.path.abspath(hf_generator_dir) if hf_generator_dir else None,
              step=0, vocab_file=config.vocab_file, notes=notes,
              evaluate_flags=['--config=configs/base_config.py', *shape_flags,
                              f'--config.vocab_file={config.vocab_file}',
                              f'--config.max_seq_length={config.max_seq_length}'])


# --- CLI ------------------------------------------------------------------------------------

FLAGS = flags.FLAGS


def _define_flags():
  """Defined when the command runs, not on import: fine-tuning imports this module as a
  library next to its own --workdir/--output flags."""
  flags.DEFINE_string('workdir', None, 'Training workdir to export (config.json + checkpoints/).')
  flags.DEFINE_string('output', None, 'Export: the transformers directory to write. --from_hf: '
                      'the workdir to write.')
  flags.DEFINE_enum('what', 'discriminator', ['discriminator', 'generator', 'both'],
                    "Which network to export; 'both' puts the generator in OUTPUT/generator.")
  flags.DEFINE_integer('step', None, 'Checkpoint step to export (default: the latest).')
  flags.DEFINE_string('from_hf', None, 'Import instead: a transformers ELECTRA discriminator '
                      'directory (config.json + model.safetensors or pytorch_model.bin).')
  flags.DEFINE_string('from_hf_generator', None, 'With --from_hf: its generator directory '
                      '(ElectraForMaskedLM); without it the generator is randomly initialised.')
  flags.DEFINE_bool('overwrite', False, 'Replace a non-empty --output.')


def main(argv):
  del argv
  start = time.time()
  if FLAGS.output is None:
    raise UserError('--output is required: the directory to write')
  if FLAGS.from_hf is not None:
    if FLAGS.workdir is not None:
      raise UserError('pass either --workdir (export) or --from_hf (import), not both')
    result = import_hf(FLAGS.from_hf, FLAGS.output, FLAGS.from_hf_generator, FLAGS.overwrite)
  else:
    if FLAGS.workdir is None:
      raise UserError('pass --workdir=WORKDIR to export a training run, or --from_hf=DIR to '
                      'import a transformers checkpoint')
    if FLAGS.from_hf_generator is not None:
      raise UserError('--from_hf_generator needs --from_hf')
    result = export_workdir(FLAGS.workdir, FLAGS.output, FLAGS.what, FLAGS.step,
                            FLAGS.overwrite)
  print(f"Wrote {result['output']} in {time.time() - start:.1f}s", flush=True)
  cli.print_result(dict(result, wall_time_sec=round(time.time() - start, 2)))


def run():
  """Console entry point (electra-export)."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  run()
