"""Task metrics as GLUE and SQuAD define them, in numpy/scipy (no sklearn).

CoLA: Matthews correlation; STS-B: Pearson and Spearman; MRPC, QQP: F1 (positive class 1) and
accuracy; other classification tasks: accuracy. SQuAD: exact match and token F1 after the
official answer normalisation (lowercase, strip punctuation, articles and extra whitespace),
each prediction scored against its best-matching gold answer. Tagging: word accuracy, and for
span tags chunk precision / recall / F1 as CoNLL's conlleval counts them.
"""
import collections
import math
import re
import string

import numpy as np


def _stats():
  """scipy.stats, imported on first use: 1 s of every finetune start, for STS-B alone."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  return stats


def accuracy(labels, predictions) -> float:
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  return float(np.mean(labels == predictions)) if labels.size else 0.0


def binary_f1(labels, predictions, positive=1) -> float:
  """F1 of the positive class (GLUE's MRPC/QQP F1); 0 when nothing is predicted or present."""
  labels, predictions = np.asarray(labels) == positive, np.asarray(predictions) == positive
  tp = np.sum(labels & predictions)
  denom = np.sum(labels) + np.sum(predictions)
  return float(2 * tp / denom) if denom else 0.0


def matthews_corrcoef(labels, predictions) -> float:
  """Binary MCC = (tp·tn − fp·fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)); 0 if undefined."""
  y, p = np.asarray(labels).astype(bool), np.asarray(predictions).astype(bool)
  tp, tn = float(np.sum(y & p)), float(np.sum(~y & ~p))
  fp, fn = float(np.sum(~y & p)), float(np.sum(y & ~p))
  denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
  return float((tp * tn - fp * fn) / denom) if denom else 0.0


def _tag_parts(tag: str) -> tuple[str, str]:
  """(prefix, type) of a span tag: 'B-PER' -> ('B', 'PER'), 'O' -> ('O', ''); BILOU's L/U read
  as E/S."""
  if tag == 'O':
    return 'O', ''
  return {'L': 'E', 'U': 'S'}.get(tag[0], tag[0]), tag[2:]


def tag_spans(tags: list[str]) -> set[tuple[int, int, str]]:
  """The chunks (start, end exclusive, type) of a tag sequence, by conlleval's rules, so IOB1,
  IOB2 and BIOES all read: a chunk starts at B or S, or at I or E after O, E, S or another
  type; it ends after E or S, or before B, S, O or another type."""
  chunks, start = set(), None
  prev_prefix, prev_type = 'O', ''
  for i, tag in enumerate(list(tags) + ['O']):
    prefix, kind = _tag_parts(tag)
    ends = prev_prefix in ('E', 'S') or (prev_prefix in ('B', 'I') and (
        prefix in ('B', 'S', 'O') or kind != prev_type))
    if start is not None and ends:
      chunks.add((start, i, prev_type))
      start = None
    if prefix in ('B', 'S') or (prefix in ('I', 'E') and (
        prev_prefix in ('E', 'S', 'O') or kind != prev_type)):
      start = i
    prev_prefix, prev_type = prefix, kind
  return chunks


def tagging_metrics(gold: list[list[str]], predicted: list[list[str]], spans: bool) -> dict:
  """Word accuracy over every sentence; with spans, chunk precision, recall and F1 (a chunk
  counts where its start, end and type all match; 0 where there is nothing to divide by)."""
  result = dict(accuracy=accuracy([t for s in gold for t in s], [t for s in predicted for t in s]))
  if spans:
    found = [(tag_spans(g), tag_spans(p)) for g, p in zip(gold, predicted)]
    correct = sum(len(g & p) for g, p in found)
    n_gold, n_predicted = sum(len(g) for g, _ in found), sum(len(p) for _, p in found)
    precision = correct / n_predicted if n_predicted else 0.0
    recall = correct / n_gold if n_gold else 0.0
    result.update(precision=precision, recall=recall,
                  f1=2 * precision * recall / (precision + recall) if correct else 0.0)
  return result


def _correlation(test, x, y) -> float:
  """scipy's `test` coefficient, 0.0 (no signal) where it is undefined: under two values or a
  constant side (a collapsed model), which scipy makes NaN. Constancy is tested directly:
  np.std of equal float64 values can round to 1e-16, not 0."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
    return 0.0
  return float(test(x, y)[0])


def pearson(x, y) -> float:
  return _correlation(_stats().pearsonr, x, y)


def spearman(x, y) -> float:
  return _correlation(_stats().spearmanr, x, y)


def classification_metrics(labels, predictions, metric_names) -> dict:
  """The named metrics among 'accuracy', 'f1', 'mcc' for class-id labels and predictions."""
  fns = {'accuracy': accuracy, 'f1': binary_f1, 'mcc': matthews_corrcoef}
  return {name: fns[name](labels, predictions) for name in metric_names}


def regression_metrics(targets, predictions) -> dict:
  """Pearson and Spearman correlation, and their mean (GLUE's STS-B score)."""
  p, s = pearson(targets, predictions), spearman(targets, predictions)
  mse = float(np.mean((np.asarray(targets) - np.asarray(predictions)) ** 2))
  return dict(pearson=p, spearman=s, corr=(p + s) / 2, mse=mse)


# --- SQuAD (the official evaluate-v1.1 / v2.0 normalisation) -------------------------------

_ARTICLES = re.compile(r'\b(a|an|the)\b', re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
  """Lowercase, remove punctuation, articles (a/an/the) and extra whitespace."""
  text = ''.join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  return ' '.join(_ARTICLES.sub(' ', text).split())


def exact_match(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, squad_v2: bool = True) -> float:
  """SQuAD 2.0: no answer ('', or text that normalises to nothing) matches only no answer, F1 1.
  1.1's script has no such rule: no shared token, F1 0."""
  pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if not pred_tokens or not gold_tokens:
    return float(squad_v2 and pred_tokens == gold_tokens)
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_tokens), same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def _question_scores(predictions: dict, gold_answers: dict,
                     squad_v2: bool) -> tuple[dict, dict]:
  """(id -> EM, id -> F1) of each question against its best-matching gold answer. SQuAD 2.0
  drops gold answers that normalise to nothing first (none left, or none given: the question is
  unanswerable, ''); 1.1's script scores against every gold answer as given."""
  em, f1 = {}, {}
  for qid, golds in gold_answers.items():
    golds = [g for g in golds if normalize_answer(g) or not squad_v2] or ['']
    prediction = predictions.get(qid, '')
    em[qid] = max(exact_match(prediction, g) for g in golds)
    f1[qid] = max(token_f1(prediction, g, squad_v2) for g in golds)
  return em, f1


def _mean_percent(scores: dict, ids) -> float:
  ids = list(ids)
  return 100.0 * sum(scores[q] for q in ids) / len(ids) if ids else 0.0


def _best_threshold(scores: dict, best_spans: dict, no_answer_probs: dict,
                    has_answer: dict) -> tuple[float, float]:
  """The official SQuAD 2.0 script's find_best_thresh: the score (percent) and no-answer
  probability threshold that maximise it when every question whose probability exceeds the
  threshold is answered ''."""
  current = best = sum(1 for q in has_answer if not has_answer[q])
  threshold = 0.0
  for qid in sorted(no_answer_probs, key=no_answer_probs.get):
    if qid not in scores:
      continue
    if has_answer[qid]:
      current += scores[qid]
    else:
      current += -1 if best_spans[qid] else 0
    if current > best:
      best, threshold = current, no_answer_probs[qid]
  return 100.0 * best / max(len(scores), 1), threshold


def squad_metrics(predictions: dict, gold_answers: dict, best_spans: dict | None = None,
                  no_answer_probs: dict | None = None) -> dict:
  """EM and F1 in percent, as the official SQuAD 1.1 script scores them. predictions: id ->
  text; gold_answers: id -> list of answer texts.

  SQuAD 2.0 (best_spans: id -> the best non-empty span; no_answer_probs: id -> probability of
  no answer): as the 2.0 script scores them ('' = no answer; an empty list of gold answers =
  unanswerable, scored against ''), with its breakdown over answerable and unanswerable
  questions (a group without questions left out) and its threshold search (best_exact_match /
  best_f1 and their thresholds)."""
  squad_v2 = best_spans is not None
  em, f1 = _question_scores(predictions, gold_answers, squad_v2)
  result = dict(exact_match=_mean_percent(em, em), f1=_mean_percent(f1, f1))
  if not squad_v2:
    return result
  # As the official script: a question with any gold answer is answerable (even one, say
  # 'The', that normalises to nothing and so is scored against '').
  has_answer = {q: bool(golds) for q, golds in gold_answers.items()}
  for name, wanted in (('has_answer', True), ('no_answer', False)):
    ids = [q for q in gold_answers if has_answer[q] == wanted]
    if not ids:  # As the official script: no group, no score (0.0 would read as all wrong).
      continue
    result[f'{name}_exact_match'] = _mean_percent(em, ids)
    result[f'{name}_f1'] = _mean_percent(f1, ids)
  raw_em, raw_f1 = _question_scores(best_spans, gold_answers, squad_v2)
  for name, raw in (('exact_match', raw_em), ('f1', raw_f1)):
    score, threshold = _best_threshold(raw, best_spans, no_answer_probs, has_answer)
    result[f'best_{name}'], result[f'best_{name}_threshold'] = score, threshold
  return result


def ranked(value: float) -> float:
  """A main metric as best-epoch and best-seed selection compare it: NaN (a diverged
  regression's Spearman) below every number, where `>` would never let a later epoch replace
  it."""
  return -math.inf if math.isnan(value) else value


# Metrics where lower is better (by name ending), the rest higher: e.g. eval_loss, eval_test_mse.
LOWER_IS_BETTER = ('loss', 'mse')


def seed_median(values: list[float], lower_is_better: bool = False) -> float:
  """The median over seeds with a diverged seed's NaN counted as its worst score (a loss's
  highest, any other metric's lowest, as `ranked` orders it), as a median over runs counts a
  run that failed: one diverged seed of three moves the median rather than making it NaN. NaN
  when the middle holds a diverged seed."""
  median = float(np.median(_diverged_as_worst(values, lower_is_better)))
  return math.nan if math.isinf(median) else median


def seed_range(values: list[float], lower_is_better: bool = False) -> tuple[float, float]:
  """The lowest and highest seed score with a diverged seed's NaN at the worst end, as
  seed_median counts it: the same whatever the seeds' order (min and max of floats with a NaN
  are not)."""
  ordered = sorted(_diverged_as_worst(values, lower_is_better))
  return tuple(math.nan if math.isinf(v) else v for v in (ordered[0], ordered[-1]))


def _diverged_as_worst(values: list[float], lower_is_better: bool) -> list[float]:
  worst = math.inf if lower_is_better else -math.inf
  return [worst if math.isnan(v) else v for v in values]
