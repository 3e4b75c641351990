"""SQuAD answers from the span head's beam: best start x end over an example's windows."""
import numpy as np


def decode_answers(features: dict, outputs: dict, examples: list[dict], max_answer_length: int,
                   squad_v2: bool, null_threshold: float = 0.5) -> dict:
  """Question id -> answer text ('' = no answer).

  Each window offers its top-k starts x top-k ends; a candidate must lie in the context with
  end >= start and at most max_answer_length tokens; its score is log p(start) +
  log p(end | start). The best candidate over all windows of an example wins. SQuAD 2.0: the
  question is unanswerable when no window's answerability probability reaches null_threshold.
  """
  best = {}  # example index -> (score, text)
  answerable = _answerable(features, outputs)
  for f in range(len(features['example_index'])):
    index = int(features['example_index'][f])
    starts = np.broadcast_to(outputs['start_index'][f][:, None], outputs['end_index'][f].shape)
    ends = outputs['end_index'][f]
    scores = outputs['start_log_prob'][f][:, None] + outputs['end_log_prob'][f]
    begin, end = features['token_begin'][f], features['token_end'][f]
    valid = ((begin[starts] >= 0) & (end[ends] >= 0) & (ends >= starts)
             & (ends - starts < max_answer_length))
    if not valid.any():
      continue
    flat = int(np.argmax(np.where(valid, scores, -np.inf)))
    score = float(scores.flat[flat])
    if index not in best or score > best[index][0]:
      s, e = int(starts.flat[flat]), int(ends.flat[flat])
      best[index] = (score, examples[index]['context'][begin[s]:end[e]])
  answers = {}
  for index, example in enumerate(examples):
    text = best.get(index, (None, ''))[1]
    if squad_v2 and answerable.get(index, 0.0) < null_threshold:
      text = ''
    answers[example['id']] = text
  return answers


def _answerable(features: dict, outputs: dict) -> dict:
  """Example index -> the highest answerability probability over its windows."""
  answerable = {}
  for f, index in enumerate(features['example_index'].tolist()):
    answerable[index] = max(answerable.get(index, 0.0), float(outputs['answerable_prob'][f]))
  return answerable


def no_answer_probabilities(features: dict, outputs: dict, examples: list[dict]) -> dict:
  """Question id -> the probability it has no answer (1 - its best window's answerability):
  the official SQuAD 2.0 script's --na-prob-file."""
  answerable = _answerable(features, outputs)
  return {e['id']: 1.0 - answerable.get(i, 0.0) for i, e in enumerate(examples)}
