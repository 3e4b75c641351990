"""Whole-word masking (config.whole_word_masking): words, not tokens, are chosen; each in
random order is taken whole while it fits the sequence's budget, as BERT's whole-word masking
does."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import experiment
from electra_jax import masking
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data import wordpiece
from electra_jax.data import words
from electra_jax.errors import UserError
from electra_jax.objectives import metrics
from tests.conftest import tiny_config
from tests.test_model_objective import assert_micro_batches_sum_to_the_whole, toy_batch
from tests.test_objectives import build

S, C, A = words.START, words.CONTINUES, words.ALONE


def word_spans(candidates, kinds):
  """The words of one sequence written out with a loop: lists of positions."""
  spans = []
  for t, (candidate, kind) in enumerate(zip(candidates, kinds)):
    if not candidate:
      continue
    joins = (kind == C and t > 0 and candidates[t - 1] and kinds[t - 1] != A)
    if joins:
      spans[-1].append(t)
    else:
      spans.append([t])
  return spans


def chosen_by_hand(rng, candidates, kinds, budget):
  """BERT's loop: the words (word_spans) in increasing order of their draws (word k's is
  uniform(rng, [S])[k]), each taken if it fits what is left of the budget."""
  draws = np.asarray(jax.random.uniform(rng, (len(candidates),)))
  spans = word_spans(candidates, kinds)
  chosen, total = np.zeros(len(candidates), bool), 0
  for k in sorted(range(len(spans)), key=lambda k: draws[k]):
    if total + len(spans[k]) <= budget:
      chosen[spans[k]] = True
      total += len(spans[k])
  return chosen


def test_wordpiece_and_sentencepiece_word_kinds(tmp_path):
  vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'play', '##ing', ',', '##,', '"', 'x',
           '°', '##°', '£']
  (tmp_path / 'vocab.txt').write_text('\n'.join(vocab) + '\n', encoding='utf-8')
  kinds = wordpiece.WordPieceTokenizer(str(tmp_path / 'vocab.txt')).word_kinds()
  # BERT splits punctuation off words, not symbols (`5°c` is one word there).
  assert kinds.tolist() == [S, S, S, S, S, S, C, A, A, A, S, S, C, S]

  spm = tokenizer_lib.load_tokenizer('data/demo_spm.model')
  kinds = spm.word_kinds()
  assert kinds.shape == (spm.vocab_size,) and kinds.dtype == np.int8
  of = lambda text: [(spm.id_to_piece(i), int(kinds[i])) for i in spm.encode(text)]
  assert of('truth, "wife" Bennet\'s') == [
      ('▁truth', S), (',', A), ('▁"', A), ('w', C), ('if', C), ('e', C), ('"', A),
      ('▁Bennet', S), ("'", A), ('s', C)]
  assert all(kinds[i] == S for i in spm.special_ids)
  # [UNK] stands for characters inside words too: `naïve` is one word.
  assert of('naïve') == [('▁na', S), ('[UNK]', C), ('ve', C)]


def test_cjk_ideographs_are_words_of_their_own():
  # As BERT's tokenizer puts spaces around each ideograph; a sentencepiece piece of several
  # (text without spaces) is one word, and the next piece starts another; kana are not split.
  pieces = ['▁中国', '人', 'abc', '▁the', '##中', '(', 'の', 'は', '𠀀x']
  kinds = words.word_kinds(pieces, lambda piece: not piece.startswith('▁'))
  assert kinds.tolist() == [A, A, C, S, A, A, C, C, A]
  assert words.is_cjk_ideograph('中') and not words.is_cjk_ideograph('の')
  assert word_spans(np.ones(len(pieces), bool), kinds) == [[0], [1], [2], [3], [4], [5],
                                                             [6, 7], [8]]


def test_words_are_segmented_at_starts_punctuation_and_special_tokens():
  candidates = np.array([0, 1, 1, 1, 0, 1, 1, 1, 1, 1], bool)  # 0 and 4: [CLS], [SEP]
  kinds = np.array([S, S, C, C, S, C, A, C, S, C], np.int8)
  # A continuation after [SEP] or after punctuation starts a word of its own.
  assert word_spans(candidates, kinds) == [[1, 2, 3], [5], [6], [7], [8, 9]]
  for seed in range(20):
    chosen = np.asarray(masking.whole_words(jax.random.key(seed), jnp.asarray(candidates),
                                            jnp.asarray(kinds), 3, 3))
    for span in word_spans(candidates, kinds):
      assert len(set(chosen[span])) == 1, (seed, chosen)


def test_choice_is_berts_loop_over_words_in_random_order():
  """Exactly the words BERT's loop takes, over random sequences (special tokens, punctuation,
  long words, budgets a sequence cannot fill) and per-row budgets under one static bound."""
  rng = np.random.default_rng(7)
  rows, seq_len = 96, 24
  candidates = rng.random((rows, seq_len)) < 0.85
  kinds = rng.choice([S, C, C, C, C, A], (rows, seq_len)).astype(np.int8)
  budgets = rng.integers(1, 9, rows).astype(np.int32)
  keys = jax.random.split(jax.random.key(3), rows)
  chosen = np.asarray(jax.jit(jax.vmap(masking.whole_words, (0, 0, 0, 0, None)),
                              static_argnums=4)(keys, candidates, kinds, budgets, 8))
  for b in range(rows):
    np.testing.assert_array_equal(
        chosen[b], chosen_by_hand(keys[b], candidates[b], kinds[b], budgets[b]), err_msg=b)
  # Rows that could not fill their budget are among them (words too long for the rest).
  assert (chosen.sum(1) < np.minimum(budgets, candidates.sum(1))).any()


@pytest.mark.parametrize('budget', [1, 4, 9])
def test_choice_is_whole_words_within_budget_and_greedy(budget):
  """Every word is chosen whole or not at all, the total fits the budget, and every word left
  out is longer than the room left (the skip-and-continue rule); all words get chosen."""
  rng = np.random.default_rng(budget)
  ever_chosen = set()
  for seed in range(60):
    candidates = rng.random(40) < 0.9
    kinds = rng.choice([S, C, C, A], 40).astype(np.int8)
    chosen = np.asarray(jax.jit(masking.whole_words, static_argnums=(3, 4))(
        jax.random.key(seed), jnp.asarray(candidates), jnp.asarray(kinds), budget, budget))
    assert not np.any(chosen & ~candidates)
    total = int(chosen.sum())
    assert total <= budget
    for span in word_spans(candidates, kinds):
      taken = chosen[span]
      assert taken.all() or not taken.any(), (seed, span, chosen)
      if not taken.any():
        assert len(span) > budget - total, (seed, span, total)
      else:
        ever_chosen.add(len(span))
  assert min(ever_chosen) == 1 and (budget == 1 or max(ever_chosen) > 1)


def test_batch_masking_marks_every_token_of_the_chosen_words():
  c = config_lib.resolve(tiny_config(whole_word_masking=True, max_predictions_per_seq=6))
  batch = toy_batch(c)
  ids = np.asarray(batch['input_ids'])
  kinds = np.random.default_rng(0).choice([S, C, A], c.vocab_size).astype(np.int8)
  m = masking.mask_batch(jax.random.key(0), batch['input_ids'], batch['input_mask'],
                         special_ids=(0, 2, 3, 4), mask_id=4, vocab_size=c.vocab_size,
                         mask_prob=c.mask_prob, max_predictions=6, word_kinds=kinds)
  candidates = np.asarray(masking.candidate_mask(batch['input_ids'], batch['input_mask'],
                                                 (0, 2, 3, 4)))
  for b in range(ids.shape[0]):
    w = np.asarray(m.masked_weights[b]).astype(bool)
    positions = np.asarray(m.masked_positions[b])[w]
    assert len(set(positions)) == len(positions)  # distinct positions
    np.testing.assert_array_equal(np.asarray(m.masked_lm_ids[b])[w], ids[b, positions])
    chosen = np.zeros(ids.shape[1], bool)
    chosen[positions] = True
    spans = word_spans(candidates[b], kinds[ids[b]])
    assert any(chosen[s].all() for s in spans)
    for span in spans:
      assert chosen[span].all() or not chosen[span].any()
    assert len(positions) <= min(max(round(np.asarray(batch['input_mask'][b]).sum()
                                           * c.mask_prob), 1), 6)


def test_micro_batches_share_the_whole_batchs_masks_and_denominator():
  """The masked count depends on the draw: grad accumulation's denominator is the whole
  batch's count under the step's key, so micro-batch gradients still sum to the whole's."""
  c, _, params, obj = build(whole_word_masking=True, num_layers=1, vocab_size=32)
  kinds = np.full(32, C, np.int8)
  kinds[5:10] = S  # Words of about five tokens: some do not fit the budget.
  obj = obj.__class__.from_config(obj.model, c, (0, 2, 3, 4), 4, kinds)
  batch, rng = toy_batch(c), jax.random.key(5)
  denominators = obj.loss_denominators(batch, rng)
  whole_step = obj.masked_step(params, batch, rng, deterministic=True)
  assert float(denominators['mlm_count']) == float(jnp.sum(whole_step.masked.masked_weights))
  # Fewer than token masking's count.
  token_count = build(num_layers=1, vocab_size=32, abstract=True)[3].loss_denominators(batch,
                                                                                       rng)
  assert float(denominators['mlm_count']) < float(token_count['mlm_count'])
  assert_micro_batches_sum_to_the_whole(obj, params, batch, rng)


def test_masked_fraction_reports_the_predictions_made():
  """Token masking: round(n · mask_prob) a sequence; whole words fill less of the budget."""
  c, _, params, token_obj = build(num_layers=1, vocab_size=32)
  batch, rng = toy_batch(c), jax.random.key(5)
  real = float(jnp.sum(batch['input_mask']))
  want = float(token_obj.loss_denominators(batch, rng)['mlm_count']) / real
  fraction = lambda obj: metrics.summarize(jax.device_get(obj(params, batch, rng)[1]), 1.0,
                                           50.0)['masked_fraction']
  assert fraction(token_obj) == pytest.approx(want)
  assert 0.12 < want < 0.18
  c = config_lib.resolve(tiny_config(whole_word_masking=True, num_layers=1, vocab_size=32))
  kinds = np.full(32, C, np.int8)
  kinds[5:10] = S
  word_obj = token_obj.__class__.from_config(token_obj.model, c, (0, 2, 3, 4), 4, kinds)
  assert fraction(word_obj) == pytest.approx(
      float(word_obj.loss_denominators(batch, rng)['mlm_count']) / real)
  assert fraction(word_obj) < want


def test_experiment_reads_the_vocabularys_words_only_when_asked():
  on = experiment.Experiment.create(_demo(whole_word_masking=True))
  kinds = tokenizer_lib.for_config(on.config).word_kinds()
  assert np.array_equal(np.frombuffer(on.objective.word_kinds, np.int8), kinds)
  assert experiment.Experiment.create(_demo()).objective.word_kinds is None
  planned = experiment.Experiment.create(_demo(whole_word_masking=True), read_vocab=False)
  np.testing.assert_array_equal(np.frombuffer(planned.objective.word_kinds, np.int8),
                                words.stand_in_kinds(planned.config.vocab_size))


def _demo(**overrides):
  from configs import demo  # pylint: disable=import-outside-toplevel
  c = demo.get_config()
  c.update(overrides)
  return c


def test_whole_words_cannot_be_drawn_with_replacement():
  with pytest.raises(UserError, match='mask_with_replacement=False'):
    config_lib.resolve(tiny_config(whole_word_masking=True, mask_with_replacement=True))
