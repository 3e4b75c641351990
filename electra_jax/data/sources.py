"""Corpus files: plain text (documents split by blank lines), or records (a document each).

Plain text is the format of the official ELECTRA/BERT release: one sentence or paragraph per
line. Records come as JSON Lines (`.jsonl`, `.ndjson`, `.json`: C4, the Pile, `datasets`'
`to_json`), each line an object, Parquet (`.parquet`: the Hugging Face Hub's datasets) or
Arrow (`.arrow`: `datasets`' save_to_disk and cache); a record's `text_key` field holds one
document, split into lines on newlines (as a TFDS record is). Files are streamed (a corpus
never has to fit in memory); text and JSON Lines compressed with gzip (`.gz`) or Zstandard
(`.zst`) are read transparently. Bad files fail with the file name and byte offset, line or
row instead of a stack trace deep inside a decoder.
"""
import contextlib
import dataclasses
import gzip
import io
import json
import re
import zlib
from typing import Callable, Collection, Iterable, Iterator, NamedTuple

from absl import logging

from electra_jax import paths
from electra_jax.errors import UserError, first_line


def list_files(pattern: str) -> list[str]:
  """Sorted, de-duplicated files matching one or more comma-separated globs (each must match)."""
  files, parts = [], [part for part in (pattern or '').split(',') if part.strip()]
  if len(parts) > 1 and paths.glob(pattern):  # One file whose name holds a comma.
    parts = [pattern]
  for part in parts or ['']:
    matched = paths.glob(part) if part else []
    if not matched:  # Also one of several: a typo would silently leave its files out.
      named = f"'{pattern}'" if len(parts) < 2 else f"'{part.strip()}' (of '{pattern}')"
      if part and not set('*?[') & set(part) and paths.is_dir(paths.resolve(part.strip())):
        folder = part.strip().rstrip('/')
        raise UserError(f"{named} is a directory; pass a glob of its files, e.g. "
                        f"'{folder}/*.txt', or '{folder}/**/*.txt' to include subdirectories")
      raise UserError(f'no files match {named}; fix the glob (relative paths are tried from '
                      'the current directory, then the repository root)')
    files.extend(matched)
  return sorted(set(files))


COMPRESSED_SUFFIXES = ('.gz', '.zst')


def _uncompressed_name(path: str) -> str:
  lower = path.lower()
  return next((lower.removesuffix(s) for s in COMPRESSED_SUFFIXES if lower.endswith(s)), lower)


@contextlib.contextmanager
def _open_binary(path: str):
  """The decompressed bytes of `path`: gzip (.gz) or Zstandard (.zst: the Pile, SlimPajama;
  through pyarrow's codec, concatenated frames too)."""
  with paths.open_binary(path) as file:
    if path.lower().endswith('.gz'):
      with gzip.open(file, 'rb') as unzipped:
        yield unzipped
    elif path.lower().endswith('.zst'):
      import pyarrow  # pylint: disable=import-outside-toplevel  # tensorflow-datasets needs it.
      stream = pyarrow.CompressedInputStream(pyarrow.PythonFile(file, mode='r'), 'zstd')
      with io.BufferedReader(stream) as unzipped:  # A corrupt stream raises OSError.
        yield unzipped
    else:
      yield file


# What a file of another format starts with (its magic bytes), as a regular expression.
_PACKED_FORMATS = ((re.compile(rb'BZh[1-9]1AY&SY'), 'bzip2-compressed'),
                   (re.compile(rb'\xfd7zXZ\x00'), 'xz-compressed'),
                   (re.compile(rb'PK\x03\x04'), 'a zip archive'),
                   (re.compile(rb"7z\xbc\xaf'\x1c"), 'a 7z archive'),
                   (re.compile(rb'\x1f\x8b'), 'gzip-compressed'),
                   (re.compile(rb'\x28\xb5\x2f\xfd'), 'Zstandard-compressed'))


def _check_not_packed(path: str, head: bytes) -> None:
  """A compressed file or archive is refused by name whatever skip_bad_lines says: read as
  lines, its text would be dropped and a few fragments of junk kept."""
  kind = next((kind for magic, kind in _PACKED_FORMATS if magic.match(head)), None)
  if kind is None:
    return
  hint = (f"rename it to end in .{'gz' if kind.startswith('gzip') else 'zst'} to read it "
          'decompressed'
          if kind in ('gzip-compressed', 'Zstandard-compressed') else
          'decompress it (text files, .gz and .zst are read)')
  raise UserError(f"'{path}' is {kind}, not text; {hint}")


CONFIG_FLAGS = '--config.'  # How errors name the readers' options: a pretraining config's keys.


def _skip_hint(flags: str | None, what: str = 'lines') -> str:
  """', or set FLAGSskip_bad_lines=true ...' where the caller's command has that option."""
  return f', or set {flags}skip_bad_lines=true to skip such {what}' if flags else ''


def read_lines(path: str, skip_bad_lines: bool = False,
               flags: str | None = CONFIG_FLAGS) -> Iterator[str]:
  """Decoded lines of one file (newlines kept); UserError for binary, non-UTF-8 or empty files.

  With `skip_bad_lines`, lines that are not UTF-8 (or hold NUL bytes) are dropped instead and
  their count is logged, so one corrupt line need not stop a large corpus. `flags`: how errors
  name the options (CONFIG_FLAGS; '--' for a command's own flags; None: it has none).
  """
  offset, has_text, skipped = 0, False, 0  # offset: of the current line in the decompressed bytes
  try:
    with _open_binary(path) as f:
      for raw in f:
        line_offset, offset = offset, offset + len(raw)
        if line_offset == 0:
          _check_not_packed(path, raw)
        if b'\x00' in raw:
          if skip_bad_lines:
            skipped += 1
            continue
          raise UserError(f"'{path}' looks binary (NUL byte at byte offset "
                          f'{line_offset + raw.index(0)}); pass UTF-8 text files only'
                          + _skip_hint(flags))
        try:
          line = raw.decode('utf-8')
        except UnicodeDecodeError as e:
          if skip_bad_lines:
            skipped += 1
            continue
          raise UserError(f"'{path}' is not UTF-8 (invalid byte at byte offset "
                          f'{line_offset + e.start}); convert it, e.g. iconv -t UTF-8'
                          + _skip_hint(flags)) from None
        if line_offset == 0:
          line = line.removeprefix('\ufeff')  # A byte-order mark is not text.
        has_text = has_text or bool(line.strip())
        yield line
  except (OSError, EOFError, zlib.error) as e:  # Unreadable, or a corrupt/truncated .gz/.zst.
    raise UserError(f"cannot read '{path}': {e}") from None
  if skipped and not has_text:  # Not empty: "is empty" would send the user to the glob.
    raise UserError(f"every line of '{path}' ({skipped}) was skipped as not UTF-8 text "
                    '(skip_bad_lines); convert it, e.g. iconv -t UTF-8, or leave it out')
  if skipped:
    logging.warning('skipped %d line(s) of %s that are not UTF-8 text (skip_bad_lines)', skipped,
                    path)
  if not has_text:
    raise UserError(f"'{path}' is empty" + ('; remove it or fix the glob' if flags else ''))


JSON_LINES_SUFFIXES = ('.jsonl', '.ndjson', '.json')


def is_json_lines(path: str) -> bool:
  """Named like a JSON Lines file (`.gz`, `.zst` too): one JSON object per line."""
  return _uncompressed_name(path).endswith(JSON_LINES_SUFFIXES)


def read_json_records(path: str, skip_bad_lines: bool = False,
                      flags: str | None = CONFIG_FLAGS) -> Iterator[tuple[int, dict]]:
  """(line number, object) of each non-blank line of a JSON Lines file; a line that is not a
  JSON object is a UserError naming it (with `skip_bad_lines`, skipped and counted)."""
  skipped, objects = 0, 0
  for number, line in enumerate(read_lines(path, skip_bad_lines, flags), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      problem = None if isinstance(record, dict) else f'a JSON {type(record).__name__}'
    except json.JSONDecodeError as e:
      problem = f'not JSON ({e.msg})'
    except (ValueError, RecursionError) as e:  # An integer over 4300 digits; deep nesting.
      problem = f'not JSON Python reads ({first_line(e)})'
    if problem is None:
      objects += 1
      yield number, record
    elif skip_bad_lines:
      skipped += 1
    else:
      raise UserError(f"'{path}' line {number} is {problem}, not an object; write one JSON "
                      'object per line' + _skip_hint(flags))
  if skipped and not objects:
    raise UserError(f"every line of '{path}' ({skipped}) was skipped as not a JSON object "
                    '(skip_bad_lines); write one JSON object per line (not one JSON array)')
  if skipped:
    logging.warning('skipped %d line(s) of %s that are not JSON objects (skip_bad_lines)',
                    skipped, path)


def text_lines(text: str) -> list[str]:
  """A record's text (JSON Lines, Parquet, Arrow, TFDS) as its non-empty stripped lines, split on
  newlines only, as a text file's lines are."""
  return [line for line in (raw.strip() for raw in text.split('\n')) if line]


# Columnar files: Parquet (the Hugging Face Hub's datasets) and Arrow IPC (`datasets`'
# save_to_disk and its cache, `data-00000-of-00001.arrow`).
COLUMNAR_SUFFIXES = ('.parquet', '.arrow')


def is_columnar(path: str) -> bool:
  return path.lower().endswith(COLUMNAR_SUFFIXES)


def is_record_file(path: str) -> bool:
  """A file of records (JSON Lines, Parquet, Arrow), each one document, not of plain text."""
  return is_json_lines(path) or is_columnar(path)


@dataclasses.dataclass
class ColumnarFile:
  """An open Parquet or Arrow file: its schema, and its rows in record batches, read once
  (`columns` picks what a Parquet file reads; an Arrow file's batches hold every column)."""
  schema: object                      # pyarrow.Schema
  batches: Callable[..., Iterator]    # batches(columns=None) -> pyarrow.RecordBatch, ...

  def rows(self) -> list[dict]:
    return [row for batch in self.batches() for row in batch.to_pylist()]


def _columnar_file(path: str, file) -> ColumnarFile:
  # pylint: disable=import-outside-toplevel
  import pyarrow
  import pyarrow.ipc
  import pyarrow.parquet
  if path.lower().endswith('.parquet'):
    parquet = pyarrow.parquet.ParquetFile(file)
    return ColumnarFile(parquet.schema_arrow, lambda columns=None: parquet.iter_batches(
        batch_size=1024, columns=columns))
  try:
    stream = pyarrow.ipc.open_stream(file)  # What `datasets` writes.
    return ColumnarFile(stream.schema, lambda columns=None: iter(stream))
  except pyarrow.ArrowInvalid:
    file.seek(0)
    ipc = pyarrow.ipc.open_file(file)
    return ColumnarFile(ipc.schema, lambda columns=None: (
        ipc.get_batch(i) for i in range(ipc.num_record_batches)))


@contextlib.contextmanager
def open_columnar(path: str):
  """A ColumnarFile of a Parquet or Arrow IPC (stream or file) file, local or remote (Parquet
  read by ranges); a file that cannot be read, there or later, is a UserError."""
  import pyarrow  # pylint: disable=import-outside-toplevel  # tensorflow-datasets needs it.
  with paths.open_binary(path) as file:
    try:
      yield _columnar_file(path, file)
    except (pyarrow.ArrowException, OSError) as e:
      kind = 'Parquet' if path.lower().endswith('.parquet') else 'Arrow'
      raise UserError(f"'{path}' is not a readable {kind} file ({e}); replace or remove "
                      'it') from None


def is_text_type(kind) -> bool:
  """An Arrow type whose values are str: string, large or view, dictionary-encoded too (a
  pandas category column)."""
  import pyarrow  # pylint: disable=import-outside-toplevel
  if pyarrow.types.is_dictionary(kind):
    kind = kind.value_type
  is_string_view = getattr(pyarrow.types, 'is_string_view', lambda _: False)  # pyarrow >= 16.
  return any(is_text(kind) for is_text in (pyarrow.types.is_string,
                                           pyarrow.types.is_large_string, is_string_view))


class _RecordText(NamedTuple):
  where: str                  # 'line 3', 'row 17'
  text: object                # str, or what the record holds instead (None, a number, ...)
  keys: Collection[str]       # the record's fields, for the message when text_key is missing


def _json_lines_texts(path: str, text_key: str, skip_bad_lines: bool, flags: str):
  for number, record in read_json_records(path, skip_bad_lines, flags):
    yield _RecordText(f'line {number}', record.get(text_key), record.keys())


def _columnar_texts(path: str, text_key: str, flags: str):
  """The `text_key` column of a Parquet or Arrow file, streamed a batch of rows at a time."""
  with open_columnar(path) as columnar:
    names = columnar.schema.names
    if text_key not in names:
      raise UserError(f"'{path}' has no column {text_key!r} (its columns: {', '.join(names)}); "
                      f'set {flags}text_key to the column holding the text')
    kind = columnar.schema.field(text_key).type
    if not is_text_type(kind):
      raise UserError(f"'{path}' column {text_key!r} holds {kind}, not text; set "
                      f'{flags}text_key to the column holding the text')
    row = 0
    for batch in columnar.batches(columns=[text_key]):
      for text in batch.column(text_key).to_pylist():
        row += 1
        yield _RecordText(f'row {row}', text, names)


_LINE_RECORDS_SAMPLE = 1000  # Records read before judging whether they look like lines.


def _note_line_records(path: str, texts: int, blank: int, flags: str) -> None:
  """Warns when a tenth or more of a file's first records are blank: a line per record (the
  Hub's wikitext), which read as documents packs an example per line."""
  if texts and blank * 10 >= texts:
    logging.warning("%d of the first %d records of '%s' are blank: if each record is a line "
                    '(wikitext), set %srecords_are_lines=true, or each packs a short example of '
                    'its own', blank, texts, path, flags)


def _lone_surrogate(text: str) -> str | None:
  """The first unpaired UTF-16 surrogate in `text` as an escape ('\\ud83d'), or None."""
  try:
    text.encode('utf-8')
    return None
  except UnicodeEncodeError as e:
    return f'\\u{ord(text[e.start]):04x}'


def _record_documents(path: str, text_key: str, skip_bad_lines: bool, flags: str,
                      records_are_lines: bool = False):
  """The documents of a JSON Lines, Parquet or Arrow file: each record's text, split into
  lines; or, `records_are_lines`, the records' texts as the lines of a text file, a blank one
  ending a document (the Hub's wikitext)."""
  if is_json_lines(path):
    records = _json_lines_texts(path, text_key, skip_bad_lines, flags)
  else:
    records = _columnar_texts(path, text_key, flags)
  found, seen, skipped, doc = False, False, 0, []
  texts, blank = 0, 0  # Records with text, and those whose text is blank.
  for record in records:
    seen = True
    surrogate = _lone_surrogate(record.text) if isinstance(record.text, str) else None
    if not isinstance(record.text, str) or surrogate is not None:
      if skip_bad_lines:
        skipped += 1
        continue
      if surrogate is not None:  # Valid JSON ("\ud83d"), but no tokenizer takes it.
        raise UserError(f"'{path}' {record.where} has a lone surrogate {surrogate} in "
                        f'{text_key!r} (half of an emoji cut off?), which is not text; fix or '
                        'remove the record' + _skip_hint(flags, 'records'))
      what = (f'{text_key!r} = {json.dumps(record.text)[:40]}, not text'
              if text_key in record.keys else
              f"no key {text_key!r} (its keys: {', '.join(sorted(record.keys)) or 'none'})")
      raise UserError(f"'{path}' {record.where} has {what}; set {flags}text_key to the field "
                      'holding the text' + _skip_hint(flags, 'records'))
    found = True
    lines = text_lines(record.text)
    texts += 1
    blank += not lines
    if texts == _LINE_RECORDS_SAMPLE and not records_are_lines:
      _note_line_records(path, texts, blank, flags)
    if not records_are_lines:
      if lines:
        yield lines
    elif lines:
      doc.extend(lines)
    elif doc:
      yield doc
      doc = []
  if doc:
    yield doc
  if texts < _LINE_RECORDS_SAMPLE and not records_are_lines:
    _note_line_records(path, texts, blank, flags)
  if skipped:
    logging.warning('skipped %d record(s) of %s without (valid) text under %r (skip_bad_lines)',
                    skipped, path, text_key)
  if not seen:
    raise UserError(f"'{path}' is empty; remove it or fix the glob")
  if not found:
    raise UserError(f"'{path}' has no record with text under {text_key!r}; set "
                    f'{flags}text_key to the field holding the text')


def read_documents(files: Iterable[str], skip_bad_lines: bool = False, text_key: str = 'text',
                   flags: str = CONFIG_FLAGS,
                   records_are_lines: bool = False) -> Iterator[list[str]]:
  """Each document as its non-empty stripped lines: in text files, blank lines and file ends
  end documents; in JSON Lines, Parquet and Arrow files, each record's `text_key` field is
  one (`records_are_lines`: a line, as in a text file)."""
  for path in files:
    if is_record_file(path):
      yield from _record_documents(path, text_key, skip_bad_lines, flags, records_are_lines)
      continue
    doc = []
    for line in read_lines(path, skip_bad_lines, flags):
      line = line.strip()
      if line:
        doc.append(line)
      elif doc:
        yield doc
        doc = []
    if doc:
      yield doc


def vocabulary_lines(files: Iterable[str], skip_bad_lines: bool = False, text_key: str = 'text',
                     flags: str = CONFIG_FLAGS) -> Iterator[str]:
  """The lines a vocabulary trains on: a text file's as written (newline dropped), a record's
  text (JSON Lines, Parquet, Arrow) split on newlines."""
  for path in files:
    if is_record_file(path):
      # As lines: the same lines in the same order, and no warning about line records.
      for doc in _record_documents(path, text_key, skip_bad_lines, flags, records_are_lines=True):
        yield from doc
    else:
      yield from (line.rstrip('\r\n') for line in read_lines(path, skip_bad_lines, flags))


def _reading(config) -> dict:
  """read_documents' options as `config` sets them (bad lines, text key, records as lines)."""
  return dict(skip_bad_lines=bool(config.get('skip_bad_lines', False)),
              text_key=config.get('text_key', 'text'),
              records_are_lines=bool(config.get('records_are_lines', False)))


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A pretraining corpus, read in parts a progress bar can count: its files, or a TFDS
  split's records (each part gives its documents)."""
  description: str
  unit: str  # What a part is, for the bar: 'files' or 'docs'.
  num_parts: int
  source: dict  # What it is, as prepared data's metadata records it.
  _parts: Callable[[], Iterator[Iterable[list[str]]]]

  def documents(self, part_done: Callable[[], None] = lambda: None) -> Iterator[list[str]]:
    """Every document in order; `part_done()` after each part's."""
    for part in self._parts():
      yield from part
      part_done()


class NoFiles(UserError):
  """The config names no files for the split (and no TFDS split) to read."""


def open_corpus(config, split: str = 'train', files: str | None = None) -> Corpus:
  """The config's training ('train') or evaluation ('eval') corpus: with `tfds_name`, TFDS's
  `tfds_split` / `tfds_eval_split` (when set), else the `train_files` / `eval_files` glob;
  `files`, a glob read instead. Fails now on a bad glob or dataset."""
  reading = _reading(config)
  text_key = reading['text_key']
  tfds_split = (config.get('tfds_split') or 'train' if split == 'train' else
                config.get('tfds_eval_split'))
  if config.get('tfds_name') and tfds_split and not files:
    if reading['records_are_lines']:
      raise UserError('config.records_are_lines applies to record files (JSON Lines, Parquet, '
                      'Arrow), not to TFDS datasets; unset it or tfds_name')
    from electra_jax.data import tfds_source  # pylint: disable=import-outside-toplevel
    data_dir = config.get('tfds_data_dir') or None
    # A saved config names a directory in the repository relative to it: found from anywhere.
    text = tfds_source.open_text_source(config.tfds_name, tfds_split, text_key,
                                        data_dir and paths.as_found(data_dir))
    return Corpus(text.description, 'docs', len(text), dict(
        tfds_name=config.tfds_name, tfds_split=tfds_split, text_key=text_key,
        tfds_data_dir=data_dir or ''), text.records)
  pattern = files or config[f'{split}_files']
  if not (pattern or '').strip():
    raise NoFiles(f"config.{split}_files is empty: there is no {split} text to read; set "
                    f'--config.{split}_files=GLOB'
                    + (' (or --config.eval_every_steps=0 to train without evaluating)'
                       if split == 'eval' else ''))
  paths_read = list_files(pattern)
  parts = lambda: (read_documents([path], **reading) for path in paths_read)
  return Corpus(f"'{pattern}'", 'files', len(paths_read), {
      f'{split}_files': pattern, 'files': paths_read, 'text_key': text_key,
      'records_are_lines': reading['records_are_lines']}, parts)


def training_source(config) -> dict:
  """The `source` of the config's training data: its corpus's, or for prepared data
  (train_data_dir) the one its metadata records."""
  if config.get('train_data_dir'):
    from electra_jax.data import shards  # pylint: disable=import-outside-toplevel
    return shards.read_metadata(paths.as_found(config.train_data_dir))['source']
  return open_corpus(config, 'train').source


def held_out_note(trained_on: dict, held_out: Corpus) -> str | None:
  """A note when the eval set `held_out` (open_corpus(config, 'eval')) is training text too
  (the same files, or the same TFDS split): its metrics then say nothing about held-out text.
  `trained_on`: the training data's source (the train examples' `source`, or
  training_source(config))."""
  if 'files' in trained_on and 'files' in held_out.source:
    trained = {paths.canonical(f) for f in trained_on['files']}  # A symlinked folder too.
    shared = [f for f in held_out.source['files'] if paths.canonical(f) in trained]
    if shared:
      return (f"{len(shared)} of the eval set's {len(held_out.source['files'])} file(s) are "
              f"training files too ('{shared[0]}'{', ...' if len(shared) > 1 else ''}): its "
              'metrics are not of held-out text; point eval_files at text training never reads')
  elif trained_on == held_out.source:
    return (f'the eval set is the training split ({held_out.description}): its metrics are not '
            'of held-out text; set tfds_eval_split to a split training never reads')
  return None
