"""BERT/ELECTRA WordPiece vocabularies (vocab.txt, one token per line, id = line number).

Tokenizes exactly as BERT's tokenizer does: clean control characters, put spaces around CJK
characters, lower-case and strip accents (NFD; uncased vocabularies, the default, or
`lower_case=False` for cased ones), split on whitespace and punctuation, then
greedy longest-match WordPiece with `##` continuations; a word longer than 100 characters or
with no match becomes [UNK]. The work runs in the Rust `tokenizers` library. Special ids are
wherever vocab.txt puts them (the released BERT vocab: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102,
[MASK] 103), and the literal text "[MASK]" still tokenizes as "[", "mask", "]".
"""

import io

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from electra_jax import paths
from electra_jax.data import words
from electra_jax.errors import UserError

SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
# Longer words are [UNK]: transformers' limit (the official TF tokenizer's is 200), so a
# released model sees here what transformers feeds it.
MAX_CHARS_PER_WORD = 100


def read_tokens(vocab_file: str) -> list[str]:
  """The tokens of a vocab.txt by id (its 0-based line number), as BERT's load_vocab reads it."""
  try:
    # Line breaks as BERT's load_vocab reads them (text mode: \n, \r\n and \r).
    text = io.TextIOWrapper(io.BytesIO(paths.read_bytes(vocab_file)), encoding='utf-8')
    tokens = [line.strip() for line in text]
  except UnicodeDecodeError as e:
    raise UserError(f"vocab_file '{vocab_file}' is not UTF-8 (byte offset {e.start}); pass a "
                    'BERT-style vocab.txt with one token per line') from None
  while tokens and not tokens[-1]:
    tokens.pop()  # A trailing newline is not a token.
  return tokens


def vocab_bytes(tokens: list[str]) -> bytes:
  """A vocab.txt of `tokens` (read_tokens' inverse): one token a line, '\n' line ends."""
  return ''.join(f'{token}\n' for token in tokens).encode('utf-8')


def _token_ids(tokens: list[str], vocab_file: str) -> dict[str, int]:
  # A token on two lines takes the later id, as BERT's load_vocab, transformers and
  # tokenizers do: released vocabularies with repeated lines exist.
  vocab = {token: i for i, token in enumerate(tokens)}
  missing = [t for t in SPECIAL_TOKENS if t not in vocab]
  if missing:
    raise UserError(f"vocab_file '{vocab_file}' lacks {missing}; a WordPiece vocab.txt needs "
                    f'all of {list(SPECIAL_TOKENS)}')
  return vocab


# A capital sigma ending a word lower-cases to the final form ς in BERT's tokenizer (Python's
# str.lower: after a cased letter, not before one, case-ignorable characters such as ', . and
# combining accents skipped on both sides); the Rust normalizer lower-cases character by
# character, to σ. BERT lower-cases after its clean-up (control characters and U+FFFD gone),
# so the rule reads the cleaned text.
_CLEAN = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False,
                                    strip_accents=False, lowercase=False)
# Python's rule reads the nearest character that is not case-ignorable (some, as U+0345 and
# modifier letters, are cased too).
_NOT_IGNORABLE_CASED = r'[\p{Cased}&&[^\p{Case_Ignorable}]]'
_FINAL_SIGMA = normalizers.Replace(Regex(
    rf'(?<={_NOT_IGNORABLE_CASED}\p{{Case_Ignorable}}*)Σ'
    rf'(?!\p{{Case_Ignorable}}*{_NOT_IGNORABLE_CASED})'), 'ς')


def normalizer(lower_case: bool) -> normalizers.Normalizer:
  """BERT's text clean-up; uncased vocabularies also lower-case and strip accents."""
  bert = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                    strip_accents=lower_case, lowercase=lower_case)
  return normalizers.Sequence([_CLEAN, _FINAL_SIGMA, bert]) if lower_case else bert


class WordPieceTokenizer:
  """Text <-> ids with a BERT vocab.txt; same interface as SentencePieceTokenizer.

  `tokens`: the vocabulary by id, instead of reading `vocab_file` (e.g. before it is written).
  """

  def __init__(self, vocab_file: str, lower_case: bool = True, tokens: list[str] | None = None):
    self.vocab_file = self.model_file = vocab_file
    self.lower_case = lower_case
    tokens = read_tokens(vocab_file) if tokens is None else tokens
    vocab = _token_ids(tokens, vocab_file)
    self._size = len(tokens)  # One embedding row a line, repeated or not.
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        vocab[t] for t in SPECIAL_TOKENS)
    # The tokens that are never masked and never counted as text ([UNK] is real text).
    self.special_ids = tuple(sorted({self.pad_id, self.cls_id, self.sep_id, self.mask_id}))
    self._id_to_token = dict(enumerate(tokens))
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token='[UNK]',
                                           max_input_chars_per_word=MAX_CHARS_PER_WORD))
    tokenizer.normalizer = normalizer(lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix='##')
    self._tokenizer = tokenizer

  @property
  def vocab_size(self) -> int:
    return self._size

  def encode(self, text: str) -> list[int]:
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and each token's [begin, end) character span in `text` (the original text, before
    lower-casing and accent stripping)."""
    encoding = self._tokenizer.encode(text, add_special_tokens=False)
    return encoding.ids, [tuple(o) for o in encoding.offsets]

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    """Encodes many lines at once on all cores (the Rust library's thread pool)."""
    return [e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids) -> str:
    return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

  def id_to_piece(self, i: int) -> str:
    return self._id_to_token.get(int(i), '[UNK]')

  def word_kinds(self):
    """[vocab_size] int8 words.START / CONTINUES / ALONE of each id: `##` tokens continue a
    word."""
    pieces = [self.id_to_piece(i) for i in range(self.vocab_size)]
    return words.word_kinds(pieces, lambda piece: piece.startswith('##'))

  def __repr__(self) -> str:
    cased = '' if self.lower_case else ', cased'
    return f'WordPieceTokenizer({self.vocab_file!r}, vocab_size={self.vocab_size}{cased})'
