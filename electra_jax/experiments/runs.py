"""The runs of a comparison: train / finetune commands in subprocesses, each skipped when its
output says it already finished.

Layout under the output folder:
  pretrain/<name>/            the train command's workdir (resumed, never restarted)
  points/<name>/<step>/       one budget point: config.json + checkpoints/<step>/ (hard links to
                              the train workdir's files, so later saves may rotate the original
                              away) + point.json (written last: the point is complete)
  finetune/<name>/<step>/     the finetune command's workdir (results.json: finished)
  logs/                       every command's stdout and stderr
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

from electra_jax import atomic
from electra_jax.errors import UserError

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _say(message: str):
  print(message, flush=True)


def read_json(path: str):
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def read_jsonl(path: str) -> list[dict]:
  if not os.path.isfile(path):
    return []
  rows = []
  with open(path, encoding='utf-8') as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        pass  # A line cut short by a killed run; the train command rewrites it on resume.
  return rows


def run_command(module: str, args: list[str], log_path: str, label: str) -> dict:
  """Runs `python -m module args`, echoing its output to stderr (prefixed with `label`) and
  into log_path; returns its last-stdout-line JSON, or raises UserError with its error line."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  # Config files import `configs` and name data relative to this directory: the commands run
  # here and import this copy of the package, installed or not.
  env['PYTHONPATH'] = os.pathsep.join(p for p in (os.getcwd(), _PACKAGE_ROOT,
                                                  env.get('PYTHONPATH')) if p)
  command = [sys.executable, '-m', module, *args]
  last_stdout, error_lines = '', []
  with open(log_path, 'a', encoding='utf-8') as log:
    log.write('$ ' + ' '.join(command) + '\n')
    log.flush()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True, bufsize=1)
    lock = threading.Lock()

    def echo(line: str):
      with lock:
        log.write(line)
        log.flush()
        sys.stderr.write(f'  [{label}] {line}')
        sys.stderr.flush()

    def pump_stderr():
      for line in proc.stderr:
        if line.startswith('error: '):
          error_lines.append(line.strip()[len('error: '):])
        echo(line)

    reader = threading.Thread(target=pump_stderr, daemon=True)
    reader.start()
    stopped = []

    def forward_sigterm(signum, frame):
      del frame
      stopped.append(signum)
      proc.send_signal(signum)  # The train command saves a checkpoint and exits.

    previous = signal.signal(signal.SIGTERM, forward_sigterm)
    try:
      for line in proc.stdout:
        if line.strip():
          last_stdout = line
        echo(line)
    except KeyboardInterrupt:  # Ctrl-C reached the command too (same process group).
      stopped.append(signal.SIGINT)
    finally:
      proc.wait()
      reader.join()
      signal.signal(signal.SIGTERM, previous)
  if stopped:
    raise UserError(f'{label} was stopped (signal {stopped[0]}); re-run the same command to '
                    'resume the comparison')
  if proc.returncode != 0:
    reason = error_lines[-1] if error_lines else f'exit code {proc.returncode}'
    raise UserError(f'{label} failed: {reason} (command log: {log_path})')
  try:
    return json.loads(last_stdout)
  except json.JSONDecodeError:
    raise UserError(f'{label} ended without a JSON result line (command log: {log_path})') \
        from None


# --- Pretraining ------------------------------------------------------------------------------

def _latest_checkpoint(workdir: str) -> int:
  """Newest complete checkpoint step of a train workdir (0: none). Orbax names a step's
  directory <step> only once the save is complete."""
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    return 0
  return max((int(n) for n in os.listdir(directory) if n.isdigit()), default=0)


def _link_tree(source: str, target: str):
  """Copies a checkpoint directory as hard links (no extra disk); a plain copy where the file
  system has none."""
  try:
    shutil.copytree(source, target, copy_function=os.link)
  except OSError:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)


def _row_at(rows: list[dict], step: int):
  """The last logged row at or before `step` (None if none was logged yet)."""
  before = [r for r in rows if r.get('step', 0) <= step]
  return before[-1] if before else None


def _make_point(workdir: str, point_dir: str, step: int, flops: float) -> dict:
  """The budget point's directory: what finetune needs to start from exactly this step."""
  tmp = point_dir + '.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(os.path.join(tmp, 'checkpoints'))
  shutil.copy2(os.path.join(workdir, 'config.json'), os.path.join(tmp, 'config.json'))
  _link_tree(os.path.join(workdir, 'checkpoints', str(step)),
             os.path.join(tmp, 'checkpoints', str(step)))
  record = dict(step=step, flops=flops,
                train=_row_at(read_jsonl(os.path.join(workdir, 'metrics.jsonl')), step),
                eval=_row_at(read_jsonl(os.path.join(workdir, 'eval_metrics.jsonl')), step))
  shutil.rmtree(point_dir, ignore_errors=True)
  os.rename(tmp, point_dir)
  atomic.write_json(os.path.join(point_dir, 'point.json'), record)
  return record


def pretrain(plan, user_overrides: list[str], output: str, counter: dict) -> list[dict]:
  """Trains `plan` to each budget point in turn (stopping there with --stop_after_steps, so the
  point's checkpoint is exact and the run continues as if never stopped); returns the points'
  records. Points already complete are read back, not retrained."""
  workdir = os.path.join(output, 'pretrain', plan.name)
  records = []
  for k, step in enumerate(plan.points, 1):
    point_dir = os.path.join(output, 'points', plan.name, str(step))
    done = os.path.join(point_dir, 'point.json')
    label = f'pretrain {plan.name} -> step {step}'
    where = f'point {k}/{len(plan.points)}, {step * plan.flops_per_step:.3g} FLOPs'
    if os.path.isfile(done):
      _say(f'{label} ({where}): already done, skipped')
      counter['pretrain_skipped'] += 1
      records.append(read_json(done))
      continue
    latest = _latest_checkpoint(workdir)
    if latest < step:
      _say(f'{label} ({where}): training from step {latest} in {workdir}')
      counter['pretrain_run'] += 1
    while latest < step:
      args = [f'--config={plan.spec}', f'--workdir={workdir}',
              *plan.train_overrides(user_overrides)]
      if step < plan.num_train_steps:
        args.append(f'--stop_after_steps={step - latest}')
      result = run_command('electra_jax.train', args,
                           os.path.join(output, 'logs', f'pretrain_{plan.name}.log'),
                           f'pretrain {plan.name}')
      reached = int(result.get('step', 0))
      if reached <= latest:
        raise UserError(f'{label}: the train command stopped at step {reached} without '
                        f'progress (status {result.get("status")}); see {output}/logs')
      latest = reached
    if not os.path.isdir(os.path.join(workdir, 'checkpoints', str(step))):
      raise UserError(f'{label}: the checkpoint of step {step} is gone from {workdir} (the '
                      f'run went on to step {latest}); delete {workdir} and '
                      f'{os.path.dirname(point_dir)} to redo this config')
    records.append(_make_point(workdir, point_dir, step, step * plan.flops_per_step))
  return records


# --- Fine-tuning ------------------------------------------------------------------------------

def finetune(plan, step: int, task_args: list[str], num_seeds: int, output: str,
             counter: dict) -> dict:
  """Fine-tunes the budget point `step` of `plan` with num_seeds seeds; returns finetune's
  results.json. A finished run is read back; an unfinished one is discarded and redone."""
  point_dir = os.path.join(output, 'points', plan.name, str(step))
  workdir = os.path.join(output, 'finetune', plan.name, str(step))
  results_path = os.path.join(workdir, 'results.json')
  label = f'finetune {plan.name} @ step {step}'
  if os.path.isfile(results_path):
    _say(f'{label}: already done, skipped')
    counter['finetune_skipped'] += 1
    return read_json(results_path)
  if os.path.exists(workdir):
    _say(f'{label}: discarding the unfinished run in {workdir}')
    shutil.rmtree(workdir)
  _say(f'{label}: {num_seeds} seed(s) -> {workdir}')
  counter['finetune_run'] += 1
  run_command('electra_jax.finetune',
              [*task_args, f'--config.init_checkpoint={point_dir}',
               f'--config.num_seeds={num_seeds}', f'--workdir={workdir}'],
              os.path.join(output, 'logs', f'finetune_{plan.name}_{step}.log'), label)
  return read_json(results_path)


def finetune_score(results: dict) -> dict:
  """The main metric's median over seeds (each seed's best epoch) and every seed's value."""
  metric = results['main_metric']
  return dict(main_metric=metric, median=results[f'median_best_{metric}'],
              seeds=list(results[f'best_{metric}_per_seed']))

