"""Prepared training data: packed examples in sharded ArrayRecord files plus a metadata JSON.

Layout of a prepared directory (python -m electra_jax.data.prepare):
  train-00000.array_record ...   one record per example, in corpus order across shards
  train_metadata.json            vocabulary hash, sequence length, packing settings, shard list

A record is the example's tokens ([CLS] A [SEP] B [SEP], unpadded) after one header value, the
length of `[CLS] A [SEP]`, as little-endian uint16 (int32 for vocabularies over 65,536 ids).
Keeping corpus order means a run on prepared shards sees exactly the batches the same run
streaming the raw text would.
"""
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time

import numpy as np
from array_record.python import array_record_module

from electra_jax import atomic
from electra_jax import paths
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError, first_line

FORMAT = 'electra_jax.packed_examples'
FORMAT_VERSION = 1
SHARD_NAME = '{split}-{index:05d}.array_record'
# group_size:1 keeps every record individually addressable: random access for shuffling.
WRITER_OPTIONS = 'group_size:1'
_SPARE_OPEN_FILES = 64  # The fewest open files a training needs beside its shards.


def metadata_path(data_dir: str, split: str = 'train') -> str:
  return paths.join(data_dir, f'{split}_metadata.json')


def file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  with paths.open_binary(path) as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def record_dtype(vocab_size: int) -> np.dtype:
  return np.dtype('<u2') if vocab_size <= 1 << 16 else np.dtype('<i4')


def encode_example(tokens, num_first: int, dtype: np.dtype) -> bytes:
  return np.asarray([num_first, *tokens], dtype).tobytes()


def decode_example(record: bytes, dtype: np.dtype) -> tuple[np.ndarray, int]:
  values = np.frombuffer(record, dtype)
  return values[1:], int(values[0])


class ShardWriter:
  """Writes examples into numbered shards of `examples_per_shard`; nothing is final until
  `finish` writes the metadata (the mark of a complete directory). ArrayRecord writes local
  files only: for a remote `output_dir` each shard is written to a local temporary directory
  and uploaded when it is full."""

  def __init__(self, output_dir: str, split: str, vocab_size: int, examples_per_shard: int):
    self._dir, self._split = output_dir, split
    self._local = tempfile.mkdtemp(prefix='electra_shards_') if paths.is_remote(output_dir) \
        else output_dir
    self._dtype = record_dtype(vocab_size)
    self._per_shard = examples_per_shard
    self._writer, self._shards, self._count = None, [], 0
    self.num_examples = self.num_tokens = 0
    self._remove_leftovers()

  def _remove_leftovers(self):
    """Removes the shards a killed prepare left in the folder (it holds no metadata, so they
    are no data's): a re-run that writes fewer would leave the rest behind, unused."""
    leftover = re.compile(re.escape(self._split) + r'-\d{5,}\.array_record(\.tmp)?')
    for name in paths.listdir(self._dir):
      if leftover.fullmatch(name):
        paths.remove_file(paths.join(self._dir, name))

  def write(self, tokens, num_first: int):
    if self._writer is None or self._count == self._per_shard:
      self._close_shard()
      name = SHARD_NAME.format(split=self._split, index=len(self._shards))
      with self._array_record_errors():
        self._writer = array_record_module.ArrayRecordWriter(
            os.path.join(self._local, name + '.tmp'), WRITER_OPTIONS)
      self._shards.append({'file': name, 'num_examples': 0})
    with self._array_record_errors():
      self._writer.write(encode_example(tokens, num_first, self._dtype))
    self._count += 1
    self._shards[-1]['num_examples'] += 1
    self.num_examples += 1
    self.num_tokens += len(tokens)

  @contextlib.contextmanager
  def _array_record_errors(self):
    """ArrayRecord's storage faults (a RuntimeError whose text holds the strerror, e.g. a
    full disk) become paths.user_error's one line."""
    try:
      yield
    except RuntimeError as e:
      code = next((c for c in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES,
                               errno.EROFS) if os.strerror(c) in str(e)), None)
      error = code and paths.user_error(self._local, OSError(code, os.strerror(code)),
                                        '--output' if self._local == self._dir else '')
      if error is None:
        raise
      raise error from None

  def _close_shard(self):
    if self._writer is not None:
      with self._array_record_errors():
        self._writer.close()
      if self._local != self._dir:
        local = os.path.join(self._local, self._shards[-1]['file'] + '.tmp')
        with open(local, 'rb') as f, paths.storage_errors(self._dir):
          with paths.get(paths.join(self._dir, self._shards[-1]['file'])).open('wb') as out:
            shutil.copyfileobj(f, out, 1 << 24)
        os.remove(local)
    self._writer, self._count = None, 0

  def abort(self):
    """Removes the shards written so far: a failed prepare leaves none of its files behind."""
    if self._writer is not None:
      with contextlib.suppress(Exception):  # Its failure is the one being reported.
        self._writer.close()
      self._writer = None
    for shard in self._shards:
      tmp = os.path.join(self._local, shard['file'] + '.tmp')
      if os.path.exists(tmp):
        os.remove(tmp)
      # Uploaded (remote) or renamed by finish (local) under its final name.
      paths.remove_file(paths.join(self._dir, shard['file']))
    if self._local != self._dir:
      shutil.rmtree(self._local, ignore_errors=True)

  def finish(self, metadata: dict) -> dict:
    """Closes the last shard, moves shards to their final names, then writes the metadata."""
    self._close_shard()
    if self._local == self._dir:
      for shard in self._shards:
        path = os.path.join(self._dir, shard['file'])
        os.replace(path + '.tmp', path)
    else:
      shutil.rmtree(self._local, ignore_errors=True)
    metadata = dict(format=FORMAT, format_version=FORMAT_VERSION, split=self._split,
                    record_dtype=self._dtype.str, num_examples=self.num_examples,
                    num_tokens=self.num_tokens, shards=self._shards,
                    created=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()), **metadata)
    atomic.write_json(metadata_path(self._dir, self._split), metadata)
    return metadata


def read_metadata(data_dir: str, split: str = 'train') -> dict:
  path = metadata_path(data_dir, split)
  if not paths.is_file(path):
    raise UserError(f"'{data_dir}' holds no prepared {split} data ({path} is missing); write it "
                    'with python -m electra_jax.data.prepare --config=... --output=DIR')
  try:
    metadata = json.loads(paths.read_text(path))
  except (ValueError, UnicodeDecodeError) as e:  # A copy cut short.
    raise UserError(f"'{path}' is not readable prepared data ({first_line(e)}); copy the "
                    'whole directory again or re-run prepare') from None
  if not isinstance(metadata, dict) or not isinstance(metadata.get('shards'), list):
    raise UserError(f"'{path}' is not prepared data's metadata; copy the whole directory again "
                    'or re-run prepare')
  if metadata.get('format') != FORMAT or metadata.get('format_version') != FORMAT_VERSION:
    raise UserError(f"'{path}' is not version {FORMAT_VERSION} prepared data; re-run "
                    'python -m electra_jax.data.prepare')
  missing = [s['file'] for s in metadata['shards']
             if not paths.is_file(paths.join(data_dir, s['file']))]
  if missing:
    raise UserError(f"'{data_dir}' lacks {len(missing)} shard(s) listed in {path}, e.g. "
                    f"{missing[0]}; copy the whole directory or re-run prepare")
  return metadata


def check_compatible(metadata: dict, data_dir: str, config, tokenizer):
  """The shards must have been packed with this vocabulary, sequence length and packing (the
  packing's seed may differ: pipeline.data_summary notes it)."""
  if metadata['vocab_sha256'] != file_sha256(tokenizer.vocab_file):
    raise UserError(f"train_data_dir '{data_dir}' was prepared with vocabulary "
                    f"'{metadata['vocab_file']}', which differs from config.vocab_file "
                    f"'{config.vocab_file}'; use that vocabulary or re-run prepare")
  # Lower-casing changes WordPiece ids only. Data prepared before a key existed was lower-cased
  # and ended every example with its document.
  before_the_key = dict(do_lower_case=True, pack_across_documents=False)
  keys = ('vocab_size', 'max_seq_length', 'pack_across_documents', 'short_seq_prob') + (
      ('do_lower_case',) if tokenizer_lib.is_wordpiece_vocab(tokenizer.vocab_file) else ())
  for key in keys:
    if key not in metadata and key not in before_the_key:
      continue
    prepared = metadata.get(key, before_the_key.get(key))
    wanted = config.get(key, before_the_key.get(key))
    if prepared != wanted:
      raise UserError(f"train_data_dir '{data_dir}' was prepared with {key}={prepared} but "
                      f'config.{key}={wanted}; set --config.{key}={prepared} or re-run prepare')


def _damaged_shard(grain, local_dir: str, files: list[str]) -> str:
  """' (NAME)', the first shard array_record cannot open alone; '' if each opens."""
  for name in files:
    try:
      grain.sources.ArrayRecordDataSource([os.path.join(local_dir, name)])
    except RuntimeError:
      return f' ({name})'
  return ''


def _allow_open_files(num_shards: int, data_dir: str) -> None:
  """Raises this process's soft limit on open files to fit every shard: ArrayRecord keeps each
  shard it reads open, and a big corpus (thousands of shards) passes the usual 1,024."""
  import resource  # pylint: disable=import-outside-toplevel
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  unlimited = resource.RLIM_INFINITY
  wanted = num_shards + 1024  # Room for libraries, logs, checkpoints and sockets too.
  if hard != unlimited and hard < num_shards + _SPARE_OPEN_FILES:
    raise UserError(f"train_data_dir '{data_dir}' has {num_shards} shards, which ArrayRecord "
                    f'keeps open, but this process may open at most {hard} files; raise the '
                    f'limit (ulimit -n {wanted}, as root or in limits.conf) or re-run prepare '
                    'with a larger --examples_per_shard')
  if soft != unlimited and soft < wanted:
    try:
      resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == unlimited else
                                                  min(wanted, hard), hard))
    except (ValueError, OSError):  # A system cap below `hard` (macOS): reads may still fit.
      pass


class PreparedExamples:
  """Random access to prepared examples: `gather(indices)` -> int32 feature arrays.

  ArrayRecord reads local files only: a remote `data_dir`'s shards are copied to the local
  cache (paths.CACHE_DIR) first, once per machine."""

  def __init__(self, data_dir: str, metadata: dict):
    import grain  # pylint: disable=import-outside-toplevel
    files = [s['file'] for s in metadata['shards']]
    _allow_open_files(len(files), data_dir)
    local_dir = paths.local_copy(data_dir, files)
    try:
      self._source = grain.sources.ArrayRecordDataSource(
          [os.path.join(local_dir, f) for f in files])
    except RuntimeError as e:  # array_record's, often without a message: find the shard.
      detail = f' ({e})' if str(e) else ''
      raise UserError(f"'{data_dir}' holds a damaged or incomplete shard"
                      f'{_damaged_shard(grain, local_dir, files)}{detail}; copy the whole '
                      'directory again or re-run prepare') from None
    self._dtype = np.dtype(metadata['record_dtype'])
    self._max_seq_length = metadata['max_seq_length']
    self.num_tokens = metadata['num_tokens']  # [CLS]/[SEP]s included, no padding.

  def __len__(self) -> int:
    return len(self._source)

  def examples(self, indices) -> list[tuple[np.ndarray, int]]:
    records = self._source.__getitems__([int(i) for i in indices])
    return [decode_example(r, self._dtype) for r in records]
