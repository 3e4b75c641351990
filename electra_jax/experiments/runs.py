"""The runs of a comparison: train / finetune commands in subprocesses, each skipped when its
output says it already finished.

Layout under the output folder:
  pretrain/<name>/            the train command's workdir (resumed, never restarted); a
                              --pretrained run is read where it is instead
  points/<name>/<step>/       one budget point: config.json + checkpoints/<step>/ (a copy, hard
                              links on a local disk, so later saves may rotate the original
                              away; a later --pretrained=<name>=OUTPUT/pretrain/<name> reads
                              it there) + point.json (written last: the point is complete)
  finetune/<name>/<step>/     the finetune command's workdir (results.json: finished)
  logs/                       every command's stdout and stderr
"""
import json
import os
import signal
import subprocess
import sys
import threading

from electra_jax import atomic
from electra_jax import checkpoint
from electra_jax import paths
from electra_jax import saved_config
from electra_jax.errors import UserError

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The commands' own progress bars, piped through run_command, would add a line per redraw to
# the comparison's output; their log lines still say how far each run is. A user's
# --override=progress_bar=true / --finetune_override=progress_bar=true, coming later, wins.
NO_PROGRESS_BAR = '--config.progress_bar=false'


def _say(message: str):
  print(message, flush=True)


# What to do about a damaged record of a comparison (one a hand edit left unreadable).
_DAMAGED = 'delete it to redo that run, or pass a new --output'


def read_jsonl(path: str) -> list[dict]:
  if not paths.is_file(path):
    return []
  rows = []
  for line in paths.read_text(path).splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      pass  # A line cut short by a killed run; the train command rewrites it on resume.
  return rows


def run_command(module: str, args: list[str], log_path: str, label: str) -> dict:
  """Runs `python -m module args`, echoing its output to stderr (prefixed with `label`) and
  into log_path; returns its last-stdout-line JSON, or raises UserError with its error line."""
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  # Config files import `configs` and name data relative to this directory: the commands run
  # here and import this copy of the package, installed or not.
  env['PYTHONPATH'] = os.pathsep.join(p for p in (os.getcwd(), _PACKAGE_ROOT,
                                                  env.get('PYTHONPATH')) if p)
  command = [sys.executable, '-m', module, *args]
  last_stdout, error_lines = '', []
  log = atomic.AppendFile(log_path)
  try:
    log.write('$ ' + ' '.join(command) + '\n')
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True, bufsize=1)
    lock = threading.Lock()

    def echo(line: str):
      with lock:
        log.write(line)
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

    def forward(signum, frame):
      del frame
      stopped.append(signum)
      # The train command saves a checkpoint and exits (Ctrl-C reaches it from the terminal
      # too: a second SIGINT within stop_request.SECOND_CTRL_C_AFTER is the same request).
      proc.send_signal(signum)

    # Handled, not a KeyboardInterrupt: one raised between reading a line and logging it lost
    # the command's last lines (where it stopped, its checkpoint); they are read to the end.
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
      for line in proc.stdout:
        if line.strip():
          last_stdout = line
        echo(line)
    finally:
      proc.wait()
      reader.join()
      for sig, handler in previous.items():
        signal.signal(sig, handler)
  finally:
    log.close()
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

def _row_at(rows: list[dict], step: int):
  """The last logged row at or before `step` (None if none was logged yet)."""
  before = [r for r in rows if r.get('step', 0) <= step]
  return before[-1] if before else None


def step_source(workdir: str, step: int) -> str | None:
  """Where a pretraining run's checkpoint of `step` is: `workdir`, or, once its rotation took
  it away, the budget point a comparison kept of its own run (OUTPUT/pretrain/NAME ->
  OUTPUT/points/NAME/STEP, complete); None if neither holds it."""
  if step in checkpoint.steps(workdir):
    return workdir
  runs_dir = paths.parent(workdir)
  output = paths.parent(runs_dir)
  point_dir = paths.join(output, 'points', paths.name(workdir), str(step))
  if (paths.name(runs_dir) == 'pretrain' and paths.is_file(paths.join(output, 'compare.json'))
      and paths.is_file(paths.join(point_dir, 'point.json'))):
    return point_dir
  return None


def _make_point(workdir: str, point_dir: str, step: int, flops: float,
                source: str | None = None) -> dict:
  """The budget point's directory: what finetune needs to start from exactly this step.
  `source`: where the step's checkpoint is (step_source), if not in `workdir`."""
  tmp = point_dir + '.tmp'
  paths.remove_tree(tmp)
  paths.make_dirs(tmp)
  config = saved_config.load(workdir)
  saved_config.keep_vocabulary(tmp, config)  # The point outlives a moved or deleted run.
  saved_config.write(tmp, config)
  checkpoint.copy_step(source or workdir, step, tmp)
  record = dict(step=step, flops=flops,
                train=_row_at(read_jsonl(paths.join(workdir, 'metrics.jsonl')), step),
                eval=_row_at(read_jsonl(paths.join(workdir, 'eval_metrics.jsonl')), step))
  paths.remove_tree(point_dir)
  paths.rename(tmp, point_dir)
  atomic.write_json(paths.join(point_dir, 'point.json'), record)
  return record


def pretrain(plan, user_overrides: list[str], output: str, workdir: str, counter: dict,
             cache_dir: str, train: bool = True) -> list[dict]:
  """Trains `plan` in `workdir` to each budget point in turn (stopping there with
  --stop_after_steps, so the point's checkpoint is exact and the run continues as if never
  stopped); returns the points' records. Points already complete are read back, not retrained.
  train=False: `workdir` is a finished run (--pretrained), only read. `cache_dir`: the
  commands' shared compilation cache."""
  records = []
  for k, step in enumerate(plan.points, 1):
    point_dir = paths.join(output, 'points', plan.name, str(step))
    done = paths.join(point_dir, 'point.json')
    label = f'pretrain {plan.name} -> step {step}'
    where = f'point {k}/{len(plan.points)}, {plan.flops_at(step):.3g} FLOPs'
    if paths.is_file(done):
      _say(f'{label} ({where}): already done, skipped')
      counter['pretrain_skipped'] += 1
      records.append(paths.read_json(done, _DAMAGED))
      continue
    if not train:
      source = step_source(workdir, step)
      if source is None:
        raise UserError(f'{label}: the checkpoint of step {step} is gone from {workdir} '
                        '(--pretrained); restore it or drop the flag to train the config here')
      _say(f'{label} ({where}): the checkpoint of step {step} in {source} (--pretrained)')
      counter['pretrain_reused'] += 1
      records.append(_make_point(workdir, point_dir, step, plan.flops_at(step), source))
      continue
    latest = checkpoint.latest_step(workdir) or 0
    if latest < step:
      _say(f'{label} ({where}): training from step {latest} in {workdir}')
      counter['pretrain_run'] += 1
    while latest < step:
      args = [f'--config={plan.spec}', f'--workdir={workdir}',
              f'--compilation_cache_dir={cache_dir}', NO_PROGRESS_BAR,
              *plan.train_overrides(user_overrides)]
      if step < plan.num_train_steps:
        args.append(f'--stop_after_steps={step - latest}')
      result = run_command('electra_jax.train', args,
                           paths.join(output, 'logs', f'pretrain_{plan.name}.log'),
                           f'pretrain {plan.name}')
      reached = int(result.get('step', 0))
      if reached <= latest:
        raise UserError(f'{label}: the train command stopped at step {reached} without '
                        f'progress (status {result.get("status")}); see {output}/logs')
      latest = reached
    if step not in checkpoint.steps(workdir):
      raise UserError(f'{label}: the checkpoint of step {step} is gone from {workdir} (the '
                      f'run went on to step {latest}); delete {workdir} and '
                      f'{paths.parent(point_dir)} to redo this config')
    records.append(_make_point(workdir, point_dir, step, plan.flops_at(step)))
  return records


# --- Fine-tuning ------------------------------------------------------------------------------

def finetune(plan, step: int, task_args: list[str], num_seeds: int, output: str,
             counter: dict, cache_dir: str) -> dict:
  """Fine-tunes the budget point `step` of `plan` with num_seeds seeds; returns finetune's
  results.json. A finished run is read back; an unfinished one resumes (finetune's own
  resume: its finished seeds kept, the rest from their last save).
  task_args: compare.finetune_args's flags, --config=FILE first."""
  point_dir = paths.join(output, 'points', plan.name, str(step))
  workdir = paths.join(output, 'finetune', plan.name, str(step))
  results_path = paths.join(workdir, 'results.json')
  label = f'finetune {plan.name} @ step {step}'
  if paths.is_file(results_path):
    _say(f'{label}: already done, skipped')
    counter['finetune_skipped'] += 1
    return paths.read_json(results_path, _DAMAGED)
  resuming = 'resuming ' if paths.exists(workdir) else ''
  _say(f'{label}: {resuming}{num_seeds} seed(s) -> {workdir}')
  counter['finetune_run'] += 1
  config_file, *task_overrides = task_args  # --config=FILE comes before any --config.KEY.
  result = run_command('electra_jax.finetune',
                       [config_file, NO_PROGRESS_BAR, *task_overrides,
                        f'--config.init_checkpoint={point_dir}',
                        f'--config.num_seeds={num_seeds}', f'--workdir={workdir}',
                        f'--compilation_cache_dir={cache_dir}'],
                       paths.join(output, 'logs', f'finetune_{plan.name}_{step}.log'), label)
  if result.get('status') == 'interrupted':  # It alone got SIGTERM: its state is saved.
    raise UserError(f'{label} was stopped; re-run the same command to resume the comparison')
  return paths.read_json(results_path, _DAMAGED)


def finetune_score(results: dict) -> dict:
  """The main metric's median over seeds (each seed's best epoch) and every seed's value."""
  metric = results['main_metric']
  return dict(main_metric=metric, median=results[f'median_best_{metric}'],
              seeds=list(results[f'best_{metric}_per_seed']))

