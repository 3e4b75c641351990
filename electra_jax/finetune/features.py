"""Examples -> fixed-length model inputs: [CLS] A [SEP] (B [SEP]) ids, segments and masks.

Pairs are truncated longest-first, as in BERT/ELECTRA. SQuAD contexts longer than the window
are split into overlapping windows (stride `doc_stride` tokens); each window keeps the
character span of every context token so a predicted token span maps back to the text. Tagged
sentences longer than the window are split the same way.
"""
import unicodedata

import numpy as np


def _truncate_pair(a: list, b: list, max_tokens: int):
  """BERT's and ELECTRA's _truncate_seq_pair: the longer loses its last token, B on a tie."""
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()


def _pack(tokenizer, a: list, b: list | None, max_seq_length: int):
  ids = [tokenizer.cls_id] + a + [tokenizer.sep_id]
  segments = [0] * len(ids)
  if b is not None:
    ids += b + [tokenizer.sep_id]
    segments += [1] * (len(b) + 1)
  pad = max_seq_length - len(ids)
  return (ids + [tokenizer.pad_id] * pad, segments + [0] * pad,
          [1] * (max_seq_length - pad) + [0] * pad)


def encode_classification(tokenizer, examples: list[dict], max_seq_length: int,
                          regression: bool) -> dict:
  """Arrays input_ids, segment_ids, input_mask [N, S] and label [N] (int32 or float32)."""
  ids_a = tokenizer.encode_batch([e['text_a'] for e in examples])
  pairs = [e['text_b'] is not None for e in examples]
  ids_b = tokenizer.encode_batch([e['text_b'] or '' for e in examples])
  input_ids, segment_ids, input_mask = [], [], []
  for a, b, pair in zip(ids_a, ids_b, pairs):
    a, b = list(a), list(b) if pair else None
    if pair:
      _truncate_pair(a, b, max_seq_length - 3)
    else:
      del a[max_seq_length - 2:]
    ids, segments, mask = _pack(tokenizer, a, b, max_seq_length)
    input_ids.append(ids)
    segment_ids.append(segments)
    input_mask.append(mask)
  # An unlabelled example (a test split) gets label 0: predictions never read it.
  labels = np.asarray([0 if e['label'] is None else e['label'] for e in examples],
                      np.float32 if regression else np.int32)
  return dict(input_ids=np.asarray(input_ids, np.int32).reshape(-1, max_seq_length),
              segment_ids=np.asarray(segment_ids, np.int32).reshape(-1, max_seq_length),
              input_mask=np.asarray(input_mask, np.int32).reshape(-1, max_seq_length),
              label=labels)


def _invisible(ch: str) -> bool:
  """Whitespace, control and format characters (a zero-width space, a soft hyphen)."""
  return ch.isspace() or unicodedata.category(ch) in ('Cc', 'Cf')


def _char_spans(tokenizer, text: str):
  """Token ids and each token's [begin, end) character span: without the invisible characters
  it starts with (sentencepiece gives a zero-width space to the next word), and with the
  characters the normaliser deleted after it (a decomposed accent, a soft hyphen: up to the
  next token or space), so an answer 'café' written with a combining accent keeps it, as the
  official code's answer (the whole original word) does."""
  ids, offsets = tokenizer.encode_with_offsets(text)
  begins = []
  for begin, end in offsets:
    while begin < end and _invisible(text[begin]):
      begin += 1
    begins.append(begin)
  spans = []
  for k, (begin, (_, end)) in enumerate(zip(begins, offsets)):
    stop = begins[k + 1] if k + 1 < len(begins) else len(text)
    while end < stop and not text[end].isspace():
      end += 1
    spans.append((begin, end))
  return ids, spans


def _windows(num_tokens: int, max_context: int, doc_stride: int) -> list[range]:
  """The context token ranges of an example's windows: every doc_stride tokens until one
  reaches the end. A window without room for context would never advance: an error."""
  if max_context < 1:
    raise ValueError(f'a window holds {max_context} context tokens; it needs at least one '
                     '(max_seq_length must exceed max_query_length + 3)')
  windows, start = [], 0
  while True:
    windows.append(range(start, min(start + max_context, num_tokens)))
    if windows[-1].stop >= num_tokens:
      return windows
    start += min(doc_stride, max_context)


def _max_context_window(windows: list[range], num_tokens: int) -> list[int]:
  """For each context token, the window where it has the most context on its shorter side
  (min(left, right) + 0.01 * window length; the first on a tie): the official code's
  _check_is_max_context, so a span starting near a window's edge is read where it is central."""
  best = [-1] * num_tokens
  best_score = [-1.0] * num_tokens
  for w, window in enumerate(windows):
    for t in window:
      score = min(t - window.start, window.stop - 1 - t) + 0.01 * len(window)
      if score > best_score[t]:
        best[t], best_score[t] = w, score
  return best


def encode_squad(tokenizer, examples: list[dict], max_seq_length: int, doc_stride: int,
                 max_query_length: int) -> dict:
  """Windows over each context. Arrays: input_ids, segment_ids, input_mask, context_mask,
  start_position, end_position, answerable [F] (this window holds the answer),
  question_answerable [F] (the question has one), example_index [F], token_begin/token_end [F, S]
  (character spans of context tokens, -1 elsewhere), token_is_max_context [F, S] (1 where this
  window is the token's max-context one). Answers outside a window point at [CLS]."""
  out = {k: [] for k in ('input_ids', 'segment_ids', 'input_mask', 'context_mask',
                         'start_position', 'end_position', 'answerable', 'question_answerable',
                         'example_index', 'token_begin', 'token_end', 'token_is_max_context')}
  for index, example in enumerate(examples):
    query = tokenizer.encode(example['question'])[:max_query_length]
    context_ids, spans = _char_spans(tokenizer, example['context'])
    answer = None
    if example['answers']:
      text, start_char = example['answers'][0]
      answer = (start_char, start_char + len(text))
    windows = _windows(len(context_ids), max_seq_length - len(query) - 3, doc_stride)
    home = _max_context_window(windows, len(context_ids))
    for w, window in enumerate(windows):
      ids = ([tokenizer.cls_id] + query + [tokenizer.sep_id] + [context_ids[t] for t in window]
             + [tokenizer.sep_id])
      offset = len(query) + 2
      n = len(ids)
      pad = max_seq_length - n
      begin = np.full(max_seq_length, -1, np.int32)
      end = np.full(max_seq_length, -1, np.int32)
      max_context = np.zeros(max_seq_length, np.int32)
      for j, t in enumerate(window):
        begin[offset + j], end[offset + j] = spans[t]
        max_context[offset + j] = home[t] == w
      start_pos = end_pos = 0
      if answer is not None:
        inside = [offset + j for j, t in enumerate(window)
                  if spans[t][1] > answer[0] and spans[t][0] < answer[1]]
        if inside and spans[window[0]][0] <= answer[0] and spans[window[-1]][1] >= answer[1]:
          start_pos, end_pos = inside[0], inside[-1]
      out['input_ids'].append(ids + [tokenizer.pad_id] * pad)
      out['segment_ids'].append([0] * offset + [1] * (n - offset) + [0] * pad)
      out['input_mask'].append([1] * n + [0] * pad)
      out['context_mask'].append([0] * offset + [1] * len(window) + [0] * (pad + 1))
      out['start_position'].append(start_pos)
      out['end_position'].append(end_pos)
      out['answerable'].append(int(start_pos > 0))
      out['question_answerable'].append(int(answer is not None))
      out['example_index'].append(index)
      out['token_begin'].append(begin)
      out['token_end'].append(end)
      out['token_is_max_context'].append(max_context)
  return {k: np.asarray(v, np.int32) for k, v in out.items()}


def encode_tagging(tokenizer, examples: list[dict], max_seq_length: int, doc_stride: int,
                   segment_id: int = 0) -> dict:
  """[CLS] word pieces [SEP], each word tokenized alone (as the official tagging code and
  transformers' is_split_into_words do) and tagged at its first piece. A sentence of more
  pieces than the window holds is split into windows every doc_stride pieces, as SQuAD's
  contexts are (the official code cuts it): every window trains on the words whose first piece
  it holds, and a word's tag is read from the window where that piece has the most context.
  Arrays [R, S] (R windows): input_ids, segment_ids, input_mask, word_start (1 at each word's
  first piece), label (the word's tag id there, 0 elsewhere), word_index (that word's index in
  its sentence, -1 elsewhere), word_is_max_context (1 where the tag is read); example_index
  [R]. Real tokens get segment `segment_id` (the official tagging code feeds 1), padding 0."""
  budget = max_seq_length - 2
  pieces = tokenizer.encode_batch([w for e in examples for w in e['words']])
  out = {k: [] for k in ('input_ids', 'segment_ids', 'input_mask', 'label', 'word_index',
                         'word_is_max_context', 'example_index')}
  k = 0
  for index, example in enumerate(examples):
    # The sentence's pieces, and for each the index of the word it starts (-1: a later piece).
    flat, first_of = [], []
    for j in range(len(example['words'])):
      word = list(pieces[k + j]) or [tokenizer.unk_id]  # A word sentencepiece drops entirely.
      flat += word
      first_of += [j] + [-1] * (len(word) - 1)
    k += len(example['words'])
    windows = _windows(len(flat), budget, doc_stride)
    home = _max_context_window(windows, len(flat))
    for w, window in enumerate(windows):
      words = [first_of[t] for t in window]
      tags = [0 if j < 0 or example['label'] is None else example['label'][j] for j in words]
      pad = max_seq_length - len(window) - 2
      out['input_ids'].append([tokenizer.cls_id] + [flat[t] for t in window] + [tokenizer.sep_id]
                              + [tokenizer.pad_id] * pad)
      out['segment_ids'].append([segment_id] * (len(window) + 2) + [0] * pad)
      out['input_mask'].append([1] * (len(window) + 2) + [0] * pad)
      out['label'].append([0] + tags + [0] * (pad + 1))
      out['word_index'].append([-1] + words + [-1] * (pad + 1))
      out['word_is_max_context'].append(
          [0] + [int(j >= 0 and home[t] == w) for j, t in zip(words, window)] + [0] * (pad + 1))
      out['example_index'].append(index)
  arrays = {k: np.asarray(v, np.int32).reshape(-1, max_seq_length) if k != 'example_index'
            else np.asarray(v, np.int32) for k, v in out.items()}
  return dict(arrays, word_start=(arrays['word_index'] >= 0).astype(np.int32))
