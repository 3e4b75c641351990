"""Tokenizer files of transformers directories: written on export, read by init_from and
fine-tuning.

Export writes what AutoTokenizer loads offline: a sentencepiece model becomes a fast tokenizer
(tokenizer.json, the same ids as ours; the .model file rides along as spm.model), a WordPiece
vocab.txt is copied with an ElectraTokenizerFast config. Reading takes a directory's spm.model
or vocab.txt, or the WordPiece vocabulary inside its tokenizer.json, and its lower-casing.
"""
import dataclasses
import hashlib
import os
import tempfile

from electra_jax import atomic
from electra_jax import paths
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data import wordpiece
from electra_jax.errors import UserError
from electra_jax.hf import files

# The sentencepiece model travels with an export under this name, so reading finds it again.
SPM_FILE = 'spm.model'
WORDPIECE_FILE = 'vocab.txt'
FAST_TOKENIZER_FILE = 'tokenizer.json'
TOKENIZER_CONFIG_FILE = 'tokenizer_config.json'


def _spm_fast_tokenizer(model_file: str, name: str):
  """A `tokenizers` pipeline equal to sentencepiece's for our vocabularies (`name`: the
  vocab_file as the user gave it, for errors).

  Sentencepiece's normaliser (the precompiled NFKC map, whitespace folding, the dummy '▁'
  prefix) is rebuilt from the model proto; the pieces and scores are copied. Known
  differences: where two segmentations score exactly the same (e.g. '---' as '--' '-' or
  '-' '--') the two Viterbi implementations may break the tie differently; and `tokenizers`'
  Precompiled normaliser drops a combining mark after a character it maps ('ﬁ́' -> 'fi';
  huggingface/tokenizers#2116).
  """
  # pylint: disable=import-outside-toplevel
  from sentencepiece import sentencepiece_model_pb2
  from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
  from tokenizers import processors
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(paths.read_bytes(model_file))
  pieces = [(p.piece, p.score) for p in proto.pieces]
  model_type = proto.trainer_spec.model_type
  if model_type == sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=proto.trainer_spec.unk_id,
                                         byte_fallback=proto.trainer_spec.byte_fallback))
  elif model_type == sentencepiece_model_pb2.TrainerSpec.BPE:
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    # transformers 5: extract(model class) returns that model's keyword arguments.
    kwargs = SentencePieceExtractor(model_file).extract(models.BPE)
    vocab, merges = kwargs['vocab'], kwargs['merges']
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token=proto.trainer_spec.unk_piece,
                                     fuse_unk=True,
                                     byte_fallback=proto.trainer_spec.byte_fallback))
  else:
    raise UserError(f"vocab_file '{name}' is a sentencepiece model of type {model_type}; "
                    'only unigram and bpe models export')
  if proto.trainer_spec.treat_whitespace_as_suffix:
    raise UserError(f"vocab_file '{name}' was trained with treat_whitespace_as_suffix, "
                    "which transformers' tokenizers cannot follow; export a model trained "
                    'without it')
  spec = proto.normalizer_spec
  steps = []
  if spec.precompiled_charsmap:
    steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
  if spec.remove_extra_whitespaces:
    # Only spaces are trimmed, as sentencepiece does (Strip() would drop U+0085 and the like);
    # \A and \z: onig's ^ and $ also match at every newline.
    steps += [normalizers.Replace(Regex(' {2,}'), ' '),
              normalizers.Replace(Regex(r'\A +| +\z'), '')]
  if steps:
    tokenizer.normalizer = normalizers.Sequence(steps)
  scheme = 'always' if spec.add_dummy_prefix else 'never'
  # A model trained with split_by_whitespace=false has pieces spanning words.
  tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
      replacement='▁', prepend_scheme=scheme, split=proto.trainer_spec.split_by_whitespace)
  tokenizer.decoder = decoders.Metaspace(replacement='▁', prepend_scheme=scheme)
  cls, sep = tokenizer_lib.SPECIAL_TOKENS[tokenizer_lib.CLS_ID], tokenizer_lib.SPECIAL_TOKENS[
      tokenizer_lib.SEP_ID]
  tokenizer.post_processor = processors.TemplateProcessing(
      single=f'{cls}:0 $A:0 {sep}:0', pair=f'{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1',
      special_tokens=[(cls, tokenizer_lib.CLS_ID), (sep, tokenizer_lib.SEP_ID)])
  return tokenizer


def write_tokenizer(vocab_file: str, directory: str, model_max_length: int,
                    do_lower_case: bool = True):
  """Tokenizer files AutoTokenizer loads offline: a fast tokenizer from a sentencepiece model
  (plus the model itself as spm.model), or vocab.txt with an ElectraTokenizerFast config.
  `directory` is local (transformers writes local files); `vocab_file` may be anywhere."""
  try:
    import transformers  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise UserError(f'writing tokenizer files needs transformers; {files.EXTRA_HINT}') from e
  path = paths.resolve(vocab_file)
  if not paths.is_file(path):
    raise UserError(f"vocab_file '{vocab_file}' (from the workdir's config.json) not found; "
                    'restore it or run from the directory training ran in')
  names = dict(unk_token='[UNK]', pad_token='[PAD]', cls_token='[CLS]', sep_token='[SEP]',
               mask_token='[MASK]')
  is_wordpiece = tokenizer_lib.is_wordpiece_vocab(path)
  if is_wordpiece:
    # The tokens as we read them (a line's spaces and the blank lines at the end dropped),
    # written back one a line: transformers' readers keep a line's spaces, and 'cat ' would
    # not be 'cat'.
    tokens = wordpiece.read_tokens(path)
    with open(os.path.join(directory, WORDPIECE_FILE), 'wb') as f:
      f.write(wordpiece.vocab_bytes(tokens))
    vocab = {token: i for i, token in enumerate(tokens)}  # A repeated token: its later id.
    tokenizer = transformers.ElectraTokenizerFast(vocab=vocab, do_lower_case=do_lower_case,
                                                  model_max_length=model_max_length, **names)
  else:
    local_model = os.path.join(directory, SPM_FILE)
    with open(local_model, 'wb') as f:
      f.write(paths.read_bytes(path))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_spm_fast_tokenizer(local_model, vocab_file),
        model_max_length=model_max_length,
        model_input_names=['input_ids', 'token_type_ids', 'attention_mask'], **names)
  tokenizer.save_pretrained(directory)
  # transformers 5 records its internal backend class; name the public one 4.x also loads.
  config_file = os.path.join(directory, TOKENIZER_CONFIG_FILE)
  tokenizer_config = paths.read_json(config_file)
  tokenizer_config['tokenizer_class'] = 'ElectraTokenizer' if is_wordpiece else (
      'PreTrainedTokenizerFast')
  if is_wordpiece:
    tokenizer_config['do_lower_case'] = bool(do_lower_case)
  atomic.write_json(config_file, tokenizer_config, sort_keys=True)


@dataclasses.dataclass
class Vocabulary:
  """A vocabulary as a file (spm.model, vocab.txt) or, from a tokenizer.json, WordPiece tokens."""
  file: str | None               # the spm.model or vocab.txt, if there is one
  tokens: list[str] | None       # else the WordPiece tokens by id, if any
  do_lower_case: bool            # WordPiece: lower-case and strip accents

  @property
  def wordpiece(self) -> bool:
    return self.tokens is not None or tokenizer_lib.is_wordpiece_vocab(self.file)

  def token_list(self) -> list[str]:
    """The tokens (WordPiece) or pieces (sentencepiece) by id."""
    if self.tokens is not None:
      return self.tokens
    path = paths.resolve(self.file)
    if self.wordpiece:
      return wordpiece.read_tokens(path)
    tokenizer = tokenizer_lib.SentencePieceTokenizer(path)
    return [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]

  def readable_file(self) -> str | None:
    """The file, or tokenizer.json's tokens as a vocab.txt (written once per content in the
    temp folder: tokenizers load files), or None without either."""
    if self.tokens is None:
      return self.file
    content = wordpiece.vocab_bytes(self.tokens)
    folder = os.path.join(tempfile.gettempdir(),
                          f'electra_jax-vocab-{hashlib.sha256(content).hexdigest()[:16]}')
    path = os.path.join(folder, WORDPIECE_FILE)
    if not os.path.exists(path):
      os.makedirs(folder, exist_ok=True)
      atomic.write_bytes(path, content)
    return path


def _do_lower_case(directory, fast: dict | None) -> bool:
  """tokenizer_config.json's do_lower_case, else tokenizer.json's normaliser, else True (BERT's
  default); accent stripping must follow it, as it does in BERT's tokenizer."""
  config_file = directory / TOKENIZER_CONFIG_FILE
  tokenizer_config = paths.read_json(config_file) if config_file.exists() else {}
  normalizer = (fast or {}).get('normalizer') or {}
  lower = tokenizer_config.get('do_lower_case', normalizer.get('lowercase', True))
  strip = tokenizer_config.get('strip_accents', normalizer.get('strip_accents'))
  if strip is not None and bool(strip) != bool(lower):
    raise UserError(f"'{directory}' sets strip_accents={strip} with do_lower_case={lower}; our "
                    'WordPiece tokenizer strips accents exactly when it lower-cases')
  chinese = tokenizer_config.get('tokenize_chinese_chars',
                                 normalizer.get('handle_chinese_chars', True))
  if chinese is False:
    raise UserError(f"'{directory}' sets tokenize_chinese_chars=False; our WordPiece tokenizer "
                    "splits off every CJK ideograph, as BERT's does, so its ids would differ")
  return bool(lower)


def read_vocabulary(directory) -> Vocabulary:
  """The vocabulary of a transformers directory: spm.model, vocab.txt or tokenizer.json (file
  and tokens both None when it has none of them)."""
  directory = paths.get(directory)
  fast_file = directory / FAST_TOKENIZER_FILE
  fast = paths.read_json(fast_file) if fast_file.exists() else None
  lower = _do_lower_case(directory, fast)
  for name in (SPM_FILE, WORDPIECE_FILE):
    if (directory / name).exists():
      return Vocabulary(file=str(directory / name), tokens=None, do_lower_case=lower)
  model = (fast or {}).get('model') or {}
  if model.get('type') == 'WordPiece':
    by_id = sorted(model['vocab'].items(), key=lambda item: item[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
      raise UserError(f"'{fast_file}' has gaps in its WordPiece ids; pass "
                      '--config.vocab_file=VOCAB.txt')
    return Vocabulary(file=None, tokens=[token for token, _ in by_id], do_lower_case=lower)
  return Vocabulary(file=None, tokens=None, do_lower_case=lower)


def missing_vocabulary_error(directory) -> UserError:
  return UserError(f"'{directory}' has no {SPM_FILE}, {WORDPIECE_FILE} or WordPiece "
                   f'{FAST_TOKENIZER_FILE}; pass its vocabulary as --config.vocab_file=FILE')
