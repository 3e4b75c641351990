"""Each fine-tuning metric against a value computed by hand."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from electra_jax.finetune import loop
from electra_jax.finetune import metrics


def test_accuracy_and_f1_on_a_hand_counted_example():
  labels = [1, 1, 0, 0, 1, 0]
  preds = [1, 0, 0, 1, 1, 0]
  # tp=2, fp=1, fn=1 -> precision 2/3, recall 2/3, F1 2/3; 4 of 6 correct.
  assert metrics.accuracy(labels, preds) == pytest.approx(4 / 6)
  assert metrics.binary_f1(labels, preds) == pytest.approx(2 / 3)
  assert metrics.binary_f1([0, 0], [0, 0]) == 0.0


def test_matthews_correlation_matches_the_formula():
  labels = [1, 1, 1, 0, 0, 0, 0, 1]
  preds = [1, 1, 0, 0, 0, 1, 0, 1]
  tp, tn, fp, fn = 3, 3, 1, 1
  expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  assert metrics.matthews_corrcoef(labels, preds) == pytest.approx(expected)  # 0.5
  assert metrics.matthews_corrcoef(labels, labels) == pytest.approx(1.0)
  assert metrics.matthews_corrcoef(labels, [1 - p for p in labels]) == pytest.approx(-1.0)
  assert metrics.matthews_corrcoef(labels, [1] * 8) == 0.0  # undefined -> 0, as GLUE


def test_pearson_and_spearman():
  x = [1.0, 2.0, 3.0, 4.0]
  assert metrics.pearson(x, [2.0, 4.0, 6.0, 8.0]) == pytest.approx(1.0)
  # Monotone but not linear: Spearman 1, Pearson below 1.
  y = [1.0, 8.0, 27.0, 64.0]
  assert metrics.spearman(x, y) == pytest.approx(1.0)
  xm, ym = np.mean(x), np.mean(y)
  r = sum((a - xm) * (b - ym) for a, b in zip(x, y)) / math.sqrt(
      sum((a - xm) ** 2 for a in x) * sum((b - ym) ** 2 for b in y))
  assert metrics.pearson(x, y) == pytest.approx(r)
  # Ranks [1,2,3,4] vs [2,1,4,3]: d^2 sum = 4 -> 1 - 6*4 / (4*15) = 0.6.
  assert metrics.spearman(x, [2.0, 1.0, 4.0, 3.0]) == pytest.approx(0.6)
  out = metrics.regression_metrics(x, [2.0, 1.0, 4.0, 3.0])
  assert out['corr'] == pytest.approx((out['pearson'] + out['spearman']) / 2)
  assert out['mse'] == pytest.approx(1.0)
  # A collapsed model's constant float64 predictions whose np.std rounds to 1e-16, not 0:
  # undefined, so 0.0 (no signal) as for an exactly zero std, never NaN.
  constant = [0.8132702392002724] * 3
  assert np.std(constant) > 0
  assert metrics.regression_metrics([0.2, 0.5, 0.9], constant)['corr'] == 0.0
  assert metrics.pearson(constant, x[:3]) == metrics.spearman(constant, x[:3]) == 0.0


def test_squad_normalisation_exact_match_and_f1():
  assert metrics.normalize_answer('The  Cat, sat!') == 'cat sat'
  assert metrics.exact_match('the Eiffel Tower.', 'Eiffel tower') == 1.0
  # pred tokens [eiffel, tower, paris], gold [eiffel, tower]: P 2/3, R 1 -> F1 0.8.
  assert metrics.token_f1('Eiffel Tower, Paris', 'the Eiffel Tower') == pytest.approx(0.8)
  # [eiffel, tower, in, paris] ('in' is no article): P 1/2, R 1 -> F1 2/3.
  assert metrics.token_f1('Eiffel Tower in Paris', 'the Eiffel Tower') == pytest.approx(2 / 3)
  assert metrics.token_f1('', '') == 1.0 and metrics.token_f1('x', '') == 0.0
  assert metrics.token_f1('', '', squad_v2=False) == 0.0  # 1.1: no shared token.
  scores = metrics.squad_metrics(
      {'q1': 'Eiffel Tower in Paris', 'q2': 'blue'},
      {'q1': ['the Eiffel Tower', 'Eiffel Tower in Paris'], 'q2': ['red']})
  # q1 best gold matches exactly, q2 wrong.
  assert scores['exact_match'] == pytest.approx(50.0) and scores['f1'] == pytest.approx(50.0)


def test_squad_v1_scores_answers_that_normalise_to_nothing_as_its_official_script_does():
  """evaluate-v1.1 keeps every gold answer ('The' too) and gives F1 0 where no token is
  shared, '' against 'The' included; only 2.0 drops such golds and matches blank with blank."""
  gold = {'q1': ['The'], 'q2': ['The', 'Denver']}
  answers = {'q1': '', 'q2': 'the'}
  # The official 1.1 script gives exact_match 100 (both normalise to '') and f1 0 for each.
  assert metrics.squad_metrics(answers, gold) == dict(exact_match=100.0, f1=0.0)
  # 2.0: q1 scored against '' (EM 1, F1 1); q2 against 'Denver' alone (0, 0).
  v2 = metrics.squad_metrics(answers, gold, best_spans=answers, no_answer_probs={'q1': 0.0,
                                                                               'q2': 0.0})
  assert (v2['exact_match'], v2['f1']) == (50.0, 50.0)


def test_squad_v2_breakdown_and_the_official_threshold_search():
  # q5's only answer normalises to nothing: answerable, as the official script counts it (it
  # has an answer), and scored against '' (so a blank answer is right).
  gold = {'q1': ['Paris'], 'q2': [], 'q3': ['blue sky'], 'q4': [], 'q5': ['!']}
  spans = {'q1': 'Paris', 'q2': 'London', 'q3': 'blue', 'q4': 'x', 'q5': 'y'}
  no_answer = {'q1': 0.1, 'q2': 0.9, 'q3': 0.4, 'q4': 0.45, 'q5': 0.8}
  answers = {q: '' if no_answer[q] > 0.5 else spans[q] for q in spans}
  scores = metrics.squad_metrics(answers, gold, spans, no_answer)
  # Answered q1 (right), q3 ('blue' of 'blue sky': F1 2/3), q4 (wrong); q2, q5 blank (right).
  assert scores['exact_match'] == pytest.approx(60.0)
  assert scores['f1'] == pytest.approx(100 * (3 + 2 / 3) / 5)
  assert scores['has_answer_exact_match'] == pytest.approx(200 / 3)  # q1, q3, q5
  assert scores['has_answer_f1'] == pytest.approx(100 * (2 + 2 / 3) / 3)
  assert scores['no_answer_exact_match'] == scores['no_answer_f1'] == pytest.approx(50.0)
  # All blank scores the 2 unanswerable; answering in no-answer-probability order: q1 +1 (3),
  # q3 +0 EM / +2/3 F1, q4 -1, q5 +0 ('y' against ''), q2 -1. EM peaks at q1, F1 at q3.
  assert (scores['best_exact_match'], scores['best_exact_match_threshold']) == (
      pytest.approx(60.0), 0.1)
  assert (scores['best_f1'], scores['best_f1_threshold']) == (
      pytest.approx(100 * (3 + 2 / 3) / 5), 0.4)
  # Only unanswerable questions: no answerable group to score (0.0 would read as all wrong),
  # as the official script leaves out HasAns_*.
  only_none = metrics.squad_metrics({'q2': '', 'q4': 'x'}, {'q2': [], 'q4': []},
                                    {'q2': 'London', 'q4': 'x'}, {'q2': 0.9, 'q4': 0.45})
  assert not any(k.startswith('has_answer') for k in only_none)
  assert only_none['no_answer_exact_match'] == pytest.approx(50.0)


def test_the_median_over_seeds_counts_a_diverged_seed_as_its_worst():
  """np.median of scores with a NaN is NaN: one diverged seed of three hid the other two."""
  nan = math.nan
  assert metrics.seed_median([0.7, nan, 0.6]) == 0.6
  assert metrics.seed_median([0.7, nan, 0.6], lower_is_better=True) == 0.7  # a loss
  assert metrics.seed_median([0.7, 0.6, 0.9, nan]) == pytest.approx(0.65)
  assert metrics.seed_median([0.7, 0.6]) == pytest.approx(0.65)
  assert all(math.isnan(metrics.seed_median(v)) for v in ([nan, 0.6], [nan, nan, 0.6], [nan]))


def test_the_seed_range_puts_a_diverged_seed_at_its_worst_end_in_any_seed_order():
  """min and max of floats holding a NaN depend on the order: the same seeds gave 0.61–0.65 or
  nan–nan in compare's table."""
  nan = math.nan
  for seeds in ([0.61, nan, 0.65], [nan, 0.61, 0.65], [0.65, 0.61, nan]):
    low, high = metrics.seed_range(seeds)
    assert math.isnan(low) and high == 0.65
    low, high = metrics.seed_range(seeds, lower_is_better=True)  # a loss: NaN its highest
    assert low == 0.61 and math.isnan(high)
  assert metrics.seed_range([0.65, 0.61]) == (0.61, 0.65)
  assert all(math.isnan(x) for x in metrics.seed_range([nan, nan]))


def test_the_summary_ranks_a_diverged_seed_last_on_every_metric():
  nan = math.nan
  scores = [(0.8, 0.3, 0.2), (nan, nan, nan), (0.6, 0.5, 0.4)]  # (accuracy, loss, mse) per seed
  runs = [dict(seed=i, best=dict(eval_accuracy=a, eval_loss=l, eval_test_mse=m),
               final=dict(eval_accuracy=a, eval_loss=l, eval_test_mse=m))
          for i, (a, l, m) in enumerate(scores)]
  summary = loop.summarize(SimpleNamespace(main_metric='accuracy'), runs)
  assert summary['median_best_accuracy'] == summary['median_final_accuracy'] == 0.6
  assert summary['median_best_loss'] == summary['median_final_loss'] == 0.5
  assert summary['median_best_test_mse'] == 0.4  # Lower is better: NaN counts as the highest.
  assert summary['best_accuracy_per_seed'][1] != summary['best_accuracy_per_seed'][1]  # NaN kept
