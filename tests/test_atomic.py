"""atomic: whole-file writes that survive a power loss."""
import os
import stat

from electra_jax import atomic


def test_the_new_bytes_then_the_rename_reach_the_disk(tmp_path, monkeypatch):
  """The temporary file is fsynced before the rename (else some filesystems showed the renamed
  file empty after a power loss), the directory after it (else the old file came back)."""
  target = tmp_path / 'state.json'
  synced = []
  real_fsync = os.fsync

  def fsync(fd):
    kind = 'directory' if stat.S_ISDIR(os.fstat(fd).st_mode) else 'file'
    synced.append((kind, target.read_bytes() if target.exists() else None))
    real_fsync(fd)

  monkeypatch.setattr(os, 'fsync', fsync)
  atomic.write_bytes(str(target), b'old')
  atomic.write_text(str(target), 'new')
  assert synced == [('file', None), ('directory', b'old'), ('file', b'old'),
                    ('directory', b'new')]
  assert sorted(os.listdir(tmp_path)) == ['state.json']
