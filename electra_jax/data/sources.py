"""Plain-text corpora: one sentence or paragraph per line, documents split by blank lines.

The format of the official ELECTRA/BERT release. Files are streamed line by line (a corpus
never has to fit in memory as one string); `.gz` files are read transparently. Bad files fail
with the file name and byte offset instead of a stack trace deep inside a decoder.
"""
import gzip
from typing import Iterable, Iterator

from electra_jax.data import paths
from electra_jax.errors import UserError


def list_files(pattern: str) -> list[str]:
  """Sorted, de-duplicated files matching one or more comma-separated globs."""
  files = []
  for part in (pattern or '').split(','):
    if part.strip():
      files.extend(paths.resolve_glob(part))
  if not files:
    raise UserError(f"no files match '{pattern}'; fix the glob (relative paths are tried from "
                    'the current directory, then the repository root)')
  return sorted(set(files))


def _open_binary(path: str):
  return gzip.open(path, 'rb') if path.endswith('.gz') else open(path, 'rb')


def read_lines(path: str) -> Iterator[str]:
  """Decoded lines of one file (newlines kept); UserError for binary, non-UTF-8 or empty files."""
  offset, has_text = 0, False  # offset: of the current line in the (decompressed) bytes
  try:
    with _open_binary(path) as f:
      for raw in f:
        if b'\x00' in raw:
          raise UserError(f"'{path}' looks binary (NUL byte at byte offset "
                          f'{offset + raw.index(0)}); pass UTF-8 text files only')
        try:
          line = raw.decode('utf-8')
        except UnicodeDecodeError as e:
          raise UserError(f"'{path}' is not UTF-8 (invalid byte at byte offset "
                          f'{offset + e.start}); convert it, e.g. iconv -t UTF-8') from None
        if offset == 0:
          line = line.removeprefix('\ufeff')  # A byte-order mark is not text.
        offset += len(raw)
        has_text = has_text or bool(line.strip())
        yield line
  except (OSError, EOFError) as e:  # Unreadable, or a corrupt/truncated .gz.
    raise UserError(f"cannot read '{path}': {e}") from None
  if not has_text:
    raise UserError(f"'{path}' is empty; remove it or fix the glob")


def read_documents(files: Iterable[str]) -> Iterator[list[str]]:
  """Each document as its non-empty stripped lines; blank lines and file ends end documents."""
  for path in files:
    doc = []
    for line in read_lines(path):
      line = line.strip()
      if line:
        doc.append(line)
      elif doc:
        yield doc
        doc = []
    if doc:
      yield doc
