"""Multi-host start-up: join every process into one JAX program before any device is used.

`initialize()` runs jax.distributed.initialize when there is more than one process to join:
explicitly (--coordinator_address/--num_processes/--process_id, or the environment variables
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID), or detected on a SLURM job with
several tasks or on a Cloud TPU VM (where JAX reads the slice's workers from the metadata
server). Otherwise it does nothing and the run is single-process.
"""
import os

import jax
from absl import flags

from electra_jax.errors import UserError


def define_flags():
  """The multi-process flags, for train and evaluate (called by their flag definitions)."""
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 for a multi-process '
                      'run (default: $JAX_COORDINATOR_ADDRESS; auto on Cloud TPU VMs and SLURM).')
  flags.DEFINE_integer('num_processes', None, 'Number of processes of a multi-process run '
                       '(default: $JAX_NUM_PROCESSES; auto on Cloud TPU VMs and SLURM).')
  flags.DEFINE_integer('process_id', None, 'This process\'s index in [0, num_processes) '
                       '(default: $JAX_PROCESS_ID; auto on Cloud TPU VMs and SLURM).')


def _env_int(name):
  value = os.environ.get(name)
  if value in (None, ''):
    return None
  try:
    return int(value)
  except ValueError as e:
    raise UserError(f'${name}={value!r} is not an integer; set it to a number') from e


def detected_cluster(env=None) -> str | None:
  """'slurm' or 'tpu' when this process is one of several that JAX can find on its own."""
  env = os.environ if env is None else env
  if env.get('SLURM_JOB_ID') and int(env.get('SLURM_NTASKS', '1') or 1) > 1:
    return 'slurm'
  if env.get('TPU_WORKER_HOSTNAMES') or env.get('TPU_PROCESS_ADDRESSES'):
    return 'tpu'
  try:  # JAX's own Cloud TPU VM probe (PCI device ids); private, so tolerate its absence.
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
      return 'tpu'
  except (ImportError, AttributeError, OSError):
    pass
  return None


def initialize(coordinator_address=None, num_processes=None, process_id=None) -> str:
  """Joins the multi-process run if there is one; returns how ('explicit', 'slurm', 'tpu',
  'single'). Must run before anything touches a device."""
  coordinator_address = coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS')
  num_processes = num_processes if num_processes is not None else _env_int('JAX_NUM_PROCESSES')
  process_id = process_id if process_id is not None else _env_int('JAX_PROCESS_ID')
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    if None in explicit:
      raise UserError('a multi-process run needs all of --coordinator_address, '
                      f'--num_processes and --process_id (got {coordinator_address!r}, '
                      f'{num_processes!r}, {process_id!r}); set the missing ones')
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise UserError(f'--process_id={process_id} must be in [0, --num_processes='
                      f'{num_processes})')
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return 'explicit'
  cluster = detected_cluster()
  if cluster is None:
    return 'single'
  jax.distributed.initialize()
  return cluster


def initialize_from(flag_values) -> str:
  """initialize() with a command's parsed --coordinator_address/--num_processes/--process_id."""
  return initialize(flag_values.coordinator_address, flag_values.num_processes,
                    flag_values.process_id)
