"""Dynamic masking inside the jitted step, as the official ELECTRA code does it.

Each sequence gets exactly clip(round(n_real * mask_prob), 1, max_predictions) positions chosen
uniformly among its real, non-special tokens. Randomness is drawn for the global batch, so the
result does not depend on how the batch is split over devices.
"""
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp


class MaskedBatch(NamedTuple):
  masked_ids: jax.Array        # [B, S] input with chosen positions replaced
  masked_positions: jax.Array  # [B, P] int32 positions of the chosen tokens
  masked_lm_ids: jax.Array     # [B, P] original ids at those positions
  masked_weights: jax.Array    # [B, P] float32, 1 for real predictions, 0 for padding slots


def mask_batch(rng, input_ids, input_mask, *, special_ids: Sequence[int], mask_id: int,
               vocab_size: int, mask_prob: float, max_predictions: int,
               mask_token_prob: float = 0.85, random_token_prob: float = 0.0) -> MaskedBatch:
  """Chooses positions to predict and corrupts them ([MASK] / random token / keep)."""
  select_rng, replace_rng, random_rng = jax.random.split(rng, 3)
  input_mask = input_mask.astype(bool)
  candidates = input_mask
  for special in special_ids:
    candidates &= input_ids != special

  n_real = input_mask.sum(axis=-1).astype(jnp.float32)
  num_to_predict = jnp.clip(jnp.round(n_real * mask_prob).astype(jnp.int32), 1,
                            max_predictions)
  # A random score per candidate; the top `max_predictions` are a uniformly random subset in
  # random order, and the first `num_to_predict` of them are the ones we use.
  scores = jnp.where(candidates, jax.random.uniform(select_rng, input_ids.shape), -1.0)
  top_scores, positions = jax.lax.top_k(scores, max_predictions)
  slot = jnp.arange(max_predictions)[None, :]
  weights = (slot < num_to_predict[:, None]) & (top_scores >= 0.0)
  positions = jnp.where(weights, positions, 0).astype(jnp.int32)
  original = jnp.take_along_axis(input_ids, positions, axis=-1)

  u = jax.random.uniform(replace_rng, positions.shape)
  random_ids = random_token_ids(random_rng, positions.shape, vocab_size, special_ids)
  replacement = jnp.where(u < mask_token_prob, mask_id,
                          jnp.where(u < mask_token_prob + random_token_prob, random_ids,
                                    original))
  masked_ids = scatter_positions(input_ids, positions, replacement, weights)
  return MaskedBatch(masked_ids, positions, original.astype(jnp.int32),
                     weights.astype(jnp.float32))


def random_token_ids(rng, shape, vocab_size: int, special_ids: Sequence[int]):
  """Uniform ids over the vocabulary minus the special tokens, wherever those sit.

  Draws from [0, vocab_size - k) and steps over each special id in ascending order, so a
  WordPiece vocab with [CLS] at 101 or a special token at the end is handled too.
  """
  specials = sorted(set(int(s) for s in special_ids))
  ids = jax.random.randint(rng, shape, 0, vocab_size - len(specials), dtype=jnp.int32)
  for special in specials:
    ids = ids + (ids >= special).astype(jnp.int32)
  return ids


def scatter_positions(ids, positions, values, weights):
  """Writes values[b, p] to ids[b, positions[b, p]] where weights[b, p] is set."""
  # Unused slots get an out-of-range index and are dropped, so they can never overwrite a
  # real replacement that shares their (placeholder) position.
  seq_len = ids.shape[-1]
  positions = jnp.where(weights.astype(bool), positions, seq_len)
  batch_index = jnp.arange(ids.shape[0])[:, None]
  return ids.at[batch_index, positions].set(values.astype(ids.dtype), mode='drop')
