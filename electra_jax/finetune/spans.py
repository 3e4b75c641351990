"""SQuAD answers from the span head's beam: best start x end over an example's windows."""
import dataclasses
import math

import numpy as np

# SQuAD 2.0: a question is unanswerable when its answerability probability is below this: 0.5
# for the 'xlnet' head (its most confident window's); for the 'official' one the official
# release's qa_na_threshold, an is-impossible logit of -2.75 (probability sigmoid(2.75)); for
# 'bert' 0.5, BERT's null-score difference of 0 (decode).
NULL_THRESHOLDS = {'xlnet': 0.5, 'official': 1 / (1 + math.exp(-2.75)), 'bert': 0.5}


def _best_candidates(features: dict, outputs: dict, max_answer_length: int) -> dict:
  """Example index -> (score, window, start token, end token) of its best valid beam span.

  Each window offers its top-k starts x top-k ends; a candidate must lie in the context, start
  where this window is the start token's max-context one (the official decoder's rule), end >=
  start and span at most max_answer_length tokens; its score is start_score + end_score
  (log p(start) + log p(end | start), or BERT's start + end logit). The best candidate over all
  windows of an example wins.
  """
  best = {}
  for f in range(len(features['example_index'])):
    index = int(features['example_index'][f])
    starts = np.broadcast_to(outputs['start_index'][f][:, None], outputs['end_index'][f].shape)
    ends = outputs['end_index'][f]
    scores = outputs['start_score'][f][:, None] + outputs['end_score'][f]
    begin, end = features['token_begin'][f], features['token_end'][f]
    valid = ((begin[starts] >= 0) & (end[ends] >= 0) & (ends >= starts)
             & (ends - starts < max_answer_length)
             & (features['token_is_max_context'][f][starts] > 0))
    if not valid.any():
      continue
    flat = int(np.argmax(np.where(valid, scores, -np.inf)))
    score = float(scores.flat[flat])
    if index not in best or score > best[index][0]:
      best[index] = (score, f, int(starts.flat[flat]), int(ends.flat[flat]))
  return best


def _texts(best: dict, features: dict, examples: list[dict]) -> dict:
  """Question id -> its best candidate's text ('' where it has none)."""
  texts = {}
  for i, e in enumerate(examples):
    if i not in best:
      texts[e['id']] = ''
      continue
    _, f, s, t = best[i]
    texts[e['id']] = e['context'][features['token_begin'][f][s]:features['token_end'][f][t]]
  return texts


def _sigmoid(x: float) -> float:
  return 0.5 * (1.0 + math.tanh(0.5 * x))


def _answerable_probs(features: dict, outputs: dict, best: dict, num_examples: int) -> list:
  """Each question's probability that it has an answer: its most confident window's
  answerable_prob (the joint heads); or, from null_score (the 'bert' head), BERT's rule:
  sigmoid(its best candidate's score over all windows - its lowest null score over all
  windows), 0 where no window offers a valid span."""
  probs = [0.0] * num_examples
  if 'null_score' not in outputs:
    for f, index in enumerate(features['example_index'].tolist()):
      probs[index] = max(probs[index], float(outputs['answerable_prob'][f]))
    return probs
  null = [math.inf] * num_examples
  for f, index in enumerate(features['example_index'].tolist()):
    null[index] = min(null[index], float(outputs['null_score'][f]))
  for index, (score, *_) in best.items():
    probs[index] = _sigmoid(score - null[index])
  return probs


@dataclasses.dataclass
class Decoded:
  """An eval set's decoded answers: what predictions write and SQuAD's metrics read."""
  answers: dict                  # question id -> answer text ('' = no answer)
  best_spans: dict | None        # SQuAD 2.0: id -> the best span's text, however unanswerable
  no_answer: dict | None         # SQuAD 2.0: id -> the probability it has no answer


def decode(features: dict, outputs: dict, examples: list[dict], max_answer_length: int,
           squad_v2: bool, null_threshold: float = 0.5) -> Decoded:
  """Each question's best span's text (_best_candidates) as its answer ('' where no window
  offers a valid span); for SQuAD 2.0 '' where the answerable probability
  (_answerable_probs) is below null_threshold, and each question's no-answer probability (the
  official SQuAD 2.0 script's --na-prob-file)."""
  candidates = _best_candidates(features, outputs, max_answer_length)
  best = _texts(candidates, features, examples)
  if not squad_v2:
    return Decoded(answers=best, best_spans=None, no_answer=None)
  probs = _answerable_probs(features, outputs, candidates, len(examples))
  answers = {e['id']: '' if p < null_threshold else best[e['id']]
             for e, p in zip(examples, probs)}
  no_answer = {e['id']: 1.0 - p for e, p in zip(examples, probs)}
  return Decoded(answers=answers, best_spans=best, no_answer=no_answer)
