"""Device mesh and batch placement: one global jit program, batch sharded on the 'data' axis.

Each process builds only its own slice of the global batch; `global_batch` stitches the slices
into one global array, so the same code runs on 1 CPU, 8 GPUs or a TPU pod.
"""
from typing import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from electra_jax.errors import UserError

DATA_AXIS = 'data'


def make_mesh(devices=None) -> Mesh:
  devices = list(devices if devices is not None else jax.devices())
  return jax.make_mesh((len(devices),), (DATA_AXIS,),
                       axis_types=(jax.sharding.AxisType.Auto,), devices=devices)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_divides(global_batch: int, mesh: Mesh, key: str):
  """A global batch must split evenly over devices (and hence over processes)."""
  num_devices = mesh.devices.size
  if global_batch % num_devices:
    raise UserError(f'config.{key}={global_batch} is not divisible by the {num_devices} '
                    f'devices; use a multiple of {num_devices}')


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict:
  """Host-local numpy slices -> global jax.Arrays sharded over the 'data' axis."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
