"""Dynamic masking inside the jitted step, as the official ELECTRA code does it.

Each sequence gets exactly clip(round(n_real * mask_prob), 1, max_predictions) positions chosen
uniformly among its real, non-special tokens: a distinct subset, or (with_replacement, as the
official release draws them) independent draws that may repeat a position. With whole-word
masking the choice is of words instead (`mask_batch`'s `word_kinds`). Randomness is drawn
per example, from a key derived from the example's index in the global batch (`example_keys`),
so the result depends neither on how the batch is split over devices nor on
gradient-accumulation micro-batches.
"""
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from electra_jax.data import words


class MaskedBatch(NamedTuple):
  masked_ids: jax.Array        # [B, S] input with chosen positions replaced
  masked_positions: jax.Array  # [B, P] int32 positions of the chosen tokens
  masked_lm_ids: jax.Array     # [B, P] original ids at those positions
  masked_weights: jax.Array    # [B, P] float32, 1 for real predictions, 0 for padding slots
  # [B, P] float32: masked_weights without the repeats of a position drawn more than once (its
  # first slot): the slots whose value is written into the sequence.
  write_weights: jax.Array


def example_keys(rng, batch_size: int, example_ids=None):
  """One key per example: fold_in(rng, global example index); example_ids default 0..B-1."""
  if example_ids is None:
    example_ids = jnp.arange(batch_size)
  return jax.vmap(jax.random.fold_in, (None, 0))(rng, example_ids)


def mask_batch(rng, input_ids, input_mask, *, special_ids: Sequence[int], mask_id: int,
               vocab_size: int, mask_prob: float, max_predictions: int,
               mask_token_prob: float = 0.85, random_token_prob: float = 0.0,
               with_replacement: bool = False, word_kinds=None) -> MaskedBatch:
  """Chooses positions to predict and corrupts them ([MASK] / random token / keep).

  `rng` is one key (row b then uses fold_in(rng, b)) or a [B] array of per-example keys.
  `word_kinds`: None, or whole-word masking with this [vocab_size] int8 table of each token's
  place in a word (data/words.py; tokenizer.word_kinds()).
  """
  keys = rng if rng.ndim else example_keys(rng, input_ids.shape[0])
  one = functools.partial(
      _mask_example, special_ids=tuple(special_ids), mask_id=mask_id, vocab_size=vocab_size,
      mask_prob=mask_prob, max_predictions=max_predictions, mask_token_prob=mask_token_prob,
      random_token_prob=random_token_prob, with_replacement=with_replacement,
      word_kinds=word_kinds)
  return jax.vmap(one)(keys, input_ids, input_mask)


def candidate_mask(input_ids, input_mask, special_ids):
  """[..., S] bool: the real, non-special tokens (those masking may choose)."""
  chosen = input_mask.astype(bool)
  for special in special_ids:
    chosen &= input_ids != special
  return chosen


def _prediction_slots(input_ids, input_mask, special_ids, mask_prob, max_predictions):
  """(candidates [..., S], number of positions to predict [...]) of a sequence or batch."""
  input_mask = input_mask.astype(bool)
  n_real = input_mask.sum(axis=-1).astype(jnp.float32)
  num_to_predict = jnp.clip(jnp.round(n_real * mask_prob).astype(jnp.int32), 1,
                            max_predictions)
  return candidate_mask(input_ids, input_mask, special_ids), num_to_predict


def num_predictions(input_ids, input_mask, *, special_ids: Sequence[int], mask_prob: float,
                    max_predictions: int):
  """How many positions mask_batch predicts in the whole batch (no randomness needed) when it
  masks distinct tokens, not whole words."""
  candidates, num_to_predict = _prediction_slots(input_ids, input_mask, special_ids, mask_prob,
                                                 max_predictions)
  available = candidates.sum(axis=-1)
  return jnp.sum(jnp.minimum(num_to_predict, available)).astype(jnp.float32)


def _mask_example(rng, input_ids, input_mask, *, special_ids, mask_id, vocab_size, mask_prob,
                  max_predictions, mask_token_prob, random_token_prob,
                  with_replacement, word_kinds) -> MaskedBatch:
  """mask_batch for one sequence [S]."""
  select_rng, replace_rng, random_rng = jax.random.split(rng, 3)
  candidates, num_to_predict = _prediction_slots(input_ids, input_mask, special_ids, mask_prob,
                                                 max_predictions)
  used = jnp.arange(max_predictions) < num_to_predict
  if word_kinds is not None:
    chosen = whole_words(select_rng, candidates, jnp.asarray(word_kinds)[input_ids],
                         num_to_predict, max_predictions)
    # In the sequence's order; every chosen token has a slot (at most num_to_predict).
    positions = jnp.nonzero(chosen, size=max_predictions, fill_value=0)[0]
    weights = jnp.arange(max_predictions) < jnp.sum(chosen)
  elif with_replacement:
    # The official release's draw: every slot an independent uniform candidate.
    logits = jnp.where(candidates, 0.0, -jnp.inf)
    positions = jax.random.categorical(select_rng, logits, shape=(max_predictions,))
    weights = used & candidates.any()
  else:
    # A random score per candidate; the top `max_predictions` are a uniformly random subset in
    # random order, and the first `num_to_predict` of them are the ones we use.
    scores = jnp.where(candidates, jax.random.uniform(select_rng, input_ids.shape), -1.0)
    top_scores, positions = jax.lax.top_k(scores, max_predictions)
    weights = used & (top_scores >= 0.0)
  positions = jnp.where(weights, positions, 0).astype(jnp.int32)
  original = input_ids[positions]
  write = weights & ~repeats_earlier_slot(positions, weights)

  u = jax.random.uniform(replace_rng, positions.shape)
  random_ids = random_token_ids(random_rng, positions.shape, vocab_size, special_ids)
  chose_mask = u < mask_token_prob
  replacement = jnp.where(chose_mask, mask_id,
                          jnp.where(u < mask_token_prob + random_token_prob, random_ids,
                                    original))
  if with_replacement:
    # A position drawn more than once is [MASK] if any of its draws chose [MASK], as the
    # official scatter (a sum divided by the count) makes it; else its first draw's value.
    any_mask = jnp.zeros(input_ids.shape, bool).at[
        jnp.where(weights, positions, input_ids.shape[0])].max(chose_mask, mode='drop')
    replacement = jnp.where(any_mask[positions], mask_id, replacement)
  masked_ids = scatter_positions(input_ids[None], positions[None], replacement[None],
                                 write[None])[0]
  return MaskedBatch(masked_ids, positions, original.astype(jnp.int32),
                     weights.astype(jnp.float32), write.astype(jnp.float32))


def whole_words(rng, candidates, kinds, budget, max_budget: int):
  """[S] bool: the tokens of whole words chosen in random order, each taken if it still fits
  in `budget` tokens (at most the static `max_budget`) and skipped otherwise, until the budget
  is full: BERT's whole-word masking. A word is a candidate token and the candidates that
  continue it (`kinds` [S]: each token's words.START / CONTINUES / ALONE); one cut by a special
  token ends there. Word k of the sequence is drawn at jax.random.uniform(rng, [S])[k]: the
  words are taken in increasing order of their draws.

  No while loop (XLA:GPU runs one from the host, splitting the step's CUDA graph; see
  metrics.tie_bounds): the words before the first that does not fit are a cumulative sum, and
  after it each of at most `max_budget` unrolled rounds takes the next word that still fits.
  """
  seq_len = candidates.shape[0]
  previous = lambda x, fill: jnp.concatenate([jnp.full(1, fill), x[:-1]])
  continues = ((kinds == words.CONTINUES) & previous(candidates, False)
               & (previous(kinds, words.ALONE) != words.ALONE))
  starts = candidates & ~continues
  word = jnp.where(candidates, jnp.cumsum(starts) - 1, seq_len)  # seq_len: no word.
  length = jnp.zeros(seq_len, jnp.int32).at[word].add(1, mode='drop')
  # Words in random order (real words first, then the empty slots).
  order = jnp.argsort(jnp.where(length > 0, jax.random.uniform(rng, (seq_len,)), 2.0))
  ordered_length = length[order]
  taken = (jnp.cumsum(ordered_length) <= budget) & (ordered_length > 0)
  room = budget - jnp.sum(jnp.where(taken, ordered_length, 0))
  last = jnp.sum(taken)  # The first word that did not fit (or past the words).
  rank = jnp.arange(seq_len)
  # Each round takes a word of at least one token from the room left: at most `room` rounds,
  # and room <= budget <= max_budget.
  for _ in range(max_budget):
    fits = (rank > last) & (ordered_length > 0) & (ordered_length <= room)
    found, next_word = jnp.any(fits), jnp.argmax(fits)
    taken = taken | (fits & (rank == next_word))
    room = room - jnp.where(found, ordered_length[next_word], 0)
    last = jnp.where(found, next_word, seq_len)
  chosen_word = jnp.zeros(seq_len, bool).at[order].set(taken)
  return candidates & chosen_word[jnp.minimum(word, seq_len - 1)]


def repeats_earlier_slot(positions, weights):
  """[..., P] bool: the slot's position is also an earlier used slot's (draws with replacement).

  The official release writes the average of such slots' ids into the sequence (its
  scatter_update sums the updates and floor-divides by the count: for two generator samples an
  unrelated token id, a bug); writing only the first slot's value avoids that.
  """
  weights = weights.astype(bool)
  slots = jnp.arange(positions.shape[-1])
  same = positions[..., :, None] == positions[..., None, :]  # [..., P (this), P (other)]
  earlier = (slots[None, :] < slots[:, None]) & weights[..., None, :]
  return jnp.any(same & earlier, axis=-1)


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
