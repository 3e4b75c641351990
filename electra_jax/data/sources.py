"""Plain-text corpora: one sentence or paragraph per line, documents split by blank lines.

The format of the official ELECTRA/BERT release. Files are streamed line by line (a corpus
never has to fit in memory as one string); `.gz` files are read transparently. Bad files fail
with the file name and byte offset instead of a stack trace deep inside a decoder.
"""
import contextlib
import gzip
from typing import Iterable, Iterator

from absl import logging

from electra_jax import paths
from electra_jax.errors import UserError


def list_files(pattern: str) -> list[str]:
  """Sorted, de-duplicated files matching one or more comma-separated globs."""
  files = []
  for part in (pattern or '').split(','):
    if part.strip():
      files.extend(paths.glob(part))
  if not files:
    raise UserError(f"no files match '{pattern}'; fix the glob (relative paths are tried from "
                    'the current directory, then the repository root)')
  return sorted(set(files))


@contextlib.contextmanager
def _open_binary(path: str):
  with paths.open_binary(path) as file:
    if path.endswith('.gz'):
      with gzip.open(file, 'rb') as unzipped:
        yield unzipped
    else:
      yield file


def read_lines(path: str, skip_bad_lines: bool = False) -> Iterator[str]:
  """Decoded lines of one file (newlines kept); UserError for binary, non-UTF-8 or empty files.

  With `skip_bad_lines`, lines that are not UTF-8 (or hold NUL bytes) are dropped instead and
  their count is logged, so one corrupt line need not stop a large corpus.
  """
  offset, has_text, skipped = 0, False, 0  # offset: of the current line in the decompressed bytes
  try:
    with _open_binary(path) as f:
      for raw in f:
        line_offset, offset = offset, offset + len(raw)
        if b'\x00' in raw:
          if skip_bad_lines:
            skipped += 1
            continue
          raise UserError(f"'{path}' looks binary (NUL byte at byte offset "
                          f'{line_offset + raw.index(0)}); pass UTF-8 text files only, or set '
                          '--config.skip_bad_lines=true')
        try:
          line = raw.decode('utf-8')
        except UnicodeDecodeError as e:
          if skip_bad_lines:
            skipped += 1
            continue
          raise UserError(f"'{path}' is not UTF-8 (invalid byte at byte offset "
                          f'{line_offset + e.start}); convert it, e.g. iconv -t UTF-8, or set '
                          '--config.skip_bad_lines=true') from None
        if line_offset == 0:
          line = line.removeprefix('\ufeff')  # A byte-order mark is not text.
        has_text = has_text or bool(line.strip())
        yield line
  except (OSError, EOFError) as e:  # Unreadable, or a corrupt/truncated .gz.
    raise UserError(f"cannot read '{path}': {e}") from None
  if skipped:
    logging.warning('skipped %d line(s) of %s that are not UTF-8 text (skip_bad_lines)', skipped,
                    path)
  if not has_text:
    raise UserError(f"'{path}' is empty; remove it or fix the glob")


def read_documents(files: Iterable[str], skip_bad_lines: bool = False) -> Iterator[list[str]]:
  """Each document as its non-empty stripped lines; blank lines and file ends end documents."""
  for path in files:
    doc = []
    for line in read_lines(path, skip_bad_lines):
      line = line.strip()
      if line:
        doc.append(line)
      elif doc:
        yield doc
        doc = []
    if doc:
      yield doc


def corpus_documents(config, split: str = 'train') -> tuple[str, Iterator[list[str]]]:
  """(description, documents) of the config's corpus: TFDS when `tfds_name` is set (train
  split only), else the `train_files` / `eval_files` glob. Fails now on a bad glob or dataset."""
  if split == 'train' and config.get('tfds_name'):
    from electra_jax.data import tfds_source  # pylint: disable=import-outside-toplevel
    source = tfds_source.open_text_source(config.tfds_name, config.get('tfds_split') or 'train',
                                          config.get('tfds_text_key') or 'text',
                                          config.get('tfds_data_dir') or None)
    return source.description, source.documents()
  pattern = config.train_files if split == 'train' else config.eval_files
  files = list_files(pattern)
  return f"'{pattern}'", read_documents(files, bool(config.get('skip_bad_lines', False)))
