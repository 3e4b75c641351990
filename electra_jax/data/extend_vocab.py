"""New domain tokens for a WordPiece or sentencepiece vocabulary (config.extend_vocab_file).

The file has one token per line. WordPiece: a whole word (normalised as the tokenizer will see
it: lower-cased and accents stripped for an uncased vocabulary), or `##piece` for a word
continuation. Sentencepiece (unigram models): a word, added as the word-initial piece `▁word`
with the best score of the pieces it used to split into, so the model picks it whole. New ids
follow the old ones; a token already in the vocabulary is skipped. For each new token the ids
of the pieces the *old* tokenizer splits it into are kept: init_from starts its embedding row
from theirs.
"""
import dataclasses
from typing import Callable

from sentencepiece import sentencepiece_model_pb2
from tokenizers import pre_tokenizers

from electra_jax import paths
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data import wordpiece
from electra_jax.errors import UserError


@dataclasses.dataclass
class Extension:
  """The new tokens of a vocabulary and how to write the extended one."""
  tokens: list[str]          # as added, in id order after the old vocabulary
  pieces: list[list[int]]    # for each: the old ids the old tokenizer splits it into
  skipped: list[str]         # lines already in the vocabulary
  old_size: int
  content: Callable[[], bytes]  # the extended vocabulary file

  @property
  def new_size(self) -> int:
    return self.old_size + len(self.tokens)

  def summary(self, path: str) -> str:
    added = (f'added {len(self.tokens)} token(s) from {path} as ids {self.old_size}-'
             f'{self.new_size - 1}' if self.tokens else f'added no token from {path}')
    skipped = (f'; skipped {len(self.skipped)} already in the vocabulary (e.g. '
               f'{self.skipped[0]!r})' if self.skipped else '')
    return added + skipped


def read_new_tokens(path: str) -> list[str]:
  """The file's tokens, one per line (blank lines skipped, duplicates kept once)."""
  if not paths.is_file(path):
    state = 'is a directory' if paths.is_dir(path) else 'not found'
    raise UserError(f"config.extend_vocab_file='{path}' {state}; pass a text file with one "
                    'new token per line')
  try:
    lines = paths.read_text(path).splitlines()
  except UnicodeDecodeError as e:
    raise UserError(f"config.extend_vocab_file='{path}' is not UTF-8 (byte offset "
                    f'{e.start})') from None
  tokens = []
  for number, line in enumerate(lines, 1):
    token = line.strip()
    if not token:
      continue
    if len(token.split()) != 1:
      raise UserError(f"config.extend_vocab_file='{path}' line {number} ({token!r}) holds "
                      'more than one token; put one token per line')
    if token not in tokens:
      tokens.append(token)
  if not tokens:
    raise UserError(f"config.extend_vocab_file='{path}' holds no tokens; put one per line")
  return tokens


def extend_wordpiece(old_tokens: list[str], lower_case: bool, new: list[str],
                     path: str) -> Extension:
  """`new` appended to a WordPiece vocabulary (`old_tokens` by id)."""
  old = wordpiece.WordPieceTokenizer('<vocab>', lower_case, tokens=old_tokens)
  normalize, split = wordpiece.normalizer(lower_case), pre_tokenizers.BertPreTokenizer()
  known = set(old_tokens)
  added, pieces, skipped = [], [], []
  for token in new:
    prefix = '##' if token.startswith('##') and len(token) > 2 else ''
    # strip(): BERT's normaliser spaces out CJK ideographs, each a word of its own.
    word = normalize.normalize_str(token[len(prefix):]).strip()
    if not word:  # '##' and a zero-width space or lone accent: no text to embed.
      raise UserError(f"config.extend_vocab_file='{path}': {token!r} normalises to no text; "
                      'remove that line')
    # A continuation must stay in the word it continues: '##.' and '##中' start words of
    # their own.
    probe = normalize.normalize_str('a' + word).strip() if prefix else word
    if [w for w, _ in split.pre_tokenize_str(probe)] != [probe]:
      raise UserError(f"config.extend_vocab_file='{path}': {token!r} can never be a WordPiece "
                      'token (BERT splits words at punctuation, spaces and CJK characters); '
                      'list its parts')
    if len(probe) > wordpiece.MAX_CHARS_PER_WORD:
      raise UserError(f"config.extend_vocab_file='{path}': {token[:20]!r}... can never be a "
                      f'WordPiece token (a word over {wordpiece.MAX_CHARS_PER_WORD} characters '
                      'is [UNK]); shorten it')
    if prefix + word in known:
      skipped.append(token)
      continue
    known.add(prefix + word)
    added.append(prefix + word)
    pieces.append(_continuation_ids(word, old_tokens) if prefix else old.encode(word))

  def content():
    return wordpiece.vocab_bytes(old_tokens + added)

  return Extension(added, pieces, skipped, len(old_tokens), content)


def _continuation_ids(word: str, old_tokens: list[str]) -> list[int]:
  """The old ids of `word` inside a word, as WordPiece splits it there: greedy longest match
  over ## pieces only ([UNK] where none matches). old.encode(word) would split it as a word
  start: '##ness' from 'ne' '##ss', not '##ne' '##ss'."""
  ids = {token: i for i, token in enumerate(old_tokens)}  # A repeated token: its later id.
  found, start = [], 0
  while start < len(word):
    end = next((end for end in range(len(word), start, -1) if f'##{word[start:end]}' in ids),
               None)
    if end is None:
      return [ids.get('[UNK]', tokenizer_lib.UNK_ID)]  # As WordPiece reads the whole word.
    found.append(ids[f'##{word[start:end]}'])
    start = end
  return found


def extend_sentencepiece(model_file: str, new: list[str], path: str) -> Extension:
  """`new` appended to a unigram sentencepiece model as word-initial pieces."""
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(paths.read_bytes(model_file))
  if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
    raise UserError(f"vocab_file '{model_file}' is not a unigram sentencepiece model; "
                    'config.extend_vocab_file extends unigram models and WordPiece vocab.txt')
  old = tokenizer_lib.SentencePieceTokenizer(model_file)
  known = {p.piece for p in proto.pieces}
  added, pieces, skipped, scores = [], [], [], []
  for token in new:
    piece = old.processor.normalize(token)
    if not piece.startswith('▁'):
      piece = '▁' + piece
    if piece == '▁':  # A zero-width space or a lone accent: no text to embed.
      raise UserError(f"config.extend_vocab_file='{path}': {token!r} normalises to no text; "
                      'remove that line')
    # The model maps some characters (U+200B, U+FFFD, '▁' itself) to a word boundary: such a
    # piece spans two words, which a model trained to split by whitespace never has (it would
    # capture the two words' text). A model trained without that split has such pieces.
    if '▁' in piece[1:] and proto.trainer_spec.split_by_whitespace:
      raise UserError(f"config.extend_vocab_file='{path}': {token!r} can never be a "
                      f'sentencepiece token (the model reads it as {piece!r}, more than one '
                      'word); list its parts')
    if piece in known:
      skipped.append(token)
      continue
    known.add(piece)
    ids = old.encode(token)
    added.append(piece)
    pieces.append(ids)
    # At least the best score of its old pieces: higher than their sum, so the whole wins.
    scores.append(max(proto.pieces[i].score for i in ids))
  old_size = len(proto.pieces)

  def content():
    extended = sentencepiece_model_pb2.ModelProto()
    extended.CopyFrom(proto)
    for piece, score in zip(added, scores):
      extended.pieces.add(piece=piece, score=score,
                          type=sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL)
    extended.trainer_spec.vocab_size = len(extended.pieces)
    return extended.SerializeToString()

  return Extension(added, pieces, skipped, old_size, content)
