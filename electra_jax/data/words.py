"""Where words begin and end in a vocabulary's tokens, for whole-word masking (masking.py).

A word is a token and the tokens continuing it: WordPiece's `##ing`, a sentencepiece piece
without the word-start mark `▁` (and sentencepiece's [UNK], which stands for characters inside
a word as often as for a word). Punctuation is a word of its own, as BERT's tokenizer splits
it: `truth,` and `"I` are two words each; symbols such as `°` or `£` are not punctuation there.
So is a token holding a CJK ideograph: BERT's tokenizer puts spaces around each, so Chinese is
masked character by character there; a sentencepiece model of text without spaces would
otherwise make each clause one word, longer than the masking budget, never masked.
"""
import unicodedata

import numpy as np

# A token starts a word, continues the one before it, or is a word of its own that the next
# token cannot continue (punctuation).
START, CONTINUES, ALONE = 0, 1, 2


def is_punctuation(ch: str) -> bool:
  """BERT's rule (tokenization._is_punctuation): ASCII non-alphanumeric printing characters
  and Unicode P* categories."""
  code = ord(ch)
  return (33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126
          or unicodedata.category(ch).startswith('P'))


# BERT's tokenization._is_chinese_char: the CJK Unified Ideographs blocks (not Japanese kana
# or Korean Hangul, which BERT leaves to whitespace).
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def is_cjk_ideograph(ch: str) -> bool:
  code = ord(ch)
  return any(low <= code <= high for low, high in _CJK_RANGES)


def word_kinds(pieces: list[str], continues) -> np.ndarray:
  """[len(pieces)] int8 START / CONTINUES / ALONE of each piece: ALONE where every character
  but the marks `▁` / `##` is punctuation or where one is a CJK ideograph, else CONTINUES
  where `continues(piece)`, else START."""
  def kind(piece):
    text = piece.replace('▁', '').removeprefix('##')
    if any(map(is_cjk_ideograph, text)) or (text and all(map(is_punctuation, text))):
      return ALONE
    return CONTINUES if continues(piece) else START
  return np.array([kind(piece) for piece in pieces], np.int8)


def stand_in_kinds(vocab_size: int) -> np.ndarray:
  """Word kinds for a vocabulary not read (a plan, synthetic data): every fifth id continues a
  word, about the share of `##` tokens in BERT's uncased vocabulary (19 %), so whole-word
  masking's program and work are those of a real vocabulary's."""
  kinds = np.full(vocab_size, START, np.int8)
  kinds[4::5] = CONTINUES
  return kinds
