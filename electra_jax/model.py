"""ELECTRA in Flax linen: shared embeddings, a small generator (MLM) and a discriminator (RTD).

One module, one params tree {'embeddings', 'generator', 'discriminator'}. The token, position
and token-type embeddings (with their LayerNorm) are a single set of arrays used by both
networks; each network projects E -> its own width when they differ. Layer and parameter names
follow BERT/HF ELECTRA so checkpoints convert one-to-one.

The paper's ablations change only which parts exist: the objective's Layout (objectives/)
and config.tie. 'discriminator' always names the full-size network, the one fine-tuning keeps
(its 'encoder' plus 'embeddings'), whatever it is trained to predict. Its heads are 'head'
(one logit per token: replaced-token detection, or the copy probability of all_tokens_mlm)
and/or 'mlm_head' (a masked LM over the tied embeddings, with its own 'output_bias').
'generator' is absent for 'mlm' (and with config.uniform_generator);
with tie='none' the generator has its own 'generator_embeddings'; with tie='all' it has no
encoder and runs the discriminator's; with tie='gdes' (DeBERTa-v3's gradient-disentangled
embedding sharing) every embedding array the discriminator reads (token, position and
token-type tables, LayerNorm) is stop_gradient(the shared one) plus its own zero-initialised
delta in 'discriminator_embeddings', so its loss never moves the generator's embeddings.
"""
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.core import unfreeze

from electra_jax import config as config_lib
from electra_jax import objectives
from electra_jax.objectives.base import Layout

LAYER_NORM_EPS = 1e-12


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int
  embedding_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int
  generator_hidden_size: int
  generator_num_heads: int
  generator_intermediate_size: int
  generator_num_layers: int
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  disc_output_bias_init: float = 0.0
  # Initialisation (config.initializer_range, config.glorot_projections).
  initializer_range: float = 0.02
  glorot_projections: bool = False
  # config.relative_attention_span: learned per-head attention bias by clipped offset (0: none).
  relative_attention_span: int = 0
  dtype: Any = jnp.float32
  remat: str = 'none'
  # config.attention_implementation: 'auto' (cuDNN's flash attention where it computes what
  # XLA would; see fused_attention_implementation) or 'xla'.
  attention_implementation: str = 'auto'
  # Which parts exist (the objective's layout) and which are shared (config.tie).
  layout: Layout = objectives.get('electra').layout
  tie: str = 'embeddings'

  @property
  def has_dropout(self) -> bool:
    """Training draws dropout masks (so needs a dropout key) only then."""
    return bool(self.dropout_rate or self.attention_dropout_rate)

  @classmethod
  def from_config(cls, c) -> 'ModelConfig':
    gen = config_lib.generator_sizes(c)
    return cls(vocab_size=c.vocab_size, embedding_size=c.embedding_size,
               hidden_size=c.hidden_size, num_layers=c.num_layers, num_heads=c.num_heads,
               intermediate_size=c.intermediate_size,
               generator_hidden_size=gen['hidden_size'],
               generator_num_heads=gen['num_heads'],
               generator_intermediate_size=gen['intermediate_size'],
               generator_num_layers=gen['num_layers'],
               max_position_embeddings=c.max_position_embeddings,
               type_vocab_size=c.type_vocab_size, dropout_rate=c.dropout_rate,
               attention_dropout_rate=c.attention_dropout_rate,
               disc_output_bias_init=c.disc_output_bias_init,
               initializer_range=c.initializer_range, glorot_projections=c.glorot_projections,
               relative_attention_span=c.relative_attention_span, dtype=jnp.dtype(c.dtype),
               remat=c.remat, attention_implementation=c.attention_implementation,
               layout=objectives.get(c.objective).layout_for(c), tie=c.tie)


def _dense(features, dtype, name, kernel_init, bias_init=nn.initializers.zeros):
  return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, kernel_init=kernel_init,
                  bias_init=bias_init, name=name)


def _normal(std: float):
  """BERT's initializer: a normal with this std, truncated at two of them."""
  return nn.initializers.truncated_normal(std)


def _projection_init(cfg: 'ModelConfig'):
  """The official release leaves embeddings_project and the discriminator's dense_prediction
  at tf.layers.dense's default, Glorot uniform; BERT's initializer elsewhere."""
  return nn.initializers.glorot_uniform() if cfg.glorot_projections else _normal(
      cfg.initializer_range)


def _layer_norm(name):
  # Statistics and output in float32: bf16 LayerNorm loses too much precision.
  return nn.LayerNorm(epsilon=LAYER_NORM_EPS, dtype=jnp.float32, param_dtype=jnp.float32,
                      name=name)


class Dropout(nn.Module):
  """Inverted dropout like nn.Dropout, drawing half the random bits.

  nn.Dropout spends one threefry hash (32 bits) per element, and on CPU those hashes cost about
  a quarter of an ELECTRA-Small train step. A keep decision needs far fewer bits: each 32-bit
  draw here decides two elements (16 bits each, keep probability exact to 2^-16). The bits are
  still jax.random threefry over the array's logical index, so the mask is the same on any
  sharding of the batch.
  """
  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic:
      return x
    return dropped(x, *self.keep_mask(x.shape))

  def keep_mask(self, shape):
    """(bool keep decisions for an array of `shape`, the kept share); (None, 1.0) where the
    rate rounds to keeping all (2^-17 or less)."""
    threshold = round((1.0 - self.rate) * 65536)
    if threshold >= 65536:
      return None, 1.0
    words_shape = shape[:-1] + ((shape[-1] + 1) // 2,)
    words = jax.random.bits(self.make_rng('dropout'), words_shape, jnp.uint32)
    halves = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(shape[:-1] + (-1,))
    return halves[..., :shape[-1]] < threshold, threshold / 65536


def dropped(x, keep, keep_prob: float):
  """Inverted dropout of `x` by Dropout.keep_mask's decisions (`keep` None keeps all)."""
  if keep is None:
    return x
  return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros((), x.dtype))


class Embeddings(nn.Module):
  """Token + position + token-type embeddings with LayerNorm; shared by G and D."""
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    init = _normal(cfg.initializer_range)
    self.word_embeddings = self.param('word_embeddings', init,
                                      (cfg.vocab_size, cfg.embedding_size), jnp.float32)
    self.position_embeddings = self.param(
        'position_embeddings', init, (cfg.max_position_embeddings, cfg.embedding_size),
        jnp.float32)
    self.token_type_embeddings = self.param(
        'token_type_embeddings', init, (cfg.type_vocab_size, cfg.embedding_size), jnp.float32)
    self.layer_norm = _layer_norm('LayerNorm')

  def __call__(self, input_ids, segment_ids):
    seq_len = input_ids.shape[-1]
    x = (jnp.take(self.word_embeddings, input_ids, axis=0)
         + self.position_embeddings[None, :seq_len]
         + jnp.take(self.token_type_embeddings, segment_ids, axis=0))
    return self.layer_norm(x)

  def attend(self, hidden):
    """Tied output projection: hidden [..., E] -> logits [..., vocab], in float32."""
    return jnp.einsum('...e,ve->...v', hidden.astype(self.cfg.dtype),
                      self.word_embeddings.astype(self.cfg.dtype),
                      preferred_element_type=jnp.float32)


def local_attention_init(key, shape, dtype=jnp.float32):
  """A [2 * span + 1, heads] table of -slope * |offset|, head h's slope 2^-h (ALiBi's
  shape): each head starts looking at a window around the query, the first at the nearest
  tokens. A zero start would stay near uniform attention for hundreds of steps, since Adam
  moves each entry by at most about the learning rate per step."""
  del key
  span = (shape[0] - 1) // 2
  offset = jnp.abs(jnp.arange(-span, span + 1, dtype=dtype))
  slope = 2.0 ** -jnp.arange(shape[1], dtype=dtype)
  return -offset[:, None] * slope[None, :]


def relative_position_bias(table, seq_len):
  """[1, heads, S, S] score bias from a [2 * span + 1, heads] table indexed by each key's
  offset from the query, clipped to +-span."""
  span = (table.shape[0] - 1) // 2
  pos = jnp.arange(seq_len)
  offset = jnp.clip(pos[None, :] - pos[:, None], -span, span) + span
  return jnp.transpose(table[offset], (2, 0, 1))[None]


def fused_attention_implementation(requested: str, dtype, head_dim: int, mask_ndim: int,
                                   has_bias: bool, device) -> str:
  """'cudnn' or 'xla': who computes the model's fused attention call on `device`.

  cuDNN's flash attention never writes the [batch, heads, seq, seq] scores that XLA's softmax
  reads and writes in f32 (Base at 32 x 512 on an H200: 73.0 -> 54.6 ms a step with attention
  dropout 0, benchmarks/RESULTS.md). 'auto' takes it only where it computes what XLA does:
  an NVIDIA GPU of compute capability >= 8.0, bf16 or fp16, a head dim that is a multiple of 8
  up to 128, a [batch, seq] key mask (it goes in as each row's length: real tokens first,
  padding last, as every electra_jax pipeline writes them) and no score bias."""
  if requested == 'xla':
    return 'xla'
  try:  # An NVIDIA GPU's '9.0'; a ROCm GPU reports 'gfx942', a CPU or TPU nothing.
    capability = tuple(int(x) for x in str(device.compute_capability).split('.')[:2])
  except (AttributeError, ValueError):
    capability = ()
  usable = (device.platform == 'gpu' and capability >= (8, 0)
            and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
            and head_dim % 8 == 0 and head_dim <= 128 and mask_ndim == 2 and not has_bias)
  return 'cudnn' if usable else 'xla'


def cudnn_attention(q, k, v, key_mask):
  """jax's cuDNN attention with the [batch, seq] key mask as row lengths. A row of padding
  only (a padded evaluation batch) keeps one key, as XLA's mask gives it a finite output too."""
  lengths = jnp.maximum(key_mask.sum(-1, dtype=jnp.int32), 1)
  return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths,
                                      implementation='cudnn')


def attention_scores(q, k):
  """q.k / sqrt(head_dim) as [batch, heads, q, k] in the compute dtype, where attention dropout
  needs the probabilities written out: in bf16 half the bytes of this [seq, seq] tensor and its
  gradient (Base 32 x 512 on an H200: 76.4 -> 73.3 ms a step, Small 15.2 -> 14.7,
  benchmarks/RESULTS.md); softmax_dropout reads them as float32. With the scale on q (exact
  for a power-of-two head dim) a float32 model computes what it did with the scale after the
  matmul, bit for bit."""
  scaled = q * jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
  return jnp.einsum('bqhd,bkhd->bhqk', scaled, k)


def softmax_dropout(scores, mask, keep, keep_prob: float):
  """Attention probabilities in the scores' dtype: softmax over the keys `mask` allows, in
  float32, then inverted dropout (`keep` from Dropout.keep_mask; None keeps all).

  Its backward is written out (_softmax_dropout_backward): it keeps the probabilities in the
  scores' dtype and the keep mask, 3 bytes a [batch, heads, seq, seq] element in bf16, where
  JAX's autodiff names 14 (the masked f32 scores, their exp, the f32 dropped probabilities,
  two bool masks). Base at 32 x 512 on an H200: 71.6 -> 69.5 ms a step, 1.2 GB less temporary
  memory (benchmarks/RESULTS.md, 2026-11-27). The same gradient: the softmax's
  p * (g - sum(p * g)) from the kept probabilities (bf16-rounded in a bf16 model)."""
  if keep is None:  # No dropout: autodiff's backward of the softmax alone.
    return autodiff_softmax_dropout(scores, mask, keep, keep_prob)
  return _softmax_dropout(scores, mask, keep, keep_prob)


def autodiff_softmax_dropout(scores, mask, keep, keep_prob: float):
  """softmax_dropout's forward with the backward JAX's autodiff derives (the model's form
  before 2026-11-27): benchmarks/step_parts.py's variant and the tests' reference."""
  return dropped(masked_softmax(scores, mask), keep, keep_prob).astype(scores.dtype)


def masked_softmax(scores, mask):
  """Softmax over the keys `mask` allows, in float32."""
  return jax.nn.softmax(jnp.where(mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min),
                        axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _softmax_dropout(scores, mask, keep, keep_prob):
  return _softmax_dropout_forward(scores, mask, keep, keep_prob)[0]


def _softmax_dropout_forward(scores, mask, keep, keep_prob):
  probs = masked_softmax(scores, mask)
  dropped_probs = dropped(probs, keep, keep_prob).astype(scores.dtype)
  return dropped_probs, (probs.astype(scores.dtype), mask, keep)


def _softmax_dropout_backward(keep_prob, residuals, grad):
  probs, mask, keep = residuals
  p = probs.astype(jnp.float32)
  d_probs = dropped(grad.astype(jnp.float32), keep, keep_prob)
  d_scores = p * (d_probs - jnp.sum(d_probs * p, axis=-1, keepdims=True))
  # Masked keys get no gradient, as through the forward's where (a row with no key allowed
  # has uniform probabilities, not zeros).
  return jnp.where(mask, d_scores, 0.0).astype(probs.dtype), None, None


_softmax_dropout.defvjp(_softmax_dropout_forward, _softmax_dropout_backward)


class SelfAttention(nn.Module):
  hidden_size: int
  num_heads: int
  dropout_rate: float
  attention_dropout_rate: float
  dtype: Any
  init_std: float = 0.02
  relative_span: int = 0
  implementation: str = 'auto'

  @nn.compact
  def __call__(self, x, attention_mask, deterministic):
    init = _normal(self.init_std)
    head_dim = self.hidden_size // self.num_heads
    split = lambda t: t.reshape(t.shape[:-1] + (self.num_heads, head_dim))
    q = split(_dense(self.hidden_size, self.dtype, 'query', init)(x))
    k = split(_dense(self.hidden_size, self.dtype, 'key', init)(x))
    v = split(_dense(self.hidden_size, self.dtype, 'value', init)(x))
    # attention_mask: [B, S] bool, True = real token (may be attended to).
    # [B, S] (keys only) or [B, S, S] (query x key, e.g. causal) -> broadcast over heads.
    mask = (attention_mask[:, None, None, :] if attention_mask.ndim == 2
            else attention_mask[:, None])
    bias = None
    if self.relative_span:
      table = self.param('relative_position_bias', local_attention_init,
                         (2 * self.relative_span + 1, self.num_heads), jnp.float32)
      bias = relative_position_bias(table, x.shape[1])
    if self.attention_dropout_rate == 0.0 or deterministic:
      # One fused call for the whole attention: cuDNN's where it computes the same, else
      # XLA's (jax 0.10-0.11's implementation=None is XLA on every backend, softmax over f32
      # [batch, heads, seq, seq] scores).
      kind = fused_attention_implementation(self.implementation, self.dtype, head_dim,
                                            attention_mask.ndim, bias is not None,
                                            jax.devices()[0])
      if kind == 'cudnn':
        ctx = cudnn_attention(q, k, v, attention_mask)
      else:
        ctx = jax.nn.dot_product_attention(
            q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask)
    else:
      scores = attention_scores(q, k)
      if bias is not None:
        scores = scores + bias
      keep, keep_prob = Dropout(self.attention_dropout_rate).keep_mask(scores.shape)
      probs = softmax_dropout(scores, mask, keep, keep_prob)
      ctx = jnp.einsum('bhqk,bkhd->bqhd', probs.astype(self.dtype), v)
    ctx = ctx.reshape(ctx.shape[:-2] + (self.hidden_size,))
    out = _dense(self.hidden_size, self.dtype, 'output', init)(ctx)
    return Dropout(self.dropout_rate)(out, deterministic=deterministic)


class TransformerLayer(nn.Module):
  """Post-LN BERT layer: x + attn -> LN -> x + FFN(GELU) -> LN."""
  hidden_size: int
  num_heads: int
  intermediate_size: int
  dropout_rate: float
  attention_dropout_rate: float
  dtype: Any
  init_std: float = 0.02
  relative_span: int = 0
  attention_implementation: str = 'auto'

  @nn.compact
  def __call__(self, x, attention_mask, deterministic):
    init = _normal(self.init_std)
    attn = SelfAttention(self.hidden_size, self.num_heads, self.dropout_rate,
                         self.attention_dropout_rate, self.dtype, self.init_std,
                         self.relative_span, self.attention_implementation,
                         name='attention')(x, attention_mask, deterministic)
    x = _layer_norm('attention_LayerNorm')(x + attn).astype(self.dtype)
    h = _dense(self.intermediate_size, self.dtype, 'intermediate', init)(x)
    h = nn.gelu(h, approximate=False)
    h = _dense(self.hidden_size, self.dtype, 'output', init)(h)
    h = Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return _layer_norm('output_LayerNorm')(x + h).astype(self.dtype)


# config.remat: what each transformer layer keeps for the backward pass. 'full' keeps only the
# layer's input and recomputes the rest (~1/3 more compute, activation memory of one layer);
# 'save_dots' keeps the matmul outputs and recomputes the elementwise work between them.
REMAT_POLICIES = {'full': None,
                  'save_dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


def remat_layer(remat: str):
  """TransformerLayer, rematerialised per config.remat (same parameter names either way)."""
  if remat == 'none':
    return TransformerLayer
  # static_argnums counts `self`: 3 is `deterministic`, a Python bool.
  return nn.remat(TransformerLayer, policy=REMAT_POLICIES[remat], static_argnums=(3,))


class Encoder(nn.Module):
  """Embedding dropout, optional E->H projection and the transformer stack of one network."""
  cfg: ModelConfig
  hidden_size: int
  num_heads: int
  intermediate_size: int
  num_layers: int
  # '' (bidirectional), 'ltr' (position i attends to <= i) or 'rtl' (to >= i).
  causal: str = ''

  @nn.compact
  def __call__(self, embedded, attention_mask, deterministic):
    cfg = self.cfg
    if self.causal:
      band = jnp.tril if self.causal == 'ltr' else jnp.triu
      seq_len = attention_mask.shape[-1]
      attention_mask = attention_mask[:, None, :] & band(jnp.ones((seq_len, seq_len), bool))
    x = Dropout(cfg.dropout_rate)(embedded, deterministic=deterministic).astype(cfg.dtype)
    if cfg.embedding_size != self.hidden_size:
      x = _dense(self.hidden_size, cfg.dtype, 'embeddings_project', _projection_init(cfg))(x)
    layer = remat_layer(cfg.remat)
    for i in range(self.num_layers):
      x = layer(self.hidden_size, self.num_heads, self.intermediate_size, cfg.dropout_rate,
                cfg.attention_dropout_rate, cfg.dtype, cfg.initializer_range,
                cfg.relative_attention_span, cfg.attention_implementation, name=f'layer_{i}')(
                    x, attention_mask, deterministic)
    return x


class GeneratorHead(nn.Module):
  """dense(H_G -> E) + GELU + LayerNorm; logits come from the tied embeddings plus a bias."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, hidden):
    h = _dense(self.cfg.embedding_size, self.cfg.dtype, 'dense',
               _normal(self.cfg.initializer_range))(hidden)
    h = nn.gelu(h, approximate=False)
    return _layer_norm('LayerNorm')(h)


class MaskedLMHead(nn.Module):
  """The full-size network's MLM head: GeneratorHead's layers, the tied output projection and
  a bias, in one submodule (so a fine-tuning model, which never calls it, has none of it)."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, hidden, embeddings):
    bias = self.param('output_bias', nn.initializers.zeros, (self.cfg.vocab_size,), jnp.float32)
    return embeddings.attend(GeneratorHead(self.cfg, name='transform')(hidden)) + bias


class DiscriminatorHead(nn.Module):
  """dense(H -> H) + GELU + dense(H -> 1): one replaced/original logit per token."""
  cfg: ModelConfig

  @nn.compact
  def __call__(self, hidden):
    h = _dense(self.cfg.hidden_size, self.cfg.dtype, 'dense',
               _normal(self.cfg.initializer_range))(hidden)
    h = nn.gelu(h, approximate=False)
    # Starting at the prior logit of 'replaced' (instead of 0) spares the encoder from having
    # to produce that constant itself, which can collapse a young discriminator's states.
    bias_init = nn.initializers.constant(self.cfg.disc_output_bias_init)
    # In float32 whatever cfg.dtype (an H x 1 product: nothing to save): a young
    # discriminator's logits differ by ~1e-3 around the prior, below bfloat16's spacing there
    # (0.016 near 2), so a bf16 logit made its scores ties and pulled disc_auc towards 0.5.
    logits = _dense(1, jnp.float32, 'dense_prediction', _projection_init(self.cfg),
                    bias_init)(h)
    return logits[..., 0].astype(jnp.float32)


class Generator(nn.Module):
  """The small MLM. With tie='all' (own_encoder False) it runs the discriminator's encoder."""
  cfg: ModelConfig
  own_encoder: bool = True

  def setup(self):
    cfg = self.cfg
    if self.own_encoder:
      self.encoder = Encoder(cfg, cfg.generator_hidden_size, cfg.generator_num_heads,
                             cfg.generator_intermediate_size, cfg.generator_num_layers)
    self.head = GeneratorHead(cfg)
    self.output_bias = self.param('output_bias', nn.initializers.zeros, (cfg.vocab_size,),
                                  jnp.float32)
    if cfg.layout.generator_baseline:
      self.baseline = nn.Dense(1, dtype=cfg.dtype, param_dtype=jnp.float32,
                               kernel_init=_normal(cfg.initializer_range))

  def __call__(self, embedded, attention_mask, masked_positions, embeddings, deterministic):
    return self.predict(self.encoder(embedded, attention_mask, deterministic), masked_positions,
                        embeddings)

  def predict(self, hidden, masked_positions, embeddings):
    """(MLM logits [B, P, vocab], the baseline head's logits [B, P] or None without one)."""
    # Gather the masked positions first: the vocab projection is the costliest matmul.
    hidden = jnp.take_along_axis(hidden, masked_positions[..., None], axis=1)
    logits = embeddings.attend(self.head(hidden)) + self.output_bias
    if not self.cfg.layout.generator_baseline:
      return logits, None
    return logits, self.baseline(hidden)[..., 0].astype(jnp.float32)


class ClozeGenerator(nn.Module):
  """Electric's two-tower cloze model: a left-to-right and a right-to-left encoder over the
  unmasked input; position i reads the first's state at i - 1 and the second's at i + 1 (the
  official roll, wrapping at the ends), so it never sees token i. Logits at every position."""
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    sizes = (cfg.generator_hidden_size, cfg.generator_num_heads, cfg.generator_intermediate_size,
             cfg.generator_num_layers)
    self.ltr = Encoder(cfg, *sizes, causal='ltr')
    self.rtl = Encoder(cfg, *sizes, causal='rtl')
    self.head = GeneratorHead(cfg)
    self.output_bias = self.param('output_bias', nn.initializers.zeros, (cfg.vocab_size,),
                                  jnp.float32)

  def __call__(self, embedded, attention_mask, embeddings, deterministic):
    left = jnp.roll(self.ltr(embedded, attention_mask, deterministic), 1, axis=1)
    right = jnp.roll(self.rtl(embedded, attention_mask, deterministic), -1, axis=1)
    hidden = jnp.concatenate([left, right], axis=-1)
    return embeddings.attend(self.head(hidden)) + self.output_bias


class Discriminator(nn.Module):
  """The full-size network: encoder plus the heads its objective uses (Layout)."""
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    self.encoder = Encoder(cfg, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size,
                           cfg.num_layers)
    if cfg.layout.rtd_head:
      self.head = DiscriminatorHead(cfg)
    if cfg.layout.mlm_head:
      self.mlm_head = MaskedLMHead(cfg)

  def hidden_states(self, embedded, attention_mask, deterministic):
    return self.encoder(embedded, attention_mask, deterministic)

  def __call__(self, embedded, attention_mask, deterministic):
    return self.head(self.encoder(embedded, attention_mask, deterministic))

  def outputs(self, embedded, attention_mask, mlm_positions, embeddings, deterministic):
    """One encoder pass -> {'rtd': [B, S] logits, 'mlm': [B, P, vocab] logits at
    `mlm_positions`}, each present when this network has that head."""
    hidden = self.encoder(embedded, attention_mask, deterministic)
    out = {}
    if self.cfg.layout.rtd_head:
      out['rtd'] = self.head(hidden)
    if self.cfg.layout.mlm_head:
      hidden = jnp.take_along_axis(hidden, mlm_positions[..., None], axis=1)
      out['mlm'] = self.mlm_head(hidden, embeddings)
    return out


class Electra(nn.Module):
  """Generator and discriminator over one shared embedding table (or per config.tie)."""
  cfg: ModelConfig

  def setup(self):
    cfg = self.cfg
    self.embeddings = Embeddings(cfg)
    if cfg.layout.cloze_generator:
      self.generator = ClozeGenerator(cfg)
    elif cfg.layout.generator:
      self.generator = Generator(cfg, own_encoder=cfg.tie != 'all')
      if cfg.tie == 'none':
        self.generator_embeddings = Embeddings(cfg)
    if cfg.tie == 'gdes':
      self.discriminator_embeddings = self.param('discriminator_embeddings',
                                                 _zero_embeddings(cfg))
    self.discriminator = Discriminator(cfg)

  def _discriminator_embedded(self, input_ids, segment_ids):
    if self.cfg.tie != 'gdes':
      return self.embeddings(input_ids, segment_ids)
    if self.is_initializing():
      self.embeddings(input_ids, segment_ids)  # Creates every shared array (LayerNorm's too).
    merged = jax.tree.map(lambda shared, delta: jax.lax.stop_gradient(shared) + delta,
                          unfreeze(self.embeddings.variables['params']),
                          unfreeze(self.discriminator_embeddings))
    return Embeddings(self.cfg, parent=None).apply({'params': merged}, input_ids, segment_ids)

  def __call__(self, input_ids, segment_ids, input_mask, masked_positions, deterministic=True):
    """Runs every part on the same ids; used to initialise every parameter.

    Returns (generator logits at `masked_positions`, or None without a generator; the
    discriminator's replaced-token logits [B, S], or with an MLM head Discriminator.outputs).
    """
    gen = None
    if self.cfg.layout.cloze_generator:
      gen = self.cloze_logits(input_ids, segment_ids, input_mask, deterministic)
    elif self.cfg.layout.generator:
      gen = self.generator_logits(input_ids, segment_ids, input_mask, masked_positions,
                                  deterministic)
    if not self.cfg.layout.mlm_head:
      return gen, self.discriminator_logits(input_ids, segment_ids, input_mask, deterministic)
    return gen, self.discriminator_outputs(input_ids, segment_ids, input_mask,
                                           masked_positions, deterministic)

  def generator_logits(self, masked_ids, segment_ids, input_mask, masked_positions,
                       deterministic=True):
    """MLM logits [B, P, vocab] (float32) at `masked_positions` [B, P]."""
    return self.generator_outputs(masked_ids, segment_ids, input_mask, masked_positions,
                                  deterministic)[0]

  def generator_outputs(self, masked_ids, segment_ids, input_mask, masked_positions,
                        deterministic=True):
    """(MLM logits [B, P, vocab], baseline logits [B, P] or None): Generator.predict."""
    embeddings = self.generator_embeddings if self.cfg.tie == 'none' else self.embeddings
    embedded = embeddings(masked_ids, segment_ids)
    if self.cfg.tie == 'all':
      hidden = self.discriminator.hidden_states(embedded, input_mask.astype(bool),
                                                deterministic)
      return self.generator.predict(hidden, masked_positions, embeddings)
    return self.generator(embedded, input_mask.astype(bool), masked_positions, embeddings,
                          deterministic)

  def cloze_logits(self, input_ids, segment_ids, input_mask, deterministic=True):
    """Electric's cloze logits [B, S, vocab] (float32) of every position of the input."""
    return self.generator(self.embeddings(input_ids, segment_ids), input_mask.astype(bool),
                          self.embeddings, deterministic)

  def discriminator_logits(self, input_ids, segment_ids, input_mask, deterministic=True):
    """Replaced-token logits [B, S] (float32)."""
    embedded = self._discriminator_embedded(input_ids, segment_ids)
    return self.discriminator(embedded, input_mask.astype(bool), deterministic)

  def discriminator_outputs(self, input_ids, segment_ids, input_mask, mlm_positions,
                            deterministic=True):
    """The full-size network's heads in one pass (Discriminator.outputs)."""
    embedded = self._discriminator_embedded(input_ids, segment_ids)
    return self.discriminator.outputs(embedded, input_mask.astype(bool), mlm_positions,
                                      self.embeddings, deterministic)

  def discriminator_hidden(self, input_ids, segment_ids, input_mask, deterministic=True):
    """Final discriminator hidden states [B, S, H]: what fine-tuning heads read."""
    embedded = self._discriminator_embedded(input_ids, segment_ids)
    return self.discriminator.hidden_states(embedded, input_mask.astype(bool), deterministic)


def _zero_embeddings(cfg: ModelConfig):
  """Init of tie='gdes' deltas: zeros shaped like every Embeddings array."""
  def init(rng):
    del rng
    ids = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: Embeddings(cfg, parent=None).init(
        jax.random.key(0), ids, ids)['params'])
    return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
  return init


def discriminator_view(params):
  """The params with the discriminator's own embeddings as 'embeddings' (what export and
  fine-tuning read): under tie='gdes' the shared ones plus 'discriminator_embeddings',
  merged."""
  if 'discriminator_embeddings' not in params:
    return params
  merged = {k: v for k, v in params.items() if k != 'discriminator_embeddings'}
  merged['embeddings'] = jax.tree.map(lambda shared, delta: shared + delta,
                                      params['embeddings'], params['discriminator_embeddings'])
  return merged


def init_params(model: Electra, rng, max_seq_length: int, max_predictions: int):
  """Initialises every parameter from shapes alone (works under jit / eval_shape)."""
  ids = jnp.zeros((1, max_seq_length), jnp.int32)
  positions = jnp.zeros((1, max_predictions), jnp.int32)
  return model.init({'params': rng}, ids, ids, jnp.ones_like(ids), positions)['params']
