"""Sentencepiece vocabularies with ELECTRA's special tokens at fixed ids 0..4; the loader.

Fixed ids let the model, the masking code and exported checkpoints agree on [PAD] [CLS] [SEP]
[MASK] without reading the vocabulary; they are sentencepiece *control* symbols, so no raw text
(not even the literal string "[MASK]") can ever encode to them, and [UNK] is its unknown piece.
"""
import os
import re
import tempfile
from typing import Iterable

import numpy as np
import sentencepiece as spm

from electra_jax import atomic
from electra_jax import paths
from electra_jax.data import wordpiece
from electra_jax.data import words
from electra_jax.errors import UserError

SPECIAL_TOKENS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
# Sentencepiece skips longer training lines; paragraph-per-line prose reaches ~15 KB.
MAX_TRAINING_LINE_BYTES = 1 << 16


def train_sentencepiece(lines: Iterable[str], vocab_size: int, output_prefix: str,
                        model_type: str = 'unigram', max_sentences: int = 2_000_000,
                        num_threads: int | None = None) -> str:
  """Trains PREFIX.model/.vocab on `lines` (sources.vocabulary_lines of the corpus files, local
  or remote); returns the model path.

  Casing is kept (ELECTRA's cased setting); NFKC normalisation only folds compatibility
  characters (ligatures, full-width forms). At most `max_sentences` randomly chosen lines are
  used, so a large corpus still trains in minutes. Lines are streamed to the trainer, and the
  two files are written where PREFIX says once training is done.
  """
  if vocab_size <= len(SPECIAL_TOKENS):
    # The true minimum depends on the corpus; sentencepiece names it for sizes above this.
    raise UserError(f'vocab_size={vocab_size} is too small: it must hold the '
                    f'{len(SPECIAL_TOKENS)} special tokens plus every distinct character of the '
                    'corpus (a few dozen for English text; 8000 is usual)')
  output_prefix = paths.absolute(output_prefix)
  paths.make_dirs(paths.parent(output_prefix))
  failures = []  # What reading the lines raised: sentencepiece reports it as its own error.

  def recorded(lines):
    try:
      yield from lines
    except UserError as e:
      failures.append(e)
      raise

  lines = recorded(lines)
  with tempfile.TemporaryDirectory(prefix='electra_vocab_') as tmp:
    local_prefix = os.path.join(tmp, 'spm')
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=lines, model_prefix=local_prefix, vocab_size=vocab_size,
          model_type=model_type, character_coverage=0.9999,
          normalization_rule_name='nmt_nfkc', split_digits=True, byte_fallback=False,
          pad_id=PAD_ID, pad_piece=SPECIAL_TOKENS[PAD_ID],
          unk_id=UNK_ID, unk_piece=SPECIAL_TOKENS[UNK_ID],
          bos_id=-1, eos_id=-1, control_symbols=list(SPECIAL_TOKENS[CLS_ID:]),
          input_sentence_size=max_sentences, shuffle_input_sentence=True,
          max_sentence_length=MAX_TRAINING_LINE_BYTES,
          num_threads=num_threads or os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
      if failures:
        raise failures[0] from None
      raise _size_error(str(e), vocab_size) from None
    try:
      trained = spm.SentencePieceProcessor(model_file=local_prefix + '.model')
    except RuntimeError:  # Sentencepiece does not report its failed write (a full disk).
      raise UserError(f"sentencepiece's model in the temporary folder '{tmp}' is unreadable "
                      '(a full disk there?); free space there or set TMPDIR to a folder with '
                      'room, then re-run the same command') from None
    _check_special_ids(trained, output_prefix + '.model')
    created = []  # Removed if the model's write fails: a re-run would take them for a vocabulary.
    try:
      for suffix in ('.vocab', '.model'):  # The model last: its presence means done.
        existed = paths.exists(output_prefix + suffix)
        with open(local_prefix + suffix, 'rb') as f:
          atomic.write_bytes(output_prefix + suffix, f.read())
        if not existed:
          created.append(output_prefix + suffix)
    except BaseException:
      for path in created:
        paths.remove_file(path)
      raise
  return output_prefix + '.model'


def _size_error(text: str, vocab_size: int) -> UserError:
  """sentencepiece's refusal (a C++ source line and expression) as one line whose fix is the
  size it says the corpus allows."""
  most = re.search(r'Vocabulary size too high.*value <= (\d+)', text, re.S)
  if most:
    return UserError(f'vocab_size={vocab_size} is more than this corpus supports (at most '
                     f'{most[1]}); use {most[1]} or fewer, or more text')
  least = re.search(r'smaller than required_chars\. \d+ vs (\d+)', text)
  if least:
    return UserError(f'vocab_size={vocab_size} is less than this corpus needs (its characters '
                     f'and the special tokens: {least[1]}); use {least[1]} or more')
  return UserError(f'sentencepiece could not build a {vocab_size}-token vocabulary: '
                   f"{' '.join(text.split())}")


def _specials_as_control(model: bytes) -> bytes:
  """The model with [PAD] [CLS] [SEP] [MASK] read as control symbols where it has them at
  their ids as ordinary pieces (spm_train --user_defined_symbols=[CLS],[SEP],[MASK], a common
  BERT-style recipe): same ids, but no raw text, not even "[MASK]", encodes to them."""
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=import-outside-toplevel
  proto = sentencepiece_model_pb2.ModelProto()
  try:
    proto.ParseFromString(model)
  except Exception:  # pylint: disable=broad-except  # Not a model: the loader's error says so.
    return model
  kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
  ordinary = [i for i in (PAD_ID, CLS_ID, SEP_ID, MASK_ID) if i < len(proto.pieces)
              and proto.pieces[i].piece == SPECIAL_TOKENS[i]
              and proto.pieces[i].type in (kinds.NORMAL, kinds.USER_DEFINED)]
  if not ordinary:
    return model
  for i in ordinary:
    proto.pieces[i].type = kinds.CONTROL
    proto.pieces[i].score = 0.0
  return proto.SerializeToString()


def _check_special_ids(processor, vocab_file: str):
  pieces = tuple(processor.id_to_piece(i)
                 for i in range(min(len(SPECIAL_TOKENS), processor.get_piece_size())))
  if pieces != SPECIAL_TOKENS:
    raise UserError(f"vocab_file '{vocab_file}' has {pieces} at ids 0..4, not "
                    f'{SPECIAL_TOKENS}; build one with python -m electra_jax.data.build_vocab')
  # Ordinary special pieces were made control ones (_specials_as_control); an [UNK] that is not
  # the model's unknown piece would be real text's id, and the unknown piece's another.
  odd = [token for i, token in enumerate(SPECIAL_TOKENS)
         if not (processor.is_unknown(i) if i == UNK_ID else processor.is_control(i))]
  if odd:
    raise UserError(f"vocab_file '{vocab_file}' has {' '.join(odd)} but not as sentencepiece's "
                    'control (for [UNK]: unknown) symbols; build one with python -m '
                    'electra_jax.data.build_vocab')


class SentencePieceTokenizer:
  """Text <-> ids with a sentencepiece model whose special tokens sit at ids 0..4."""

  pad_id, unk_id, cls_id, sep_id, mask_id = PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID
  # The tokens that are never masked and never counted as text ([UNK] is real text).
  special_ids = tuple(sorted((PAD_ID, CLS_ID, SEP_ID, MASK_ID)))

  def __init__(self, model_file: str):
    self.model_file = self.vocab_file = model_file
    self.processor = spm.SentencePieceProcessor(
        model_proto=_specials_as_control(paths.read_bytes(model_file)))

  @property
  def vocab_size(self) -> int:
    return self.processor.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self.processor.encode(text)

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and each token's [begin, end) character span in `text` (SQuAD maps answers back)."""
    proto = self.processor.encode(text, return_type='proto')
    # Sentencepiece reports UTF-8 byte offsets: map them to character offsets.
    byte_to_char = np.zeros(len(text.encode('utf-8')) + 1, np.int64)
    pos = 0
    for i, ch in enumerate(text):
      n = len(ch.encode('utf-8'))
      byte_to_char[pos:pos + n] = i
      pos += n
    byte_to_char[pos] = len(text)
    return ([piece.id for piece in proto.pieces],
            [(int(byte_to_char[p.begin]), int(byte_to_char[p.end])) for p in proto.pieces])

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    """Encodes many lines at once on all cores (sentencepiece's own thread pool)."""
    return self.processor.encode(list(texts), num_threads=os.cpu_count() or 1)

  def decode(self, ids) -> str:
    return self.processor.decode([int(i) for i in ids])

  def id_to_piece(self, i: int) -> str:
    return self.processor.id_to_piece(int(i))

  def word_kinds(self) -> np.ndarray:
    """[vocab_size] int8 words.START / CONTINUES / ALONE of each id: a piece without the
    word-start mark `▁` continues a word, [UNK] too (`naïve` is `▁na [UNK] ve`)."""
    control = set(SPECIAL_TOKENS) - {SPECIAL_TOKENS[UNK_ID]}
    pieces = [self.processor.id_to_piece(i) for i in range(self.vocab_size)]
    return words.word_kinds(pieces,
                            lambda piece: not piece.startswith('▁') and piece not in control)

  def __repr__(self) -> str:
    return f'SentencePieceTokenizer({self.model_file!r}, vocab_size={self.vocab_size})'


def is_wordpiece_vocab(path: str) -> bool:
  """A BERT-style vocab.txt (by extension); anything else is a sentencepiece model."""
  return str(path).lower().endswith('.txt')


def for_config(c):
  """The tokenizer a resolved config names (vocab_file, vocab_size, do_lower_case)."""
  return load_tokenizer(c.vocab_file, c.vocab_size, c.do_lower_case)


def load_tokenizer(vocab_file: str, vocab_size: int | None = None, do_lower_case: bool = True):
  """Loads a vocabulary and checks it against the config's vocab_size (None: no check).

  `*.txt` is a BERT-style WordPiece vocab.txt (wordpiece.py; `do_lower_case=False` for a cased
  one); anything else a sentencepiece model. Both tokenizers share one interface (encode,
  encode_batch, decode, special ids).
  """
  path = paths.resolve(vocab_file)
  if not paths.is_file(path):
    state = 'is a directory' if paths.is_dir(path) else 'not found'
    raise UserError(f"vocab_file '{vocab_file}' {state}; build one with python -m "
                    'electra_jax.data.build_vocab --input=GLOB --vocab_size=N --output=PREFIX '
                    'and pass --config.vocab_file=PREFIX.model, or pass a BERT vocab.txt')
  if is_wordpiece_vocab(path):
    tokenizer = wordpiece.WordPieceTokenizer(path, do_lower_case)
  else:
    try:
      tokenizer = SentencePieceTokenizer(path)
    except (RuntimeError, OSError, TypeError) as e:
      raise UserError(f"vocab_file '{vocab_file}' is not a sentencepiece model ({e}); pass the "
                      '*.model file written by python -m electra_jax.data.build_vocab (or a '
                      'WordPiece vocab.txt)') from None
    _check_special_ids(tokenizer.processor, vocab_file)
  if vocab_size is not None and vocab_size != tokenizer.vocab_size:
    raise UserError(f"config.vocab_size={vocab_size} but vocab_file '{vocab_file}' has "
                    f'{tokenizer.vocab_size} tokens; set --config.vocab_size='
                    f'{tokenizer.vocab_size}')
  return tokenizer
