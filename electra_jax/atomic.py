"""Whole-file writes: a reader (or a run killed mid-write) sees the old file or the whole new
one, never half of it. Every file electra_jax rewrites in place goes through here.

Locally: a temporary file renamed over the target. On an object store (gs://) one upload
already replaces an object whole, and a rename would be a copy plus a delete.
"""
import json
import os
import time

from electra_jax import paths


def write_bytes(path, data: bytes):
  with paths.storage_errors(path):
    target = paths.get(path)
    if paths.is_remote(path):
      target.write_bytes(data)
      return
    tmp = target.with_name(target.name + '.tmp')
    try:
      with open(tmp, 'wb') as f:
        f.write(data)
        f.flush()
        # On disk before the rename: after a power loss or a hard VM stop, some filesystems
        # (XFS, ext4 with noauto_da_alloc) showed the renamed file empty.
        os.fsync(f.fileno())
      tmp.replace(target)
    except BaseException:
      tmp.unlink(missing_ok=True)  # A full disk leaves no half-written file behind.
      raise
    _sync_directory(target.parent)


def _sync_directory(directory):
  """The rename on disk too: a directory entry is durable once its directory is fsynced."""
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:
    return  # Windows cannot open a directory.
  try:
    os.fsync(fd)
  except OSError:
    pass  # Some filesystems (network mounts) refuse to fsync a directory; the rename stands.
  finally:
    os.close(fd)


def write_text(path, text: str):
  write_bytes(path, text.encode('utf-8'))


def write_json(path, record, **dump_args):
  """`record` as indented JSON plus a final newline."""
  write_text(path, json.dumps(record, indent=2, **dump_args) + '\n')


class AppendFile:
  """Text appended to a file on any filesystem. Locally a plain append (each write flushed).
  Object stores cannot append: there the whole file is kept in memory and uploaded again (one
  upload replaces the object whole) at most every `interval` seconds, at flush() and at
  close(), so a reader sees a prefix of what was written."""

  def __init__(self, path, interval: float = 30.0):
    self.path = paths.absolute(path)
    self._remote, self._interval = paths.is_remote(self.path), interval
    self._file = None
    self._text, self._dirty, self._flushed_at = '', False, time.monotonic()
    if self._remote:
      self._text = paths.read_text(self.path) if paths.is_file(self.path) else ''
    else:
      paths.make_dirs(paths.parent(self.path))
      with paths.storage_errors(self.path):
        self._file = open(self.path, 'a', encoding='utf-8')  # pylint: disable=consider-using-with

  def write(self, text: str):
    if self._file is not None:
      with paths.storage_errors(self.path):  # A full disk: one line naming the file.
        self._file.write(text)
        self._file.flush()
      return
    self._text += text
    self._dirty = True
    if time.monotonic() - self._flushed_at >= self._interval:
      self.flush()

  def flush(self):
    """Makes everything written so far visible (an upload on object stores)."""
    if self._dirty:
      write_text(self.path, self._text)
      self._dirty, self._flushed_at = False, time.monotonic()

  def close(self):
    if self._file is not None:
      file, self._file = self._file, None
      with paths.storage_errors(self.path):
        file.close()
    self.flush()
