"""An official ELECTRA checkpoint (google-research/electra, TF1) as a new run's weights.

The official code saves the discriminator under `electra/`, the generator's encoder under
`generator/` beside the shared `electra/embeddings` (its own `generator/embeddings` with
untied_generator_embeddings), and the heads under `discriminator_predictions/` (`dense_1`:
the output layer) and `generator_predictions/`, with the optimizer's slots beside them. The
names are those transformers' conversion maps, so each network is renamed into an HF state dict
and read by hf.weights, the one mapping of ELECTRA weights onto ours. Shapes give the sizes
but not the head count: the official code's is hidden_size // 64 (at least 1), which
--config.num_heads replaces for a run that set model_hparam_overrides.
"""
import re

import numpy as np

from electra_jax import config as config_lib
from electra_jax import paths
from electra_jax import tf_checkpoint
from electra_jax.errors import UserError
from electra_jax.hf import tokenizer_files

# Official variables that are not weights: the step and the AdamWeightDecayOptimizer's slots.
_NOT_WEIGHTS = re.compile(r'(^global_step$|/adam_[mv]$)')
_LAYER = re.compile(r'/encoder/layer_(\d+)/')
_QUERY = '{scope}/encoder/layer_0/attention/self/query/kernel'
_FFN = '{scope}/encoder/layer_0/intermediate/dense/kernel'
# Present with untied_generator_embeddings: the generator's own tables (tie='none').
_OWN_EMBEDDINGS = 'generator/embeddings/word_embeddings'


def official_heads(hidden_size: int) -> int:
  """The official code's head count for a width (configure_pretraining / get_bert_config)."""
  return max(1, hidden_size // 64)


def _hf_name(name: str, scope: str) -> str:
  """An official variable name -> its transformers state-dict name (`scope`: the encoder's)."""
  name = re.sub(rf'^{scope}/', 'electra/', name)
  name = name.replace('/layer_', '/layer/').replace('discriminator_predictions/dense_1/',
                                                    'discriminator_predictions/dense_prediction/')
  name = name.replace('generator_predictions/output_bias', 'generator_lm_head/bias')
  name = re.sub(r'/(word|position|token_type)_embeddings$', r'/\1_embeddings/weight', name)
  name = re.sub(r'/(kernel|gamma)$', '/weight', name)
  return re.sub(r'/beta$', '/bias', name).replace('/', '.')


class Checkpoint:
  """The weights of one official checkpoint prefix, with the config keys its shapes fix."""

  def __init__(self, prefix: str):
    self.reader = tf_checkpoint.Reader(prefix)
    self.prefix = prefix
    self._shared = {}  # The embedding tables read so far (_read).
    names = [n for n in self.reader.names() if not _NOT_WEIGHTS.search(n)]
    self.names = names
    if any(n.startswith(('generator_ltr/', 'generator_rtl/', 'cloze_predictions/'))
           for n in names):
      raise UserError(f"'{prefix}' is an Electric checkpoint (a two-tower cloze generator); "
                      'only ELECTRA checkpoints (discriminator + generator) convert')
    if 'discriminator_predictions/dense_1/kernel' not in names:
      raise UserError(f"'{prefix}' holds no discriminator_predictions (an MLM/BERT-objective "
                      'checkpoint?); only ELECTRA checkpoints convert')
    self.has_generator = any(n.startswith('generator_predictions/') for n in names)
    if self.has_generator and _QUERY.format(scope='generator') not in names:
      raise UserError(f"'{prefix}' shares the discriminator's encoder with its generator "
                      '(untied_generator=False), which init_from cannot start; pass a run '
                      'with a separate generator')

  def _layers(self, scope: str) -> int:
    return len({m.group(1) for n in self.names if n.startswith(f'{scope}/')
                for m in [_LAYER.search(n)] if m})

  def keys(self, num_heads: int | None = None) -> dict:
    """Our shape keys; num_heads None takes the official hidden_size // 64. The generator's
    fractions only where ours can hold the checkpoint's generator (generator_misfit)."""
    shape = self.reader.shape
    vocab_size, embedding_size = shape('electra/embeddings/word_embeddings')
    hidden = shape(_QUERY.format(scope='electra'))[0]
    keys = dict(embedding_size=embedding_size, hidden_size=hidden,
                num_layers=self._layers('electra'),
                num_heads=official_heads(hidden) if num_heads is None else num_heads,
                intermediate_size=shape(_FFN.format(scope='electra'))[1], vocab_size=vocab_size,
                max_position_embeddings=shape('electra/embeddings/position_embeddings')[0],
                type_vocab_size=shape('electra/embeddings/token_type_embeddings')[0],
                relative_attention_span=0,
                tie='none' if _OWN_EMBEDDINGS in self.names else 'embeddings')
    if not self.has_generator or self.generator_misfit(keys):
      return keys
    return config_lib.with_generator(keys, self._generator_sizes(), f"'{self.prefix}'")

  def _generator_sizes(self) -> dict:
    # The official generator: 4 x its width wide, width // 64 heads, whatever the
    # discriminator's overrides.
    width = self.reader.shape(_QUERY.format(scope='generator'))[0]
    return dict(hidden_size=width,
                intermediate_size=self.reader.shape(_FFN.format(scope='generator'))[1],
                num_heads=official_heads(width), num_layers=self._layers('generator'))

  def generator_misfit(self, keys: dict) -> str | None:
    """Why our generator, the discriminator of `keys` scaled by one fraction, cannot hold the
    checkpoint's (e.g. --config.num_heads scales to other generator heads than the official
    width // 64); None where it can. Such a generator starts from random weights: fine-tuning
    and the discriminator need none of it."""
    if not self.has_generator:
      return None
    own = _OWN_EMBEDDINGS in self.names and self.reader.shape(_OWN_EMBEDDINGS)[1]
    if own and own != keys['embedding_size']:
      return (f'its generator has embeddings of its own {own} wide '
              f"(untied_generator_embeddings), the discriminator's {keys['embedding_size']}; "
              "our tie='none' generator has tables as wide as the discriminator's")
    try:
      config_lib.with_generator(keys, self._generator_sizes(), 'the checkpoint')
    except UserError as e:
      return str(e)
    return None

  def vocab_file(self) -> str | None:
    """The vocab.txt beside the checkpoint, else the official layout's DATA_DIR/vocab.txt
    (checkpoints in DATA_DIR/models/NAME); None if neither exists."""
    directory = paths.parent(self.prefix)
    for candidate in (directory, paths.parent(paths.parent(directory))):
      vocab = paths.join(candidate, tokenizer_files.WORDPIECE_FILE)
      if paths.is_file(vocab):
        return vocab
    return None

  def hf_state(self, network: str) -> dict[str, np.ndarray]:
    """One network's weights as a transformers state dict (torch layout: kernels transposed)."""
    if network == 'discriminator':
      wanted = lambda n: n.startswith(('electra/', 'discriminator_predictions/'))
      scope = 'electra'
    else:
      own_embeddings = _OWN_EMBEDDINGS in self.names
      wanted = lambda n: (n.startswith(('generator/', 'generator_predictions/')) or
                          (n.startswith('electra/embeddings/') and not own_embeddings))
      scope = 'generator'
    state = {}
    for name in filter(wanted, self.names):
      value = self._read(name)
      state[_hf_name(name, scope)] = value.T if name.endswith('/kernel') else value
    return state

  def _read(self, name: str) -> np.ndarray:
    """A variable's value; the shared embedding tables, which both networks' state dicts hold,
    read once."""
    if not name.startswith('electra/embeddings/'):
      return self.reader.read(name)
    if name not in self._shared:
      self._shared[name] = self.reader.read(name)
    return self._shared[name]
