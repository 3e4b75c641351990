"""Where words begin and end in a vocabulary's tokens, for whole-word masking (masking.py).

A word is a token and the tokens continuing it: WordPiece's `##ing`, a sentencepiece piece
without the word-start mark `▁`. Punctuation is a word of its own, as BERT's tokenizer splits
it: `truth,` and `"I` are two words each.
"""
import unicodedata

import numpy as np

# A token starts a word, continues the one before it, or is a word of its own that the next
# token cannot continue (punctuation).
START, CONTINUES, ALONE = 0, 1, 2


def word_kinds(pieces: list[str], continues) -> np.ndarray:
  """[len(pieces)] int8 START / CONTINUES / ALONE of each piece: ALONE where every character
  but the marks `▁` / `##` is a punctuation mark or symbol, else CONTINUES where
  `continues(piece)`, else START."""
  def kind(piece):
    text = piece.replace('▁', '').removeprefix('##')
    if text and all(unicodedata.category(ch)[0] in 'PS' for ch in text):
      return ALONE
    return CONTINUES if continues(piece) else START
  return np.array([kind(piece) for piece in pieces], np.int8)
