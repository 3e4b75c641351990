"""Multi-host start-up: join every process into one JAX program before any device is used.

`initialize()` runs jax.distributed.initialize when there is more than one process to join:
explicitly (--coordinator_address/--num_processes/--process_id, or the environment variables
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID), under an MPI launcher (mpirun /
mpiexec of Open MPI, MPICH, Intel MPI or MVAPICH2) or srun (a coordinator address is enough, the
launcher numbers the ranks), or detected on an srun step of several tasks, under Open MPI 4's
mpirun or on a Cloud TPU VM (where JAX reads the slice's workers from the metadata server).
Otherwise it does nothing and the run is single-process. A process of several that stops on an
error stops the others too (report_failure).
"""
import atexit
import dataclasses
import os
import re
import sys
import threading
import time

import jax
from absl import flags

from electra_jax.errors import UserError, first_line


def define_flags():
  """The multi-process flags, for train and evaluate (called by their flag definitions)."""
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 for a multi-process '
                      'run (default: $JAX_COORDINATOR_ADDRESS; auto on Cloud TPU VMs, SLURM '
                      'and Open MPI 4\'s mpirun).')
  flags.DEFINE_integer('num_processes', None, 'Number of processes of a multi-process run '
                       '(default: $JAX_NUM_PROCESSES; auto on Cloud TPU VMs, SLURM and MPI '
                       'launchers).')
  flags.DEFINE_integer('process_id', None, 'This process\'s index in [0, num_processes) '
                       '(default: $JAX_PROCESS_ID; auto on Cloud TPU VMs, SLURM and MPI '
                       'launchers).')


def _env_int(name, env=None):
  env = os.environ if env is None else env
  value = env.get(name)
  if value in (None, ''):
    return None
  try:
    return int(value)
  except ValueError as e:
    raise UserError(f'${name}={value!r} is not an integer; set it to a number') from e


@dataclasses.dataclass(frozen=True)
class LaunchedRank:
  """This process's place among the ranks a launcher (mpirun, mpiexec, srun) started."""
  launcher: str
  size_variable: str
  size: int
  rank: int
  local_rank: int | None
  local_size: int | None  # The launcher's ranks on this node.


# The variables MPI launchers set in every rank: (name, world size, rank, rank on this node,
# ranks on this node). Open MPI (4 and 5), MPICH / Intel MPI (Hydra's PMI), MVAPICH2.
MPI_LAUNCHERS = (
    ('Open MPI', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_LOCAL_RANK',
     'OMPI_COMM_WORLD_LOCAL_SIZE'),
    ('MPICH', 'PMI_SIZE', 'PMI_RANK', 'MPI_LOCALRANKID', 'MPI_LOCALNRANKS'),
    ('MVAPICH2', 'MV2_COMM_WORLD_SIZE', 'MV2_COMM_WORLD_RANK', 'MV2_COMM_WORLD_LOCAL_RANK',
     'MV2_COMM_WORLD_LOCAL_SIZE'),
)
# Open MPI 4's mpirun publishes its own address here; JAX derives the coordinator from it.
OPEN_MPI_LAUNCHER_URI = 'OMPI_MCA_orte_hnp_uri'


def launched_rank(env=None) -> LaunchedRank | None:
  """The rank an MPI launcher gave this process, or None outside one."""
  env = os.environ if env is None else env
  for launcher, size_var, rank_var, local_var, local_size_var in MPI_LAUNCHERS:
    size = _env_int(size_var, env)
    if size is not None:
      rank = _env_int(rank_var, env)
      if rank is None or not 0 <= rank < size:
        raise UserError(f'${size_var}={size} but ${rank_var}={env.get(rank_var)!r}: this rank '
                        f'does not know its place; start it with the {launcher} launcher')
      return LaunchedRank(launcher, size_var, size, rank, _env_int(local_var, env),
                          _env_int(local_size_var, env))
  return None


def slurm_step_tasks(env=None) -> int:
  """The tasks of the srun step this process is one of; 0 outside a step (a batch script or an
  salloc shell: SLURM sets the job's SLURM_NTASKS there, but only srun sets the step's)."""
  env = os.environ if env is None else env
  if not (env.get('SLURM_JOB_ID') and env.get('SLURM_STEP_NODELIST')):
    return 0
  return _env_int('SLURM_STEP_NUM_TASKS', env) or 0


def step_rank(env=None) -> LaunchedRank | None:
  """This task's place in the srun step it is one of, as launched_rank's for MPI; None outside
  a step."""
  env = os.environ if env is None else env
  tasks = slurm_step_tasks(env)
  if not tasks:
    return None
  procid = _env_int('SLURM_PROCID', env)
  if procid is None or not 0 <= procid < tasks:
    raise UserError(f'$SLURM_STEP_NUM_TASKS={tasks} but $SLURM_PROCID={env.get("SLURM_PROCID")!r}'
                    ': this task does not know its place; start it with srun')
  # The step's tasks on each node: '4(x2),3' is 4, 4, 3; this node is SLURM_NODEID.
  on_nodes = []
  for part in env.get('SLURM_STEP_TASKS_PER_NODE', '').split(','):
    match = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part)
    on_nodes += [int(match[1])] * int(match[2] or 1) if match else []
  node = _env_int('SLURM_NODEID', env)
  local_size = on_nodes[node] if node is not None and node < len(on_nodes) else None
  return LaunchedRank('srun', 'SLURM_STEP_NUM_TASKS', tasks, procid,
                      _env_int('SLURM_LOCALID', env), local_size)


def _same_place(rank: LaunchedRank, step: LaunchedRank | None) -> bool:
  """Whether an MPI rank is this srun task's own number (srun --mpi=pmi2 sets PMI_RANK and
  PMI_SIZE as its tasks'), not one of an mpirun inside the job."""
  return step is not None and (rank.size, rank.rank) == (step.size, step.rank)


def detected_cluster(env=None) -> str | None:
  """'slurm', 'tpu' or 'ompi' when this process is one of several that JAX can find on its own.

  An srun step of several tasks is one run, unless an MPI launcher inside the job started this
  process with ranks of its own (mpirun under SLURM starts one srun task per node, its daemon):
  the launcher closest to the process numbers it. srun's own PMI variables (--mpi=pmi2) name
  the same processes as its tasks.
  """
  env = os.environ if env is None else env
  step, mpi_rank = step_rank(env), launched_rank(env)
  if step is not None and step.size > 1 and (mpi_rank is None or _same_place(mpi_rank, step)):
    return 'slurm'
  # A GKE TPU pod's workers, as JAX reads them, but only where TPU chips are attached, as JAX
  # requires: these variables alone (e.g. set for libtpu to compile for a topology) are no pod.
  if (env.get('TPU_WORKER_HOSTNAMES') or env.get('TPU_PROCESS_ADDRESSES')) and (
      attached_tpu_chips() > 0):
    return 'tpu'
  if env.get(OPEN_MPI_LAUNCHER_URI) and (_env_int('OMPI_COMM_WORLD_SIZE', env) or 1) > 1:
    return 'ompi'
  if attached_tpu_chips() > 0:
    return 'tpu'
  return None


def attached_tpu_chips() -> int:
  """TPU chips on this machine's PCI bus: JAX's own Cloud TPU VM probe, private, so its
  absence counts as none."""
  try:
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel
    return hardware_utils.num_available_tpu_chips_and_device_id()[0]
  except (ImportError, AttributeError, OSError):
    return 0


def rank_devices(rank: LaunchedRank, env) -> list[int] | None:
  """The local devices a launched rank drives: the one of its local rank, as JAX's SLURM and
  Open MPI bootstraps choose, or every device it sees where a wrapper already bound the ranks
  (CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES list fewer devices than the node has ranks, or
  than its local rank needs), so that every rank of a node takes alike: two GPUs each for 4
  ranks bound to 0,1 / 2,3 / 4,5 / 6,7. None: JAX_LOCAL_DEVICE_IDS decides, or no local rank
  is known."""
  if rank.local_rank is None or env.get('JAX_LOCAL_DEVICE_IDS'):
    return None
  for name in ('CUDA_VISIBLE_DEVICES', 'ROCR_VISIBLE_DEVICES'):
    if name in env:
      visible = [d for d in env[name].split(',') if d]
      if len(visible) < max(rank.local_rank + 1, rank.local_size or 0):
        return list(range(len(visible)))
  return [rank.local_rank]


def join_plan(coordinator_address=None, num_processes=None, process_id=None,
              env=None) -> tuple[str, dict | None]:
  """(how this process joins, jax.distributed.initialize's arguments; None: a single process).

  Explicit values (flags, else $JAX_COORDINATOR_ADDRESS / $JAX_NUM_PROCESSES / $JAX_PROCESS_ID)
  come first, and the process drives every local device ($JAX_LOCAL_DEVICE_IDS aside); under an
  MPI launcher or in an srun step a coordinator address is enough, the launcher gives the
  process count and id (and, as JAX does for SLURM and Open MPI, one local device per rank;
  without the address an srun step is left to JAX's own SLURM detection). Either way JAX's own
  cluster detection is off: what it finds would override the launcher's choice.
  A launcher with several ranks and no way to find a coordinator is an error, never several
  independent runs writing one workdir; so is a SLURM job of several tasks whose batch script
  runs the command itself instead of through srun.
  """
  env = os.environ if env is None else env
  coordinator_address = coordinator_address or env.get('JAX_COORDINATOR_ADDRESS')
  num_processes = (num_processes if num_processes is not None
                   else _env_int('JAX_NUM_PROCESSES', env))
  process_id = process_id if process_id is not None else _env_int('JAX_PROCESS_ID', env)
  rank = launched_rank(env)
  if coordinator_address and num_processes is None and process_id is None:
    # The launcher closest to the process numbers it: mpirun's ranks, else srun's step (also
    # where srun's own PMI variables, --mpi=pmi2, number its tasks: they lack a local rank).
    step = step_rank(env)
    launched = rank if rank is not None and rank.size > 1 and not _same_place(rank, step) else step
    if launched is not None and launched.size > 1:
      return ('slurm' if launched.launcher == 'srun' else 'mpi'), dict(
          coordinator_address=coordinator_address, num_processes=launched.size,
          process_id=launched.rank, local_device_ids=rank_devices(launched, env),
          cluster_detection_method='deactivate')
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    if None in explicit:
      raise UserError('a multi-process run needs all of --coordinator_address, '
                      f'--num_processes and --process_id (got {coordinator_address!r}, '
                      f'{num_processes!r}, {process_id!r}); set the missing ones')
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise UserError(f'--process_id={process_id} must be in [0, --num_processes='
                      f'{num_processes})')
    # JAX's cluster detection would still fill in the devices: under SLURM or Open MPI one GPU,
    # SLURM_LOCALID's, where launch/multinode.sh's process drives every GPU of its node.
    return 'explicit', dict(coordinator_address=coordinator_address,
                            num_processes=num_processes, process_id=process_id,
                            cluster_detection_method='deactivate')
  cluster = detected_cluster(env)
  # JAX finds the coordinator; the rank's devices as for other launchers (JAX's own choice, the
  # local rank's one device, misses tasks that srun --gpus-per-task bound to several).
  if cluster == 'ompi':
    return cluster, dict(local_device_ids=rank_devices(rank, env))
  if cluster == 'slurm':
    return cluster, dict(local_device_ids=rank_devices(step_rank(env), env))
  if cluster is not None:
    return cluster, {}
  if rank is not None and rank.size > 1:
    raise UserError(
        f'{rank.launcher} started {rank.size} ranks (${rank.size_variable}={rank.size}) but '
        'they have no coordinator to join; give every rank rank 0\'s host and a free port, '
        'e.g. mpirun -x JAX_COORDINATOR_ADDRESS=node0:8476 (Open MPI) or '
        '-genv JAX_COORDINATOR_ADDRESS=node0:8476 (MPICH), or --coordinator_address')
  job_tasks = _env_int('SLURM_NTASKS', env) if env.get('SLURM_JOB_ID') else None
  if rank is None and job_tasks and job_tasks > 1 and not slurm_step_tasks(env):
    raise UserError(
        f'SLURM job {env["SLURM_JOB_ID"]} has {job_tasks} tasks ($SLURM_NTASKS={job_tasks}) '
        'but this process is not one of them (a batch script or salloc shell runs once); start '
        'the command with srun so every task joins one run (launch/slurm_gpu.sh), or with '
        'srun --ntasks=1 for a single process')
  return 'single', None


def require_one_process(command: str, env=None):
  """For commands that run as one process on the host's devices (finetune, export): several
  ranks of an MPI launcher, or tasks of an srun step, would be independent copies writing one
  output."""
  rank = launched_rank(env)
  if rank is not None and rank.size > 1:
    raise UserError(f'{command} runs as one process, but {rank.launcher} started {rank.size} '
                    f'(${rank.size_variable}={rank.size}); start it once, without mpirun')
  tasks = slurm_step_tasks(env)
  if tasks > 1:
    raise UserError(f'{command} runs as one process, but srun started {tasks} '
                    f'($SLURM_STEP_NUM_TASKS={tasks}); start it once, with srun --ntasks=1')


def initialize(coordinator_address=None, num_processes=None, process_id=None) -> str:
  """Joins the multi-process run if there is one (join_plan); returns how ('explicit', 'mpi',
  'slurm', 'tpu', 'ompi' or 'single'). Must run before anything touches a device."""
  mode, arguments = join_plan(coordinator_address, num_processes, process_id)
  if arguments is not None:
    try:
      jax.distributed.initialize(**arguments)
    except ValueError as e:  # JAX found no coordinator, process count or id where we expected.
      raise UserError(
          f'this process looked like one of a multi-process run ({mode}) but JAX could not '
          f'join it ({first_line(e)}); pass --coordinator_address, --num_processes and '
          '--process_id (or $JAX_COORDINATOR_ADDRESS, $JAX_NUM_PROCESSES, $JAX_PROCESS_ID)') from e
    _watch_for_a_failed_process()
  return mode


# Each process waits in a thread for its key in the coordinator's key-value store: a process
# that stops on an error writes its message under every other's key, and each stops at once; a
# process that ends normally writes '' under its own, which ends its wait.
STOP_KEY = 'electra_jax/stop/{}'
_watch = None  # (thread, client, this process's key) while the thread waits.
# Set by report_failure before it writes: a peer's message no longer ends this process, which
# tells the rest first (two processes failing together each stopped the other half-way).
_reporting = threading.Event()


def _joined():
  """jax.distributed's state: its client, process_id and num_processes (private, as Orbax reads
  it: jax.process_index() would start the backend, which waits for every process)."""
  from jax._src import distributed as jax_distributed  # pylint: disable=import-outside-toplevel
  return jax_distributed.global_state


def preemption_service_running() -> bool:
  """Whether JAX's preemption service took SIGTERM (jax_enable_preemption_service, on by
  default in a multi-process run): it then tells every process to stop at one step."""
  return _joined().preemption_sync_manager is not None


def _watch_for_a_failed_process():
  """Stops this process as soon as another reports that it failed (report_failure). Without
  this a peer's exit leaves the others in a collective or a barrier until JAX's heartbeat
  timeout (100 s) aborts them with a C++ stack dump."""
  global _watch  # pylint: disable=global-statement
  state = _joined()
  client, index = state.client, state.process_id
  key = STOP_KEY.format(index)

  def watch():
    while True:
      try:
        message = client.blocking_key_value_get(key, 3_600_000)
        break
      except Exception as e:  # pylint: disable=broad-except
        if 'DEADLINE_EXCEEDED' not in str(e):
          return  # jax.distributed shut down, or the coordinator is gone (JAX reports that).
    if message and not _reporting.is_set():
      _stop_for(message, index)

  thread = threading.Thread(target=watch, name='failed-process-watch', daemon=True)
  thread.start()
  _watch = (thread, client, key)
  atexit.register(stop_watching)  # Runs before JAX's own shutdown, registered earlier.


def stop_watching():
  """Ends the watch thread, before jax.distributed shuts down: a thread still waiting in its
  client when the interpreter exits aborts the process ('FATAL: exception not rethrown')."""
  global _watch  # pylint: disable=global-statement
  if _watch is None:
    return
  thread, client, key = _watch
  _watch = None
  try:
    client.key_value_set(key, '')
  except Exception:  # pylint: disable=broad-except  # A peer's failure woke it already.
    pass
  thread.join(timeout=10)


def report_failure(message: str):
  """Tells the other processes of a multi-process run that this one stops on an error (their
  watch thread ends them with `message`): called just before this process exits."""
  state = _joined()
  if state.client is None:  # Failed while leaving the run: nobody waits for it any more.
    return
  _reporting.set()
  message = f'process {state.process_id} of {state.num_processes} failed: {message}'
  # Process 0 last: it holds the key-value store, and the others, this one too, abort with a
  # C++ stack dump if it ends before them (_let_the_others_leave_first).
  for other in [*range(1, state.num_processes), 0]:
    if other != state.process_id:
      try:
        state.client.key_value_set(STOP_KEY.format(other), message)
      except Exception:  # pylint: disable=broad-except  # Told by another failed process.
        pass
  _let_the_others_leave_first(state.process_id)


def stop_if_another_failed():
  """Ends this process as its watch would if another left it a failure message: a collective
  that fails because that process exited (Gloo's "Connection reset by peer") is reported as the
  other's failure, not as this process's own (the watch thread may not have run yet)."""
  state = _joined()
  if state.client is None or _watch is None:
    return
  try:  # The message is written before the failed process exits; allow a loaded store time.
    message = state.client.blocking_key_value_get(STOP_KEY.format(state.process_id), 2000)
  except Exception:  # pylint: disable=broad-except  # None left: this process's own error.
    return
  if message:
    _stop_for(message, state.process_id)


def _stop_for(message: str, process_id: int):
  """Ends this process on another's failure `message` (report_failure's)."""
  print(f'error: {message}; this process stops too', file=sys.stderr, flush=True)
  sys.stdout.flush()
  _let_the_others_leave_first(process_id)
  os._exit(1)  # pylint: disable=protected-access


def _let_the_others_leave_first(process_id: int):
  """Before a failed run's process exits: process 0 holds the coordination service, whose end
  aborts every process still running (JAX's error polling), so it waits a second for the
  others to read their message and exit first."""
  if process_id == 0:
    time.sleep(1)


def initialize_from(flag_values) -> str:
  """initialize() with a command's parsed --coordinator_address/--num_processes/--process_id."""
  return initialize(flag_values.coordinator_address, flag_values.num_processes,
                    flag_values.process_id)
