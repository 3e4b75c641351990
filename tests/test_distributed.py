"""Multi-process start-up: which launchers join their processes into one run, and how.

The join decision (distributed.join_plan) is checked on the environments each launcher sets; two
real processes then join on localhost from exactly those variables (an srun step and Open MPI
4's mpirun, whose addresses JAX reads, and MPICH's mpiexec given a coordinator), and a launcher
with several ranks but no coordinator, or a SLURM batch script of several tasks run without
srun, stops with one line instead of starting independent runs on one workdir, as do finetune
and export (one-process commands) started as several ranks.
"""
import json
import os
import subprocess
import sys
import time

import portpicker
import pytest

from electra_jax import distributed
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT


def open_mpi_4(size, rank, local_rank=None):
  """What Open MPI 4's mpirun sets in each rank (its own address in orte_hnp_uri)."""
  return {'OMPI_MCA_orte_hnp_uri': '1531576320.0;tcp://127.0.0.1:34911',
          'OMPI_COMM_WORLD_SIZE': str(size), 'OMPI_COMM_WORLD_RANK': str(rank),
          'OMPI_COMM_WORLD_LOCAL_RANK': str(rank if local_rank is None else local_rank),
          'OMPI_COMM_WORLD_LOCAL_SIZE': str(size)}


def open_mpi_5(size, rank):
  """Open MPI 5 (PRRTE) numbers the ranks but publishes no address JAX can use."""
  env = open_mpi_4(size, rank)
  del env['OMPI_MCA_orte_hnp_uri']
  return env


def mpich(size, rank):
  """Hydra's mpiexec (MPICH, Intel MPI)."""
  return {'PMI_SIZE': str(size), 'PMI_RANK': str(rank), 'MPI_LOCALRANKID': str(rank),
          'MPI_LOCALNRANKS': str(size)}


def srun_task(tasks, procid, job_tasks=None):
  """What srun sets in each task of a step (Slurm's env_array_for_step plus slurmstepd's ids);
  SLURM_NTASKS is the step's, the job's count only under srun --preserve-env."""
  return {'SLURM_JOB_ID': '7', 'SLURM_NTASKS': str(job_tasks or tasks),
          'SLURM_STEP_ID': '0', 'SLURM_STEP_NODELIST': 'localhost',
          'SLURM_STEP_NUM_NODES': '1', 'SLURM_STEP_NUM_TASKS': str(tasks),
          'SLURM_STEP_TASKS_PER_NODE': str(tasks), 'SLURM_PROCID': str(procid),
          'SLURM_LOCALID': str(procid), 'SLURM_NODEID': '0'}


def slurm_batch_script(job_tasks):
  """A batch script's environment (env_array_for_batch_job): the job's task count, no step."""
  return {'SLURM_JOB_ID': '7', 'SLURM_NTASKS': str(job_tasks), 'SLURM_JOB_NODELIST': 'n[0-1]',
          'SLURM_NODELIST': 'n[0-1]', 'ENVIRONMENT': 'BATCH', 'SLURM_PROCID': '0',
          'SLURM_LOCALID': '0'}


def test_cluster_detection_from_environment(monkeypatch):
  assert distributed.detected_cluster(srun_task(4, 2)) == 'slurm'
  assert distributed.detected_cluster(open_mpi_4(2, 1)) == 'ompi'
  assert distributed.detected_cluster(open_mpi_4(1, 0)) is None
  with pytest.raises(UserError, match='--coordinator_address'):
    distributed.initialize(num_processes=2, process_id=0)
  # A GKE TPU pod's variables name a pod only where TPU chips are attached (as JAX requires);
  # alone (libtpu compiling for a topology sets one) they are a single process, not a crash.
  for name in ('TPU_WORKER_HOSTNAMES', 'TPU_PROCESS_ADDRESSES'):
    monkeypatch.setattr(distributed, 'attached_tpu_chips', lambda: 0)
    assert distributed.join_plan(env={name: 'localhost'}) == ('single', None)
    monkeypatch.setattr(distributed, 'attached_tpu_chips', lambda: 4)
    assert distributed.detected_cluster({name: 'a,b'}) == 'tpu'


def test_a_detected_run_that_jax_cannot_join_is_one_line_naming_the_flags(monkeypatch):
  """JAX's own detection can still miss what ours saw: its ValueError becomes a UserError."""
  def initialize(**_):
    raise ValueError('coordinator_address should be defined.')
  monkeypatch.setattr(distributed.jax.distributed, 'initialize', initialize)
  monkeypatch.setattr(distributed, 'join_plan', lambda *_: ('tpu', {}))
  with pytest.raises(UserError, match=r'multi-process run \(tpu\) but JAX could not join it '
                                      r'\(coordinator_address should be defined.\); pass '
                                      r'--coordinator_address, --num_processes and --process_id'):
    distributed.initialize()


def test_a_launcher_numbers_the_ranks_once_a_coordinator_is_given():
  plan = distributed.join_plan(env=dict(mpich(4, 2), JAX_COORDINATOR_ADDRESS='node0:8476'))
  assert plan == ('mpi', dict(coordinator_address='node0:8476', num_processes=4, process_id=2,
                              local_device_ids=[2], cluster_detection_method='deactivate'))
  # The flag counts as the coordinator too; JAX_LOCAL_DEVICE_IDS (JAX's own) keeps its say.
  plan = distributed.join_plan('node0:1', env=dict(open_mpi_5(2, 1), JAX_LOCAL_DEVICE_IDS='0,1'))
  assert plan == ('mpi', dict(coordinator_address='node0:1', num_processes=2, process_id=1,
                              local_device_ids=None, cluster_detection_method='deactivate'))
  # A wrapper that bound each rank to its GPU leaves it that GPU; all GPUs visible: its own.
  bound = dict(mpich(4, 2), CUDA_VISIBLE_DEVICES='2')
  assert distributed.join_plan('h:1', env=bound)[1]['local_device_ids'] == [0]
  every = dict(mpich(4, 2), CUDA_VISIBLE_DEVICES='0,1,2,3')
  assert distributed.join_plan('h:1', env=every)[1]['local_device_ids'] == [2]
  mvapich = {'MV2_COMM_WORLD_SIZE': '2', 'MV2_COMM_WORLD_RANK': '1'}
  assert distributed.join_plan('h:1', env=mvapich)[1]['process_id'] == 1
  # Explicit counts win over the launcher's; JAX finds Open MPI 4's coordinator by itself.
  assert distributed.join_plan('h:1', 8, 3, env=mpich(4, 2)) == (
      'explicit', dict(coordinator_address='h:1', num_processes=8, process_id=3,
                       cluster_detection_method='deactivate'))
  assert distributed.join_plan(env=open_mpi_4(2, 1)) == ('ompi', {'local_device_ids': [1]})
  assert distributed.join_plan(env=dict(open_mpi_4(2, 1), CUDA_VISIBLE_DEVICES='5')) == (
      'ompi', {'local_device_ids': [0]})
  # One rank, or no launcher: a single process whatever else is set.
  assert distributed.join_plan(env=mpich(1, 0)) == ('single', None)
  assert distributed.join_plan(env={'HOME': '/root'}) == ('single', None)


def test_ranks_bound_to_several_gpus_each_take_every_gpu_they_see():
  """A wrapper binding 2 GPUs to each of a node's 4 ranks (0,1 / 2,3 / 4,5 / 6,7): each takes
  both. Ranks 0 and 1 took one GPU, their local rank's index (rank 1's was GPU 3), and ranks 2
  and 3 both of theirs: the list is shorter than the node's ranks, not only than the rank."""
  for launcher in (mpich, open_mpi_5):
    for local in range(4):
      env = dict(launcher(4, local), CUDA_VISIBLE_DEVICES=f'{2 * local},{2 * local + 1}')
      assert distributed.join_plan('h:1', env=env)[1]['local_device_ids'] == [0, 1], local
  rocm = dict(mpich(4, 0), ROCR_VISIBLE_DEVICES='0,1')
  assert distributed.join_plan('h:1', env=rocm)[1]['local_device_ids'] == [0, 1]
  # As many GPUs visible as ranks on the node, or more: each rank its own.
  for visible in ('0,1,2,3', '0,1,2,3,4,5,6,7'):
    env = dict(mpich(4, 1), CUDA_VISIBLE_DEVICES=visible)
    assert distributed.join_plan('h:1', env=env)[1]['local_device_ids'] == [1]
  # A launcher that does not say how many ranks share the node: bound where the list is too
  # short for the local rank.
  mvapich = {'MV2_COMM_WORLD_SIZE': '4', 'MV2_COMM_WORLD_RANK': '3',
             'MV2_COMM_WORLD_LOCAL_RANK': '3', 'CUDA_VISIBLE_DEVICES': '6,7'}
  assert distributed.join_plan('h:1', env=mvapich)[1]['local_device_ids'] == [0, 1]
  mvapich = dict(mvapich, MV2_COMM_WORLD_LOCAL_SIZE='4', MV2_COMM_WORLD_LOCAL_RANK='0')
  assert distributed.join_plan('h:1', env=mvapich)[1]['local_device_ids'] == [0, 1]


def test_several_ranks_without_a_coordinator_are_one_clear_error():
  for env, name in ((open_mpi_5(2, 0), 'OMPI_COMM_WORLD_SIZE'), (mpich(3, 1), 'PMI_SIZE')):
    with pytest.raises(UserError, match=rf'\${name}=\d\) .*JAX_COORDINATOR_ADDRESS=node0:8476'):
      distributed.join_plan(env=env)
  with pytest.raises(UserError, match=r'\$PMI_SIZE=2 but \$PMI_RANK=None'):
    distributed.join_plan(env={'PMI_SIZE': '2'})
  with pytest.raises(UserError, match=r"\$OMPI_COMM_WORLD_SIZE='two' is not an integer"):
    distributed.join_plan(env={'OMPI_COMM_WORLD_SIZE': 'two'})


def test_an_srun_step_is_one_run_and_a_batch_script_outside_srun_is_one_clear_error():
  assert distributed.join_plan(env=srun_task(4, 2)) == ('slurm', {'local_device_ids': [2]})
  # srun --mpi=pmi2 numbers the same processes through PMI too: still srun's step.
  assert distributed.join_plan(env=dict(srun_task(4, 2), **mpich(4, 2))) == (
      'slurm', {'local_device_ids': [2]})
  # One task of a larger job (srun --ntasks=1), or a one-task job: a single process.
  assert distributed.join_plan(env=srun_task(1, 0)) == ('single', None)
  assert distributed.join_plan(env=slurm_batch_script(1)) == ('single', None)
  # mpirun inside the job: its daemons are srun's tasks (one per node), its ranks the processes.
  under_mpirun = dict(srun_task(2, 1, job_tasks=8), **open_mpi_4(8, 5, local_rank=1))
  assert distributed.join_plan(env=under_mpirun) == ('ompi', {'local_device_ids': [1]})
  hydra = dict(srun_task(2, 1, job_tasks=8), **mpich(8, 5))
  with pytest.raises(UserError, match=r'MPICH started 8 ranks'):
    distributed.join_plan(env=hydra)
  assert distributed.join_plan('n0:1', env=hydra)[0] == 'mpi'
  # The batch script itself (sbatch --ntasks=8 without srun) was taken for 8 processes (and
  # JAX, which reads srun's step variables, then failed): one line naming the job and srun.
  for env in (slurm_batch_script(8), {'SLURM_JOB_ID': '7', 'SLURM_NTASKS': '8'}):
    with pytest.raises(UserError, match=r'SLURM job 7 has 8 tasks \(\$SLURM_NTASKS=8\) but '
                                        r'this process is not one of them.*start the command '
                                        r'with srun.*srun --ntasks=1'):
      distributed.join_plan(env=env)
  # Explicit values still win there.
  assert distributed.join_plan('h:1', 1, 0, env=slurm_batch_script(8))[0] == 'explicit'
  # A coordinator is enough in a step, as under mpirun (was: needs all of --num_processes ...).
  assert distributed.join_plan(env=dict(srun_task(4, 2), JAX_COORDINATOR_ADDRESS='n1:8476')) == (
      'slurm', dict(coordinator_address='n1:8476', num_processes=4, process_id=2,
                    local_device_ids=[2], cluster_detection_method='deactivate'))
  # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE but no local rank: its step still numbers the
  # task and gives it its GPU (was: 'mpi' without a local rank, every task took every GPU).
  pmi2 = {'PMI_SIZE': '4', 'PMI_RANK': '2', 'PMI_FD': '9', 'PMI_JOBID': '7.0'}
  assert distributed.join_plan('n1:8476', env=dict(srun_task(4, 2), **pmi2)) == (
      'slurm', dict(coordinator_address='n1:8476', num_processes=4, process_id=2,
                    local_device_ids=[2], cluster_detection_method='deactivate'))
  # srun --gpus-per-task=2 on two nodes of 4 tasks: task 5 sees its 2 GPUs, takes both (JAX's
  # own SLURM detection would take the one of its local rank).
  two_each = dict(srun_task(8, 5), SLURM_STEP_TASKS_PER_NODE='4(x2)', SLURM_NODEID='1',
                  SLURM_LOCALID='1', CUDA_VISIBLE_DEVICES='2,3')
  assert distributed.join_plan('n1:1', env=two_each)[1]['local_device_ids'] == [0, 1]
  assert distributed.join_plan(env=two_each) == ('slurm', {'local_device_ids': [0, 1]})
  assert distributed.join_plan('n1:1', env=dict(two_each, CUDA_VISIBLE_DEVICES='0,1,2,3'))[1][
      'local_device_ids'] == [1]
  with pytest.raises(UserError, match=r"\$SLURM_STEP_NUM_TASKS=4 but \$SLURM_PROCID=None"):
    distributed.join_plan('n1:1', env={k: v for k, v in srun_task(4, 2).items()
                                       if k != 'SLURM_PROCID'})
  # finetune / export: srun tasks are copies too; the batch script itself runs once.
  with pytest.raises(UserError, match=r'srun started 2 \(\$SLURM_STEP_NUM_TASKS=2\)'):
    distributed.require_one_process('export', env=srun_task(2, 1))
  distributed.require_one_process('export', env=slurm_batch_script(8))
  distributed.require_one_process('export', env=srun_task(1, 0, job_tasks=8))


def as_rank(rank_env: dict) -> dict:
  """A command's environment as one rank: a launcher's variables and nothing else that could
  join it (the test's own JAX_* / SLURM / MPI variables removed)."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(('JAX_COORDINATOR', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID',
                              'SLURM_', 'OMPI_', 'PMI_', 'MV2_'))}
  return dict(env, **rank_env, JAX_PLATFORMS='cpu', PYTHONPATH=REPO_ROOT)


def dry_run(rank_env: dict) -> subprocess.Popen:
  """`train --dry_run` of the demo as one rank."""
  return subprocess.Popen(
      [sys.executable, '-m', 'electra_jax.train', '--config=configs/demo.py', '--dry_run',
       '--cpu_devices=2'], cwd=REPO_ROOT, env=as_rank(rank_env), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize('launcher', ['srun', 'srun_coordinator', 'open_mpi_4', 'mpich'])
def test_ranks_started_by_a_launcher_join_one_run(launcher):
  port = portpicker.pick_unused_port()
  if launcher == 'srun':  # JAX reads the step's first node; the port would come from the job id.
    envs = [dict(srun_task(2, r), JAX_COORDINATOR_PORT=str(port)) for r in range(2)]
  elif launcher == 'srun_coordinator':  # The step numbers the tasks, the address is given.
    envs = [dict(srun_task(2, r), JAX_COORDINATOR_ADDRESS=f'localhost:{port}') for r in range(2)]
  elif launcher == 'open_mpi_4':  # JAX reads mpirun's address; the port is mpirun's -x option.
    envs = [dict(open_mpi_4(2, r), JAX_COORDINATOR_PORT=str(port)) for r in range(2)]
  else:
    envs = [dict(mpich(2, r), JAX_COORDINATOR_ADDRESS=f'localhost:{port}') for r in range(2)]
  procs = [dry_run(env) for env in envs]
  outputs = [p.communicate(timeout=240) for p in procs]
  for p, (out, err) in zip(procs, outputs):
    assert p.returncode == 0, f'{out}\n{err[-3000:]}'
  plans = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
  assert plans[0] == plans[1]  # One run, seen alike from both ranks.
  assert (plans[0]['num_processes'], plans[0]['num_devices']) == (2, 4)
  assert plans[0]['per_host_batch'] == plans[0]['global_batch'] // 2
  described = 'in 2 process(es)'  # Rank 0 alone prints the plan for people.
  assert described in outputs[0][0] and described not in outputs[1][0]


_EXPLICIT_JOIN = """
import jax
from electra_jax import distributed
mode = distributed.initialize('localhost:{port}', 1, 0)
print(mode, jax.config.read('jax_cuda_visible_devices'))
jax.distributed.shutdown()
"""


@pytest.mark.parametrize('launcher_env', [srun_task(1, 0), open_mpi_4(2, 1)],
                         ids=['srun', 'open_mpi_4'])
def test_explicit_values_drive_every_local_device_under_a_launcher(launcher_env):
  """launch/multinode.sh's explicit process drives all its node's GPUs; inside a SLURM step or
  under Open MPI, JAX's cluster detection used to restrict it to one (the local rank's)."""
  script = _EXPLICIT_JOIN.format(port=portpicker.pick_unused_port())
  proc = subprocess.run([sys.executable, '-c', script], cwd=REPO_ROOT,
                        env=as_rank(launcher_env), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ['explicit', 'all']


def test_a_launcher_without_a_coordinator_exits_2_before_touching_a_device():
  proc = dry_run(open_mpi_5(2, 1))
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 2, f'{out}\n{err}'
  assert 'Open MPI started 2 ranks ($OMPI_COMM_WORLD_SIZE=2)' in err
  assert 'Traceback' not in err


@pytest.mark.parametrize('command', ['finetune', 'export'])
def test_one_process_commands_refuse_several_ranks(command, tmp_path):
  """finetune and export run once on the host's devices: under mpirun every rank would be an
  independent copy writing the same output."""
  flags = {'finetune': ['--config=configs/finetune/files.py', f'--workdir={tmp_path}/ft'],
           'export': [f'--workdir={tmp_path}/run', f'--output={tmp_path}/hf']}[command]
  proc = subprocess.run([sys.executable, '-m', f'electra_jax.{command}', *flags], cwd=REPO_ROOT,
                        env=as_rank(mpich(2, 1)), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert (f'python -m electra_jax.{command} runs as one process, but MPICH started 2 '
          '($PMI_SIZE=2)') in proc.stderr
  assert not list(tmp_path.iterdir())
  distributed.require_one_process('export', env=mpich(1, 0))  # One rank is one process.


def test_a_finished_command_leaves_the_distributed_run_before_interpreter_exit():
  """cli.run shuts jax.distributed down when the command's main returns, before the atexit
  hooks (the last registered runs first: this one, then JAX's own shutdown)."""
  script = (
      'import atexit, jax\n'
      'from electra_jax import cli, distributed\n'
      'def main(argv):\n'
      f"  distributed.initialize('localhost:{portpicker.pick_unused_port()}', 1, 0)\n"
      "  print('joined:', jax.distributed.is_initialized(), flush=True)\n"
      "  atexit.register(lambda: print('joined at exit:', jax.distributed.is_initialized(),\n"
      '                                 flush=True))\n'
      'cli.run(main)\n')
  proc = subprocess.run([sys.executable, '-c', script], cwd=REPO_ROOT, env=as_rank({}),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'joined: True' in proc.stdout
  assert 'joined at exit: False' in proc.stdout, proc.stdout


_FAILING_PROCESS = '''
import sys, time
from jax.experimental import multihost_utils
from electra_jax import cli, distributed
from electra_jax.errors import UserError

def main(argv):
  distributed.initialize()
  import jax
  if jax.process_index() == {failing}:
    time.sleep(1)  # The other is waiting in the collective by now.
    raise {error}('boom on {failing}')
  print('waiting', time.time(), flush=True)
  multihost_utils.sync_global_devices('never reached by the failing process')
  print('synced', flush=True)

cli.run(main)
'''


def run_processes(script: str, count: int):
  """`script` as `count` processes of one run on this host: (processes, their (stdout,
  stderr), the time the last ended)."""
  port = portpicker.pick_unused_port()
  procs = [subprocess.Popen(
      [sys.executable, '-c', script], cwd=REPO_ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, env=as_rank(dict(
          JAX_COORDINATOR_ADDRESS=f'localhost:{port}', JAX_NUM_PROCESSES=str(count),
          JAX_PROCESS_ID=str(i)))) for i in range(count)]
  outputs = [p.communicate(timeout=200) for p in procs]
  return procs, outputs, time.time()


@pytest.mark.parametrize('failing,error', [(1, 'UserError'), (0, 'RuntimeError'),
                                           (1, 'KeyboardInterrupt')])
def test_a_process_that_fails_stops_the_others_at_once(failing, error):
  """A process that stops on an error (its one line, or a traceback for a bug) tells the
  others, which stop at once with its message: without that they waited in the collective,
  then in JAX's exit-time shutdown barrier, until the heartbeat timeout aborted them (100 s and
  a C++ stack dump), or both waited in that barrier for each other. So does a second Ctrl-C
  (quit at once, where the first stops every process after the step)."""
  procs, outputs, ended = run_processes(_FAILING_PROCESS.format(failing=failing, error=error), 2)
  (_, failed_err), (other_out, other_err) = outputs[failing], outputs[1 - failing]
  assert procs[failing].returncode == dict(UserError=2, KeyboardInterrupt=130).get(error, 1), \
      failed_err[-3000:]
  if error == 'UserError':
    assert failed_err.strip().splitlines()[-1] == 'error: boom on 1', failed_err[-3000:]
  elif error == 'KeyboardInterrupt':
    assert failed_err.strip().splitlines()[-1] == 'interrupted', failed_err[-3000:]
  else:
    assert 'Traceback' in failed_err and 'RuntimeError: boom on 0' in failed_err
  assert procs[1 - failing].returncode == 1, other_err[-3000:]
  reason = dict(UserError='boom on 1', KeyboardInterrupt='interrupted (Ctrl-C)').get(
      error, f'{error}: boom on {failing}')
  assert f'error: process {failing} of 2 failed: {reason}; this process stops too' in other_err, \
      other_err[-3000:]
  assert 'Check failure' not in other_err + failed_err
  waited = ended - float(other_out.split()[1])
  assert waited < 20, f'the other process waited {waited:.0f} s'


_FAILING_TOGETHER = '''
import time, types
from jax.experimental import multihost_utils
from electra_jax import cli, distributed
from electra_jax.errors import UserError

class SlowWrites:
  """The key-value store's writes as on a loaded coordinator: each peer's message takes a
  while, so two failing processes write to each other before either has told the rest."""
  def __init__(self, client):
    self.client = client
  def key_value_set(self, key, value):
    self.client.key_value_set(key, value)
    time.sleep(0.5)
  def __getattr__(self, name):
    return getattr(self.client, name)

def main(argv):
  distributed.initialize()
  import jax
  joined = distributed._joined()
  distributed._joined = lambda: types.SimpleNamespace(
      client=SlowWrites(joined.client), process_id=joined.process_id,
      num_processes=joined.num_processes)
  # Printed before anyone fails: a told process may be stopped before it prints 'waiting'.
  print('ready', time.time(), flush=True)
  multihost_utils.sync_global_devices('all joined')
  if jax.process_index() in (1, 2):
    raise UserError(f'boom on {jax.process_index()}')
  print('waiting', time.time(), flush=True)
  multihost_utils.sync_global_devices('never reached by the failing processes')

cli.run(main)
'''


def test_two_processes_failing_together_still_stop_the_others():
  """Processes 1 and 2 fail at once: each wrote its message to the other first, and the
  other's watch ended it before it told processes 0 and 3, which then waited in the
  collective until JAX's heartbeat timeout."""
  procs, outputs, ended = run_processes(_FAILING_TOGETHER, 4)
  for failed in (1, 2):  # Its own error, or the other's where that came first.
    err = outputs[failed][1]
    assert procs[failed].returncode in (1, 2), err[-3000:]
    assert err.strip().splitlines()[-1].startswith(
        f'error: boom on {failed}' if procs[failed].returncode == 2 else
        f'error: process {3 - failed} of 4 failed: boom on {3 - failed}'), err[-3000:]
  for told in (0, 3):
    out, err = outputs[told]
    assert procs[told].returncode == 1, err[-3000:]
    assert 'failed: boom on' in err and 'this process stops too' in err, err[-3000:]
    # From before the failures (a loaded machine may run the watch's stop before the main
    # thread prints 'waiting': CI once did), not from when it began to wait.
    ready = next(line for line in out.splitlines() if line.startswith('ready '))
    waited = ended - float(ready.split()[1])
    assert waited < 30, f'process {told} ran {waited:.0f} s after all were ready'


def test_the_watch_for_failed_processes_ends_before_jax_leaves_the_run():
  """A watch thread still waiting in JAX's client when JAX's exit hook shut the client down
  aborted the process at random ('FATAL: exception not rethrown', exit 134): it ends first, in
  scripts that join without cli.run too (its exit hook runs before JAX's)."""
  watching = "any(t.name == 'failed-process-watch' for t in threading.enumerate())"
  script = (
      'import atexit, threading, jax\n'
      'from electra_jax import distributed\n'
      f"atexit.register(lambda: print('watching at exit:', {watching}, flush=True))\n"
      f"distributed.initialize('localhost:{portpicker.pick_unused_port()}', 1, 0)\n"
      f"print('watching:', {watching}, flush=True)\n")
  proc = subprocess.run([sys.executable, '-c', script], cwd=REPO_ROOT, env=as_rank({}),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.splitlines() == ['watching: True', 'watching at exit: False']
