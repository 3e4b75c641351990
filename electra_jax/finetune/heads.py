"""Fine-tuning heads on the ELECTRA discriminator's final hidden states (Flax linen).

One params tree {'electra': {'embeddings', 'discriminator'}, 'head': ...}: the encoder comes
from `model.Electra.discriminator_hidden`, so pretrained weights drop in by name (the
generator and the replaced-token head are never created).
"""
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from electra_jax import model as model_lib


# A head's kernels: 'normal', BERT's truncated normal (std 0.02), or 'glorot', Glorot-uniform
# (tf.layers.dense's default, what the official release's heads start from).
HEAD_INITS = ('normal', 'glorot')


def _dense(features, dtype, name, head_init: str = 'normal'):
  kernel_init = (nn.initializers.truncated_normal(0.02) if head_init == 'normal'
                 else nn.initializers.glorot_uniform())
  return nn.Dense(features, dtype=dtype, param_dtype=jnp.float32, kernel_init=kernel_init,
                  name=name)


POOLINGS = ('cls', 'mean')


def pool(hidden, input_mask, pooling: str):
  """One vector per example: the [CLS] state (the paper's), or the mean over real tokens (for
  encoders whose [CLS] sees little of the sentence, e.g. few layers with a local attention
  bias)."""
  if pooling == 'cls':
    return hidden[:, 0]
  mask = input_mask.astype(jnp.float32)[..., None]
  total = jnp.sum(hidden.astype(jnp.float32) * mask, axis=1)
  return (total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)).astype(hidden.dtype)


class ClassificationHead(nn.Module):
  """Dropout + one linear layer on the pooled state: class logits (or one regression value)."""
  num_outputs: int
  dropout_rate: float
  dtype: Any = jnp.float32
  pooling: str = 'cls'
  head_init: str = 'normal'

  @nn.compact
  def __call__(self, hidden, input_mask, deterministic: bool):
    pooled = nn.Dropout(self.dropout_rate)(pool(hidden, input_mask, self.pooling),
                                           deterministic=deterministic)
    return _dense(self.num_outputs, self.dtype, 'output',
                  self.head_init)(pooled).astype(jnp.float32)


class TokenHead(nn.Module):
  """Dropout + one linear layer on every position's state: tag logits [B, S, C] (transformers'
  ElectraForTokenClassification; the official tagging head has no dropout: rate 0)."""
  num_outputs: int
  dropout_rate: float
  dtype: Any = jnp.float32
  head_init: str = 'normal'

  @nn.compact
  def __call__(self, hidden, input_mask, deterministic: bool):
    del input_mask
    hidden = nn.Dropout(self.dropout_rate)(hidden, deterministic=deterministic)
    return _dense(self.num_outputs, self.dtype, 'output', self.head_init)(hidden).astype(
        jnp.float32)


def span_positions(context_mask):
  """Where a span may start or end: the context, and [CLS] (position 0), the target of a window
  that does not hold the answer (as the official code trains it; decoding never returns it)."""
  return (context_mask > 0) | (jnp.arange(context_mask.shape[-1]) == 0)


# The span head: 'xlnet' (hidden_size wide, tanh, a LayerNorm before the end logit), 'official'
# (the official release's qa_tasks.py: 512 wide, GELU, no LayerNorm), or 'bert' (one linear
# layer: transformers' ElectraForQuestionAnswering, which export writes).
SPAN_HEADS = ('xlnet', 'official', 'bert')
# The tagging head: 'transformers' (dropout + one linear layer, segment id 0: transformers'
# ElectraForTokenClassification, which export writes) or 'official' (the official release's
# tagging_tasks.py: the linear layer alone, every real token fed segment id 1).
TAG_HEADS = ('transformers', 'official')
OFFICIAL_QA_WIDTH = 512


def _top_ends(end_scores, start_index, k: int, max_answer_length: int):
  """For each of the K starts (start_index [B, K]), its top-k ends among those at or after it
  and at most max_answer_length tokens on: scores, indices [B, K, k]. end_scores [B, K, S], or
  [B, 1, S] where the end does not depend on the start."""
  positions = jnp.arange(end_scores.shape[-1])
  valid = ((positions[None, None] >= start_index[..., None])
           & (positions[None, None] < start_index[..., None] + max_answer_length))
  return jax.lax.top_k(jnp.where(valid, end_scores, -1e9), k)


class SpanHead(nn.Module):
  """Joint SQuAD head: start logits; end logits conditioned on a start position; an
  answerability logit from [CLS] and the start-probability-weighted hidden state. It reads the
  encoder's states as they are (the official QA head adds no dropout)."""
  hidden_size: int
  dtype: Any = jnp.float32
  head_init: str = 'normal'
  style: str = 'xlnet'

  def setup(self):
    dense = lambda n, name: _dense(n, self.dtype, name, self.head_init)
    official = self.style == 'official'
    width = OFFICIAL_QA_WIDTH if official else self.hidden_size
    self.activation = (lambda x: nn.gelu(x, approximate=False)) if official else jnp.tanh
    self.start = dense(1, 'start')
    self.end_dense = dense(width, 'end_dense')
    self.end_norm = nn.LayerNorm(epsilon=model_lib.LAYER_NORM_EPS, dtype=jnp.float32,
                                 param_dtype=jnp.float32, name='end_LayerNorm')
    self.end = dense(1, 'end')
    self.answer_dense = dense(width, 'answer_dense')
    self.answer = dense(1, 'answer')

  def start_logits(self, hidden, context_mask):
    """[B, S] float32; positions outside span_positions get a large negative value."""
    logits = self.start(hidden)[..., 0].astype(jnp.float32)
    return jnp.where(span_positions(context_mask), logits, -1e9)

  def end_logits(self, hidden, context_mask, start_index):
    """End logits [B, K, S] given K start positions per example (start_index [B, K])."""
    h_start = jnp.take_along_axis(hidden, start_index[..., None], axis=1)       # [B, K, H]
    h = jnp.broadcast_to(hidden[:, None], h_start.shape[:2] + hidden.shape[1:])  # [B,K,S,H]
    h_start = jnp.broadcast_to(h_start[:, :, None], h.shape)
    x = self.activation(self.end_dense(jnp.concatenate([h, h_start], axis=-1)))
    logits = self.end(x if self.style == 'official' else self.end_norm(x))
    logits = logits[..., 0].astype(jnp.float32)
    return jnp.where(span_positions(context_mask)[:, None], logits, -1e9)

  def answerable_logit(self, hidden, start_logits):
    """[B] logit that there is an answer: in this window ('xlnet') or to the question
    ('official'), as steps.per_example_loss labels it."""
    probs = jax.nn.softmax(start_logits, axis=-1).astype(hidden.dtype)
    weighted = jnp.einsum('bs,bsh->bh', probs, hidden)
    x = self.activation(self.answer_dense(jnp.concatenate([hidden[:, 0], weighted], axis=-1)))
    return self.answer(x)[..., 0].astype(jnp.float32)

  def __call__(self, hidden, context_mask, start_index):
    """Training form: start logits [B, S], end logits [B, S] at the gold start, answer [B]."""
    start = self.start_logits(hidden, context_mask)
    end = self.end_logits(hidden, context_mask, start_index[:, None])[:, 0]
    return start, end, self.answerable_logit(hidden, start)

  def beam(self, hidden, context_mask, beam_size: int, max_answer_length: int) -> dict:
    """Top-k starts and, for each, top-k ends (end >= start, span <= max_answer_length):
    start_score, start_index [B, K] (log-probabilities); end_score, end_index [B, K, K];
    answerable_prob [B], this window's (spans.decode reads the most confident window's)."""
    start = self.start_logits(hidden, context_mask)
    start_lp = jax.nn.log_softmax(start, axis=-1)
    k = min(beam_size, start.shape[-1])
    start_top, start_index = jax.lax.top_k(start_lp, k)
    end_lp = jax.nn.log_softmax(self.end_logits(hidden, context_mask, start_index), axis=-1)
    end_top, end_index = _top_ends(end_lp, start_index, k, max_answer_length)
    return dict(start_score=start_top, start_index=start_index, end_score=end_top,
                end_index=end_index,
                answerable_prob=jax.nn.sigmoid(self.answerable_logit(hidden, start)))


class LinearSpanHead(nn.Module):
  """BERT's SQuAD head, transformers' ElectraForQuestionAnswering: one linear layer gives every
  position a start and an end logit, independently; a window without the answer targets [CLS]
  as both. Decoding is BERT's run_squad's (and transformers' run_qa's): spans ranked by start +
  end logit over all of a question's windows; SQuAD 2.0's null score is the lowest [CLS] start +
  end logit over its windows (spans.decode)."""
  dtype: Any = jnp.float32
  head_init: str = 'normal'

  def setup(self):
    self.output = _dense(2, self.dtype, 'output', self.head_init)

  def logits(self, hidden, context_mask):
    """Start and end logits [B, S] float32; outside span_positions a large negative value."""
    both = self.output(hidden).astype(jnp.float32)
    both = jnp.where(span_positions(context_mask)[..., None], both, -1e9)
    return both[..., 0], both[..., 1]

  def __call__(self, hidden, context_mask, start_index):
    """Training form: start and end logits [B, S]; no answerability output (None)."""
    del start_index
    return (*self.logits(hidden, context_mask), None)

  def beam(self, hidden, context_mask, beam_size: int, max_answer_length: int) -> dict:
    """SpanHead.beam's starts and ends, scored by raw logits (BERT compares them across
    windows; a window's log-softmax normaliser would not cancel there); instead of an
    answerability probability, null_score [B]: [CLS]'s start + end logit."""
    start, end = self.logits(hidden, context_mask)
    k = min(beam_size, start.shape[-1])
    start_top, start_index = jax.lax.top_k(start, k)
    end_top, end_index = _top_ends(end[:, None], start_index, k, max_answer_length)
    return dict(start_score=start_top, start_index=start_index, end_score=end_top,
                end_index=end_index, null_score=start[:, 0] + end[:, 0])


class FinetuneModel(nn.Module):
  """The discriminator encoder plus one task head."""
  cfg: model_lib.ModelConfig
  head: nn.Module

  def setup(self):
    # One set of embeddings: tie='gdes' pretraining's shared ones + deltas arrive merged
    # (model.discriminator_view).
    self.electra = model_lib.Electra(dataclasses.replace(self.cfg, tie='embeddings'))

  def hidden(self, batch, deterministic: bool):
    return self.electra.discriminator_hidden(batch['input_ids'], batch['segment_ids'],
                                             batch['input_mask'], deterministic)

  def __call__(self, batch, deterministic: bool = True):
    """Classification/regression logits [B, C], tag logits [B, S, C], or the span head's
    training outputs."""
    hidden = self.hidden(batch, deterministic)
    if isinstance(self.head, (SpanHead, LinearSpanHead)):
      return self.head(hidden, batch['context_mask'], batch['start_position'])
    return self.head(hidden, batch['input_mask'], deterministic)

  def span_beam(self, batch, beam_size: int, max_answer_length: int):
    return self.head.beam(self.hidden(batch, True), batch['context_mask'], beam_size,
                          max_answer_length)
