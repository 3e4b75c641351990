"""Peak memory of this process's first device, for the benchmark and the training log."""
import platform
import resource

import jax


def peak() -> dict:
  """The device allocator's peak (and its limit) where the backend reports them (GPU, TPU),
  else the process's peak RSS (CPU: host runtime, data and compiler included)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    return dict(peak_memory_bytes=int(stats['peak_bytes_in_use']),
                memory_limit_bytes=stats.get('bytes_limit'),
                peak_memory_source='device memory_stats peak_bytes_in_use')
  return dict(peak_memory_bytes=peak_rss_bytes(), memory_limit_bytes=None,
              peak_memory_source='process peak RSS (includes host runtime, data and compiler)')


def peak_rss_bytes() -> int:
  """This process's own peak resident set. Linux: /proc/self/status VmHWM, which starts afresh
  at exec; getrusage's ru_maxrss there keeps the peak of the process that launched this one
  (a command started from a large parent, e.g. a test runner, would report the parent's)."""
  try:
    with open('/proc/self/status', encoding='ascii') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) * 1024  # kB
  except OSError:
    pass
  scale = 1 if platform.system() == 'Darwin' else 1024  # ru_maxrss: bytes on macOS, else KiB.
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def describe(memory: dict) -> str:
  """'peak memory 49.3 GB of 79.1 GB (device)' or 'peak memory 1.2 GB (process RSS)'."""
  limit = memory['memory_limit_bytes']
  where = 'device' if memory['peak_memory_source'].startswith('device') else 'process RSS'
  return (f'peak memory {memory["peak_memory_bytes"] / 1e9:.1f} GB'
          + (f' of {limit / 1e9:.1f} GB' if limit else '') + f' ({where})')
