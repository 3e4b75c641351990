"""Device mesh, shardings and batch placement: one global jit program over every device.

The mesh spans all devices of all processes: ('data',) by default, or ('data', 'fsdp') when
config.fsdp_axis_size > 1, which also splits parameters and optimizer state over 'fsdp'. The
batch is sharded over every mesh axis. Each process builds only the rows of the global batch its
devices hold (`process_rows`); `global_batch` stitches them into one global array, so the same
code, and the same row for each example, runs on 1 CPU, 8 GPUs or a TPU pod.
"""
from typing import Mapping

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from electra_jax.errors import UserError

DATA_AXIS = 'data'
FSDP_AXIS = 'fsdp'


def make_mesh(devices=None, fsdp_axis_size: int = 1) -> Mesh:
  """('data',) over all devices, or ('data', 'fsdp') with fsdp_axis_size devices per group."""
  devices = list(devices if devices is not None else jax.devices())
  if fsdp_axis_size <= 1:
    return jax.make_mesh((len(devices),), (DATA_AXIS,),
                         axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
  if len(devices) % fsdp_axis_size:
    raise UserError(f'config.fsdp_axis_size={fsdp_axis_size} does not divide the '
                    f'{len(devices)} devices; use a divisor of {len(devices)}')
  shape, names = (len(devices) // fsdp_axis_size, fsdp_axis_size), (DATA_AXIS, FSDP_AXIS)
  axis_types = (jax.sharding.AxisType.Auto,) * 2
  try:
    return jax.make_mesh(shape, names, axis_types=axis_types, devices=devices)
  except NotImplementedError:
    # jax.make_mesh lays a mesh axis over whole physical axes of a TPU slice (v5e aside): on
    # a 4x4x4 slice (v4-128, v5p-128) an fsdp axis of 2, 8 or 32 needs one of them split.
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    return Mesh(grid, names, axis_types=axis_types)


def batch_sharding(mesh: Mesh, steps_axis: bool = False) -> NamedSharding:
  """Batch rows split over every mesh axis (data, and fsdp when present); with `steps_axis`
  the rows are the second axis, after one of the steps run in one call (train.py)."""
  return NamedSharding(mesh, P(None, mesh.axis_names) if steps_axis else P(mesh.axis_names))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def leaf_sharding(mesh: Mesh, shape) -> NamedSharding:
  """FSDP rule: split the largest dimension divisible by the 'fsdp' axis; else replicate."""
  if FSDP_AXIS not in mesh.axis_names:
    return replicated(mesh)
  size = mesh.shape[FSDP_AXIS]
  divisible = [d for d in range(len(shape)) if shape[d] % size == 0]
  if not divisible:
    return replicated(mesh)
  dim = max(divisible, key=lambda d: shape[d])
  spec = [None] * len(shape)
  spec[dim] = FSDP_AXIS
  return NamedSharding(mesh, P(*spec))


# train warns above this share of unsplit bytes (a few small arrays, biases and LayerNorms, are
# always whole; at fsdp 3 on Large 91 % were).
UNSPLIT_WARNING = 0.25


def unsplit_fraction(mesh: Mesh, abstract_tree) -> float:
  """The share of the tree's bytes that leaf_sharding leaves whole on every device: most of
  it where the fsdp axis (3, 5, 6) divides none of the model's widths."""
  sizes = [(x.size * x.dtype.itemsize, x.shape) for x in jax.tree.leaves(abstract_tree)]
  whole = sum(n for n, shape in sizes
              if all(axis is None for axis in leaf_sharding(mesh, shape).spec))
  return whole / max(1, sum(n for n, _ in sizes))


def tree_shardings(mesh: Mesh, abstract_tree):
  """Per-leaf shardings of a pytree of arrays / ShapeDtypeStructs (params, optimizer state)."""
  return jax.tree.map(lambda x: leaf_sharding(mesh, x.shape), abstract_tree)


def fill_up_to_devices(batch_size: int, mesh: Mesh) -> int:
  """The smallest multiple of the mesh's devices holding `batch_size` rows: a batch that
  cannot change the result (evaluation, prediction) is filled up with empty rows to split."""
  num_devices = mesh.devices.size
  return -(-batch_size // num_devices) * num_devices


def check_batch_divides(global_batch: int, mesh: Mesh, name: str, grad_accum_steps: int = 1):
  """A global batch must split evenly over devices x accumulation steps (and so over hosts).
  `name`: the batch as the user sets it, e.g. 'config.train_batch_size' or '--batch_size'."""
  num_devices = mesh.devices.size
  if global_batch % (num_devices * grad_accum_steps):
    what = f'{num_devices} devices'
    if grad_accum_steps > 1:
      what += f' x config.grad_accum_steps={grad_accum_steps}'
    multiple = num_devices * grad_accum_steps
    raise UserError(f'{name}={global_batch} is not divisible by the {what}; use a '
                    f'multiple of {multiple}')


def process_rows(mesh: Mesh, batch_size: int, process_index: int | None = None) -> np.ndarray:
  """The rows of a global batch of `batch_size` that a process's devices hold (default: this
  process), ascending: the order global_batch places its local rows in. Not one block on a
  TPU slice, where jax.make_mesh interleaves the hosts' devices along the data axis."""
  process_index = jax.process_index() if process_index is None else process_index
  held = batch_sharding(mesh).devices_indices_map((batch_size,))
  return np.array(sorted({row for device, (rows,) in held.items()
                          if device.process_index == process_index
                          for row in range(*rows.indices(batch_size)[:2])}), np.int64)


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh,
                 steps_axis: bool = False) -> dict:
  """Host-local numpy slices -> global jax.Arrays sharded over the batch axes (`steps_axis`:
  batches of several steps stacked on a leading axis, as batch_sharding). The local rows are
  the global rows process_rows names, in its order."""
  sharding = batch_sharding(mesh, steps_axis)
  num_local = len(mesh.local_devices)
  out = {}
  for k, v in local_batch.items():
    v = np.asarray(v)
    rows = v.shape[1 if steps_axis else 0]
    if rows % num_local:
      raise UserError(f'this process holds {rows} rows of the batch, not divisible by '
                      f'its {num_local} local devices; use a global batch divisible by '
                      f'{mesh.devices.size} with the same device count on every process')
    out[k] = jax.make_array_from_process_local_data(sharding, v)
  return out


def replicated_arrays(host_values: Mapping[str, np.ndarray], mesh: Mesh) -> dict:
  """Host values, the same on every process -> replicated global arrays (e.g. the metric window
  the train call adds into)."""
  sharding = replicated(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in host_values.items()}
