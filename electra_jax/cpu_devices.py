"""One XLA device per CPU core on a CPU run (--cpu_devices, 'auto' by default).

XLA's CPU runtime runs the element-wise work between one program's matmuls mostly on one
thread: the two cores of the CI machine were busy together ~8 % of an ELECTRA-Small step.
Splitting the batch over one CPU device per core runs that work side by side (Small, batch 32:
1.3x tokens/s on 2 cores; benchmarks/RESULTS.md). Results do not depend on the device count
(masks, sampling and dropout are drawn per example; tested), but each device keeps its own copy
of the parameters and optimizer state: --cpu_devices=1 keeps one.

Only the CPU platform is affected; on a GPU or TPU host the extra CPU devices stay unused.
"""
import math
import os
import re

import jax
from absl import flags

from electra_jax.errors import UserError

AUTO_MAX = 8


def define_flag():
  """--cpu_devices, for the commands that run a model (called by their flag definitions)."""
  flags.DEFINE_string('cpu_devices', 'auto', 'XLA devices to split a CPU run into: a number, or '
                      "'auto' = one per usable core (at most 8), the most that divides the "
                      'per-step batch. Each holds a copy of the parameters; 1 turns this off. '
                      'Where $JAX_NUM_CPU_DEVICES or XLA_FLAGS already set the count, it '
                      'must agree (auto takes theirs).')


def preset_count(env=None) -> int | None:
  """A CPU device count the user already chose through JAX's own settings, else None.
  ($JAX_NUM_CPU_DEVICES needs no reading here: JAX folds it into jax_num_cpu_devices, and
  rejects a non-number, when it is imported.)"""
  env = os.environ if env is None else env
  if jax.config.jax_num_cpu_devices >= 0:  # JAX lets it override XLA_FLAGS' count.
    return jax.config.jax_num_cpu_devices
  counts = re.findall(r'--xla_force_host_platform_device_count=(\d+)', env.get('XLA_FLAGS', ''))
  return int(counts[-1]) if counts else None  # XLA takes a repeated flag's last value.


def usable_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # macOS
    return os.cpu_count() or 1


def auto_count(cores: int, batch_sizes, multiple_of: int = 1) -> int:
  """The largest count <= min(cores, AUTO_MAX) that divides every batch in `batch_sizes` and
  is a multiple of `multiple_of` (config.fsdp_axis_size); 1 when there is none."""
  common = math.gcd(*[int(b) for b in batch_sizes]) if batch_sizes else 1
  fits = [n for n in range(1, min(cores, AUTO_MAX) + 1)
          if common % n == 0 and n % multiple_of == 0]
  return max(fits, default=1)


def parse(value: str) -> int | None:
  """--cpu_devices as a count, or None for 'auto'."""
  if value == 'auto':
    return None
  try:
    count = int(value)
  except ValueError:
    count = 0
  if count < 1:
    raise UserError(f"--cpu_devices={value!r} is not a positive number or 'auto'; pass e.g. "
                    '--cpu_devices=2, or --cpu_devices=1 for a single CPU device')
  return count


def configure(value: str, batch_sizes, single_process: bool = True,
              multiple_of: int = 1) -> int | None:
  """Sets JAX's CPU device count before its backend starts; returns the count set, or None
  when it was left alone (JAX already running, a count preset, auto on a multi-process run or
  auto finding nothing to split)."""
  requested = parse(value)
  preset = preset_count()
  if preset is not None:
    if requested is not None and requested != preset:
      raise UserError(f'--cpu_devices={requested} contradicts the {preset} CPU devices set by '
                      '$JAX_NUM_CPU_DEVICES / XLA_FLAGS; drop one of them')
    return None
  count = requested
  if requested is None:
    count = auto_count(usable_cores(), batch_sizes, multiple_of) if single_process else 1
    if count == 1:
      return None
  try:
    jax.config.update('jax_num_cpu_devices', count)
  except RuntimeError as e:  # JAX already runs in this process (a notebook, a test)
    if requested is None:
      return None
    raise UserError(f'--cpu_devices={requested} must be set before JAX starts; this process '
                    f'already runs {len(jax.devices("cpu"))} CPU device(s)') from e
  return count


def configure_for(config, value: str, single_process: bool = True) -> int | None:
  """configure() with --cpu_devices=`value` for an experiment config's per-step batches."""
  accum = max(1, config.get('grad_accum_steps', 1))
  batches = [config.train_batch_size // accum, config.get('eval_batch_size', 0)]
  return configure(value, [b for b in batches if b],
                   single_process, max(1, config.get('fsdp_axis_size', 1)))
