import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import masking

PAD, CLS, SEP, MASK = 0, 2, 3, 4
SPECIAL = (PAD, CLS, SEP, MASK)
VOCAB = 50


def random_batch(seed, batch=64, seq=48):
  """[CLS] A [SEP] B [SEP] + padding with random real lengths and stray [MASK]s in the text."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (batch, seq)).astype(np.int32)
  mask = np.zeros_like(ids)
  for b in range(batch):
    n = rng.integers(4, seq + 1)
    mid = rng.integers(2, n - 1)
    ids[b, 0], ids[b, mid], ids[b, n - 1] = CLS, SEP, SEP
    ids[b, n:] = PAD
    mask[b, :n] = 1
  ids[rng.random(ids.shape) < 0.02] = MASK
  ids[mask == 0] = PAD
  return jnp.asarray(ids), jnp.asarray(mask)


def run(seed, ids, mask, **kw):
  args = dict(special_ids=SPECIAL, mask_id=MASK, vocab_size=VOCAB, mask_prob=0.15,
              max_predictions=8)
  args.update(kw)
  return jax.device_get(masking.mask_batch(jax.random.key(seed), ids, mask, **args))


@pytest.mark.parametrize('seed', range(3))
def test_special_tokens_and_padding_are_never_chosen(seed):
  ids, mask = random_batch(seed)
  m = run(seed, ids, mask)
  chosen = np.take_along_axis(np.asarray(ids), m.masked_positions, 1)[m.masked_weights > 0]
  assert not np.isin(chosen, SPECIAL).any()
  real = np.take_along_axis(np.asarray(mask), m.masked_positions, 1)[m.masked_weights > 0]
  assert real.all()


def test_exactly_round_n_real_times_p_positions_capped_and_distinct():
  ids, mask = random_batch(7)
  m = run(1, ids, mask)
  n_real = np.asarray(mask).sum(1)
  candidates = (np.asarray(mask) > 0) & ~np.isin(np.asarray(ids), SPECIAL)
  expected = np.minimum(np.clip(np.round(n_real * 0.15), 1, 8), candidates.sum(1))
  np.testing.assert_array_equal(m.masked_weights.sum(1), expected)
  for b in range(ids.shape[0]):
    used = m.masked_positions[b][m.masked_weights[b] > 0]
    assert len(set(used.tolist())) == len(used)


def test_masked_lm_ids_are_the_original_tokens_and_only_chosen_positions_change():
  ids, mask = random_batch(3)
  m = run(5, ids, mask, mask_token_prob=1.0)
  ids = np.asarray(ids)
  np.testing.assert_array_equal(np.take_along_axis(ids, m.masked_positions, 1) *
                                (m.masked_weights > 0), m.masked_lm_ids * (m.masked_weights > 0))
  changed = m.masked_ids != ids
  for b in range(ids.shape[0]):
    used = set(m.masked_positions[b][m.masked_weights[b] > 0].tolist())
    assert set(np.nonzero(changed[b])[0].tolist()) <= used
    assert all(m.masked_ids[b, p] == MASK for p in used)


@pytest.mark.parametrize('mask_p,random_p', [(0.85, 0.0), (0.8, 0.1)])
def test_replacement_split_matches_configured_probabilities(mask_p, random_p):
  ids, mask = random_batch(11, batch=512, seq=64)
  m = run(2, ids, mask, mask_token_prob=mask_p, random_token_prob=random_p, max_predictions=10)
  w = m.masked_weights > 0
  new = np.take_along_axis(m.masked_ids, m.masked_positions, 1)[w]
  orig = m.masked_lm_ids[w]
  frac_mask = np.mean(new == MASK)
  frac_keep = np.mean(new == orig)
  assert abs(frac_mask - mask_p) < 0.03
  # A random draw can hit the original token (1 / 45 chance), which then reads as "kept".
  assert abs(frac_keep - (1 - mask_p - random_p) - random_p / 45) < 0.03
  assert not np.isin(new[(new != MASK)], SPECIAL).any()


def test_selection_is_uniform_over_candidate_positions():
  ids = np.full((4000, 12), 7, np.int32)
  ids[:, 0], ids[:, -1] = CLS, SEP
  mask = np.ones_like(ids)
  m = run(0, jnp.asarray(ids), jnp.asarray(mask), mask_prob=0.2, max_predictions=3)
  counts = np.bincount(m.masked_positions[m.masked_weights > 0], minlength=12)
  assert counts[0] == 0 and counts[-1] == 0
  inner = counts[1:-1]
  # 2 per row (round(12 * 0.2)) over 10 candidates: 800 expected per position.
  assert inner.sum() == 8000
  assert np.all(np.abs(inner - 800) < 5 * np.sqrt(800))


def test_masking_depends_only_on_rng_and_data():
  ids, mask = random_batch(1)
  a, b = run(9, ids, mask), run(9, ids, mask)
  np.testing.assert_array_equal(a.masked_ids, b.masked_ids)
  c = run(10, ids, mask)
  assert not np.array_equal(a.masked_positions, c.masked_positions)
