"""Reads a TensorFlow checkpoint (the TF1 Saver's and TF2's tensor-bundle format) without
TensorFlow: what the official ELECTRA code and its released models are saved as.

A checkpoint PREFIX (e.g. `model.ckpt-1000000`) is `PREFIX.index`, a LevelDB-format table
from each variable name to where its bytes lie, and `PREFIX.data-NNNNN-of-MMMMM`, the raw
little-endian bytes. The CRC32C of each index block and each variable is checked. Local and
gs:// paths alike (paths.py).
"""
import re
import struct

import numpy as np

from electra_jax import paths
from electra_jax.errors import UserError

# The table's footer: two block handles padded to 40 bytes, then this magic number.
_FOOTER_SIZE, _MAGIC = 48, 0xdb4775248b80fb57
# tensorflow/core/framework/types.proto: the DataType numbers of the dtypes read here.
_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 6: np.int8, 9: np.int64,
           10: np.bool_, 19: np.float16}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
  value = shift = 0
  while True:
    byte = data[pos]
    pos += 1
    value |= (byte & 0x7f) << shift
    if byte < 0x80:
      return value, pos
    shift += 7


def _fields(message: bytes) -> list[tuple[int, int | bytes]]:
  """A protobuf message's (field number, value) pairs, in order: varints as ints, fixed32
  and fixed64 as ints, length-delimited fields as bytes."""
  out, pos = [], 0
  while pos < len(message):
    key, pos = _varint(message, pos)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, pos = _varint(message, pos)
    elif wire == 1:
      value, pos = struct.unpack_from('<Q', message, pos)[0], pos + 8
    elif wire == 2:
      size, pos = _varint(message, pos)
      value, pos = message[pos:pos + size], pos + size
    elif wire == 5:
      value, pos = struct.unpack_from('<I', message, pos)[0], pos + 4
    else:
      raise ValueError(f'protobuf wire type {wire}')
    out.append((number, value))
  return out


def _handle(data: bytes, pos: int) -> tuple[int, int, int]:
  """A BlockHandle at `pos`: the block's offset and size, and where the handle ends."""
  offset, pos = _varint(data, pos)
  size, pos = _varint(data, pos)
  return offset, size, pos


def _block(data: bytes, offset: int, size: int, where: str) -> list[tuple[bytes, bytes]]:
  """The (key, value) entries of the table block at offset, size."""
  if offset + size + 5 > len(data):
    raise UserError(f"'{where}' is truncated (a block ends past its {len(data)} bytes); copy it "
                    'again')
  # The trailer: the compression type, then the masked CRC32C of the contents and that byte.
  # A flipped byte is caught here, before it can be read as another name, offset or shape.
  if _masked_crc32c(data[offset:offset + size + 1]) != struct.unpack_from(
      '<I', data, offset + size + 1)[0]:
    raise UserError(f"'{where}' is corrupt (a block's checksum does not match); copy it again")
  if data[offset + size] != 0:  # 0 = none.
    raise UserError(f"'{where}' has compressed blocks (type {data[offset + size]}), which TF's "
                    'checkpoints never write; is it a checkpoint index?')
  block = data[offset:offset + size]
  num_restarts = struct.unpack_from('<I', block, len(block) - 4)[0]
  end = len(block) - 4 * (num_restarts + 1)
  entries, pos, key = [], 0, b''
  while pos < end:
    shared, pos = _varint(block, pos)
    unshared, pos = _varint(block, pos)
    value_size, pos = _varint(block, pos)
    key = key[:shared] + block[pos:pos + unshared]
    pos += unshared
    entries.append((key, block[pos:pos + value_size]))
    pos += value_size
  return entries


def _masked_crc32c(data: bytes) -> int:
  import google_crc32c  # pylint: disable=import-outside-toplevel  (with gcsfs, a dependency)
  crc = google_crc32c.value(data)
  return ((((crc >> 15) | (crc << 17)) & 0xffffffff) + 0xa282ead8) & 0xffffffff


def _read_index(data: bytes, index: str) -> tuple[dict[str, dict], int]:
  """({variable name: its BundleEntryProto fields}, shard count) of an index file's bytes."""
  footer = data[-_FOOTER_SIZE:]
  _, _, pos = _handle(footer, 0)  # The metaindex block (empty in checkpoints).
  index_offset, index_size, _ = _handle(footer, pos)
  entries, num_shards = {}, 1
  for _, handle in _block(data, index_offset, index_size, index):
    for key, value in _block(data, *_handle(handle, 0)[:2], index):
      if key == b'':  # The BundleHeaderProto: shard count and byte order.
        header = dict(_fields(value))
        num_shards = header.get(1, 1)
        if header.get(2, 0) != 0:
          raise UserError(f"'{index}' was written big-endian; only little-endian converts")
      else:
        entries[key.decode('utf-8')] = dict(_fields(value))
  return entries, num_shards


class Reader:
  """The variables of one checkpoint prefix: names, shapes, and arrays on demand."""

  def __init__(self, prefix: str):
    self.prefix = prefix
    index = f'{prefix}.index'
    if not paths.is_file(index):
      raise UserError(f"'{index}' not found; pass a TensorFlow checkpoint prefix (PREFIX.index "
                      'and PREFIX.data-* beside it) or the directory holding its `checkpoint` '
                      'file')
    data = paths.read_bytes(index)
    if len(data) < _FOOTER_SIZE or struct.unpack_from('<Q', data, len(data) - 8)[0] != _MAGIC:
      raise UserError(f"'{index}' is not a TensorFlow checkpoint index (no table footer)")
    try:
      self._entries, self._num_shards = _read_index(data, index)
    except (IndexError, ValueError, struct.error) as e:  # UnicodeDecodeError is a ValueError.
      # The footer has no checksum: a damaged block handle, or a table that is no bundle.
      raise UserError(f"'{index}' is not a readable TensorFlow checkpoint index (corrupt or "
                      f'truncated? {type(e).__name__}); copy it again') from None

  def names(self) -> list[str]:
    return sorted(self._entries)

  def shape(self, name: str) -> tuple[int, ...]:
    dims = [dict(_fields(dim)).get(1, 0) for number, dim in
            _fields(self._entries[name].get(2, b'')) if number == 2]
    return tuple(dims)

  def read(self, name: str) -> np.ndarray:
    """One variable's value (numeric dtypes; a partitioned or string variable is refused)."""
    entry = self._entries[name]
    dtype = _DTYPES.get(entry.get(1))
    if dtype is None or 7 in entry:
      raise UserError(f"checkpoint variable '{name}' has dtype {entry.get(1)} or is "
                      'partitioned; only whole numeric variables convert')
    shard = f'{self.prefix}.data-{entry.get(3, 0):05d}-of-{self._num_shards:05d}'
    offset, size = entry.get(4, 0), entry.get(5, 0)
    try:
      with paths.storage_errors(shard), paths.get(shard).open('rb') as f:
        f.seek(offset)
        raw = f.read(size)
    except FileNotFoundError:
      raise UserError(f"'{shard}' not found: the data file its .index names must lie beside "
                      'it; copy the whole checkpoint (PREFIX.index and PREFIX.data-*)') from None
    if len(raw) != size or (6 in entry and _masked_crc32c(raw) != entry[6]):
      raise UserError(f"'{shard}' is truncated or corrupt at variable '{name}' (its checksum "
                      'does not match); copy the checkpoint again')
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder('<')).reshape(
        self.shape(name)).astype(dtype)


def find_prefix(path: str) -> str | None:
  """The checkpoint prefix `path` names: a prefix itself (PREFIX.index exists), or a directory
  with TF's `checkpoint` file (its model_checkpoint_path, looked for in this directory by its
  name first: a run copied from elsewhere reads its own files) or holding exactly one *.index
  (several: a UserError naming them). One of a prefix's own files names the prefix. None
  otherwise."""
  path = paths.absolute(path)
  if paths.is_file(f'{path}.index'):
    return path
  own_file = re.fullmatch(r'(.+)\.(index|data-\d+-of-\d+)', path)
  if own_file and paths.is_file(f'{own_file.group(1)}.index'):
    return own_file.group(1)
  if not paths.is_dir(path):
    return None
  state = paths.join(path, 'checkpoint')
  if paths.is_file(state):
    match = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', paths.read_text(state), re.M)
    if match:
      named = match.group(1)
      for prefix in _named_prefixes(path, named):
        try:
          if paths.is_file(f'{prefix}.index'):
            return prefix
        except UserError as e:  # Only the path as written can be elsewhere (a bucket).
          raise UserError(f"'{state}' names {named}, which is not in {path} and cannot be "
                          f'read there ({e}); copy that step here, or pass the prefix of the '
                          'step to read') from None
  prefixes = sorted((name[:-len('.index')] for name in paths.listdir(path)
                     if name.endswith('.index')),
                    key=lambda p: [int(x) if x.isdigit() else x for x in re.split(r'(\d+)', p)])
  if len(prefixes) > 1:
    raise UserError(f"'{path}' holds {len(prefixes)} checkpoints ({', '.join(prefixes)}) and no "
                    "'checkpoint' file naming one; pass the prefix of the step to read, e.g. "
                    f"'{paths.join(path, prefixes[-1])}'")
  return paths.join(path, prefixes[0]) if prefixes else None


def _named_prefixes(directory: str, named: str) -> list[str]:
  """Where the prefix a `checkpoint` file names may lie, nearest first: in `directory` (a
  relative name, then the bare file name: a copied or downloaded run), then the path as
  written (the run's own directory, perhaps on a bucket)."""
  local = [paths.join(directory, named.rsplit('/', 1)[-1])]
  if not (paths.is_remote(named) or named.startswith('/')):
    local.insert(0, paths.join(directory, named))
  return local + [named]
