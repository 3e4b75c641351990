"""SQuAD answers from the span head's beam: best start x end over an example's windows."""
import dataclasses
import math

import numpy as np

# SQuAD 2.0: a question is unanswerable when its most confident window's answerability
# probability is below this: 0.5 for the 'xlnet' head; for the 'official' one the official
# release's qa_na_threshold, an is-impossible logit of -2.75 (probability sigmoid(2.75)); for
# 'bert' 0.5: the best span outscores [CLS] (its "logit" is their difference).
NULL_THRESHOLDS = {'xlnet': 0.5, 'official': 1 / (1 + math.exp(-2.75)), 'bert': 0.5}


def best_spans(features: dict, outputs: dict, examples: list[dict],
               max_answer_length: int) -> dict:
  """Question id -> the best span's text, whatever the answerability ('' only where no window
  offers a valid span).

  Each window offers its top-k starts x top-k ends; a candidate must lie in the context, start
  where this window is the start token's max-context one (the official decoder's rule), end >=
  start and span at most max_answer_length tokens; its score is log p(start) +
  log p(end | start). The best candidate over all windows of an example wins.
  """
  best = {}  # example index -> (score, text)
  for f in range(len(features['example_index'])):
    index = int(features['example_index'][f])
    starts = np.broadcast_to(outputs['start_index'][f][:, None], outputs['end_index'][f].shape)
    ends = outputs['end_index'][f]
    scores = outputs['start_log_prob'][f][:, None] + outputs['end_log_prob'][f]
    begin, end = features['token_begin'][f], features['token_end'][f]
    valid = ((begin[starts] >= 0) & (end[ends] >= 0) & (ends >= starts)
             & (ends - starts < max_answer_length)
             & (features['token_is_max_context'][f][starts] > 0))
    if not valid.any():
      continue
    flat = int(np.argmax(np.where(valid, scores, -np.inf)))
    score = float(scores.flat[flat])
    if index not in best or score > best[index][0]:
      s, e = int(starts.flat[flat]), int(ends.flat[flat])
      best[index] = (score, examples[index]['context'][begin[s]:end[e]])
  return {e['id']: best.get(i, (None, ''))[1] for i, e in enumerate(examples)}


@dataclasses.dataclass
class Decoded:
  """An eval set's decoded answers: what predictions write and SQuAD's metrics read."""
  answers: dict                  # question id -> answer text ('' = no answer)
  best_spans: dict | None        # SQuAD 2.0: id -> best_spans' text, however unanswerable
  no_answer: dict | None         # SQuAD 2.0: id -> the probability it has no answer


def decode(features: dict, outputs: dict, examples: list[dict], max_answer_length: int,
           squad_v2: bool, null_threshold: float = 0.5) -> Decoded:
  """best_spans as the answers; for SQuAD 2.0 '' where no window's answerability probability
  reaches null_threshold, and each question's no-answer probability (1 - its most confident
  window's answerability: the official SQuAD 2.0 script's --na-prob-file)."""
  best = best_spans(features, outputs, examples, max_answer_length)
  if not squad_v2:
    return Decoded(answers=best, best_spans=None, no_answer=None)
  answerable = {}  # example index -> the highest answerability probability over its windows
  for f, index in enumerate(features['example_index'].tolist()):
    answerable[index] = max(answerable.get(index, 0.0), float(outputs['answerable_prob'][f]))
  answers, no_answer = {}, {}
  for i, e in enumerate(examples):
    p = answerable.get(i, 0.0)
    answers[e['id']] = '' if p < null_threshold else best[e['id']]
    no_answer[e['id']] = 1.0 - p
  return Decoded(answers=answers, best_spans=best, no_answer=no_answer)
