"""TPU slices by name, as devices a program can be compiled for on a machine without a TPU.

jax.experimental.topologies describes a slice from libtpu (the TPU compiler and runtime, from
PyPI: `pip install -e '.[tpu]'`) without touching hardware; a jitted function lowered with
shardings over a Mesh of those devices compiles as it would on the slice. Names as libtpu
spells them (`v4:4x4x4`, `v5p:4x8x8`, `v5e:16x16`, `v6e:16x16`) or as Cloud accelerator types
(`v4-128`, `v5p-512`, `v5litepod-256`, `v6e-256`): v4-N and v5p-N count TensorCores, two per
chip (v4-128 = 64 chips = 4x4x4), v5litepod-N and v6e-N count chips. v4 and v5p devices are
one per chip (megacore), as JAX sees them on a TPU VM; a device's process is its TPU VM's.
"""
import contextlib
import glob
import math
import os
import re

from electra_jax import chips
from electra_jax.errors import UserError, first_line

# The Cloud slice shapes by chip count (the docs pages of chips.py): 3D tori for v4/v5p, 2D for
# v5e/v6e. Other shapes can be given in the libtpu spelling.
SHAPES = {
    3: {4: '2x2x1', 8: '2x2x2', 16: '2x2x4', 32: '2x4x4', 64: '4x4x4', 128: '4x4x8',
        256: '4x8x8', 512: '8x8x8', 1024: '8x8x16', 2048: '8x16x16', 4096: '16x16x16'},
    2: {1: '1x1', 4: '2x2', 8: '2x4', 16: '4x4', 32: '4x8', 64: '8x8', 128: '8x16',
        256: '16x16'},
}
EXAMPLES = 'v4:4x4x4, v4-128, v5p-256, v5litepod-256 or v6e-256'


def _dims(chip: chips.TpuChip) -> int:
  return 3 if chip.cores_per_chip == 2 else 2


def parse(name: str) -> tuple[chips.TpuChip, str]:
  """(chip, libtpu topology name such as 'v4:4x4x4') of a slice name in either spelling."""
  match = re.fullmatch(r'(v\w+?)(?::(\d+(?:x\d+)*)|-(\d+))', name.strip().lower())
  generations = {k: c for c in chips.TPU_CHIPS.values() for k in (c.name, c.slice_prefix)}
  chip = generations.get(match.group(1)) if match else None
  if chip is None:
    raise UserError(f'--topology={name!r} is not a TPU slice name this planner knows; use e.g. '
                    f'{EXAMPLES} (chips: {", ".join(chips.TPU_CHIPS)})')
  shapes = SHAPES[_dims(chip)]
  shape, count = match.group(2), match.group(3)
  if shape is not None:
    dims = [int(d) for d in shape.split('x')]
    if len(dims) != _dims(chip) or min(dims) < 1:
      raise UserError(f'--topology={name!r}: a {chip.name} slice has {_dims(chip)} dimensions of '
                      f'at least 1 chip; use e.g. {chip.name}:{shapes[64]}')
    return chip, f'{chip.name}:{shape}'
  cores = int(count)
  if cores % chip.cores_per_chip or cores // chip.cores_per_chip not in shapes:
    sizes = ','.join(str(n * chip.cores_per_chip) for n in shapes)
    raise UserError(f'--topology={name!r} is not a standard {chip.slice_prefix} slice; use '
                    f'{chip.slice_prefix}-N with N in {sizes}, or a shape such as '
                    f'{chip.name}:{shapes[64]}')
  return chip, f'{chip.name}:{shapes[cores // chip.cores_per_chip]}'


def num_chips(topology_name: str) -> int:
  return math.prod(int(n) for n in topology_name.split(':')[1].split('x'))


def _tpu_attached() -> bool:
  """A Google PCI device (vendor 0x1ae0) on this machine, as JAX's own TPU check looks."""
  for path in glob.glob('/sys/bus/pci/devices/*/vendor'):
    with open(path, encoding='ascii') as f:
      if f.read().strip() == '0x1ae0':
        return True
  return False


@contextlib.contextmanager
def _environment(variables: dict):
  """Environment variables not already set, set inside the block only."""
  added = {k: v for k, v in variables.items() if k not in os.environ}
  os.environ.update(added)
  try:
    yield
  finally:
    for k in added:
      os.environ.pop(k, None)


def _chips_per_host(chip: chips.TpuChip, topology_name: str) -> dict:
  """libtpu's default of 4 chips (2x2x1) a host is a TPU VM of v4, v5p and multi-host v5e/v6e
  slices, but refuses a 1x1 slice and splits the one VM of v5litepod-8/v6e-8 in two: a
  v5e/v6e slice of up to 8 chips is one VM (Cloud TPU's v5e and v6e pages: VMs by topology)."""
  dims = [int(d) for d in topology_name.split(':')[1].split('x')]
  if _dims(chip) == 2 and math.prod(dims) <= 8:
    return {'chips_per_host_bounds': (*dims, 1)}
  return {}


def devices(chip: chips.TpuChip, topology_name: str) -> list:
  """The devices of a parsed slice, for compiling ahead of time; no TPU needed."""
  try:
    import libtpu  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise UserError('--topology needs libtpu, the TPU compiler (no TPU needed); install it with '
                    "pip install -e '.[tpu]'") from None
  # Off a TPU VM: libtpu's lock on the TPU (/tmp/libtpu_lockfile) guards no hardware, so
  # planners and tests may compile side by side; and libtpu logs that it cannot find the VM's
  # accelerator type and worker hostnames (irrelevant to compiling) unless they are named.
  # libtpu reads these once, when it starts: they are set for that moment only.
  libtpu_env = {} if _tpu_attached() else {
      'ALLOW_MULTIPLE_LIBTPU_LOAD': '1', 'TPU_WORKER_HOSTNAMES': 'localhost',
      'TPU_ACCELERATOR_TYPE': f'{chip.slice_prefix}-'
                              f'{num_chips(topology_name) * chip.cores_per_chip}'}
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  # 'megacore': one JAX device per v4/v5p chip (its two TensorCores together), as on a TPU VM.
  chip_config = 'megacore' if chip.cores_per_chip == 2 else 'default'
  try:
    with _environment(libtpu_env):
      slice_devices = topologies.get_topology_desc(
          topology_name=topology_name, platform='tpu', chip_config_name=chip_config,
          **_chips_per_host(chip, topology_name)).devices
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f'libtpu does not accept the topology {topology_name!r} '
                    f'({first_line(e)}); use e.g. {EXAMPLES}') from None
  if len(slice_devices) != num_chips(topology_name):
    raise UserError(f'libtpu gave {len(slice_devices)} devices for {topology_name!r}, not one '
                    f'per chip ({num_chips(topology_name)}); try another libtpu version')
  return list(slice_devices)
