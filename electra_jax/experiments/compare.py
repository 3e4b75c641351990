"""Pretrain several configs for the same FLOPs, fine-tune each, and compare.

  python -m electra_jax.experiments.compare --configs=configs/demo.py,other.py \\
      --flops_budget=1e15 --finetune_task=files --output=DIR \\
      [--override=KEY=VALUE ...] [--finetune_override=KEY=VALUE ...] [--num_seeds=3] \\
      [--budget_points=1]

Each config gets floor(budget / model FLOPs per step) steps (electra_jax/flops.py), warmup
capped at 10 % of them, and checkpoints at --budget_points evenly spaced FLOPs points; each
point is fine-tuned with --num_seeds seeds. Re-running the same command resumes: finished
pretraining and fine-tuning runs are skipped. Writes DIR/{results.json, results.md,
downstream_vs_flops.png, pretraining_curves.png} and the runs under DIR/{pretrain, points,
finetune, logs}; the last stdout line is a JSON summary.
"""
import json
import os

from absl import flags

from electra_jax import atomic
from electra_jax import cli
from electra_jax import paths
from electra_jax.errors import UserError
from electra_jax.experiments import budget
from electra_jax.experiments import report
from electra_jax.experiments import runs

flags.DEFINE_list('configs', None, 'Pretraining config files to compare, separated by commas '
                  '(path.py or path.py:arg, as --config= of the train command).')
flags.DEFINE_float('flops_budget', None, 'Pretraining model FLOPs per config (e.g. 1e15); each '
                   'config trains floor(budget / FLOPs per step) steps.')
flags.DEFINE_string('finetune_task', None, "Downstream task: 'files' (configs/finetune/"
                    "files.py: data/austen_novels unless --finetune_override=train_file=... "
                    "eval_file=...), 'glue/TASK' (e.g. glue/sst2, from TFDS), 'squad/v1.1' or "
                    "'squad/v2.0'.")
flags.DEFINE_string('output', None, 'Folder for every run and the results (re-run the same '
                    'command on it to resume).')
flags.DEFINE_multi_string('override', [], 'KEY=VALUE applied to every pretraining config '
                          '(repeat the flag for several), e.g. --override=train_batch_size=8.')
flags.DEFINE_multi_string('finetune_override', [], 'KEY=VALUE for the fine-tuning config '
                          '(configs/finetune/glue.py lists the keys), e.g. '
                          '--finetune_override=max_seq_length=64.')
flags.DEFINE_integer('num_seeds', 3, 'Fine-tuning runs (seeds) per budget point; the table '
                     'reports their median and range.')
flags.DEFINE_integer('budget_points', 1, 'Checkpoints per config that are fine-tuned, evenly '
                     'spaced in FLOPs; the last is the end of pretraining.')
FLAGS = flags.FLAGS

_FINETUNE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'configs', 'finetune')
_SQUAD = {'v1.1': 'squad_v1', 'v1': 'squad_v1', 'v2.0': 'squad_v2', 'v2': 'squad_v2'}
# Fine-tuning keys the comparison sets itself.
_FINETUNE_MANAGED = {'init_checkpoint': 'the budget point', 'num_seeds': '--num_seeds',
                     'task': '--finetune_task'}


def finetune_config(task: str) -> tuple[str, str]:
  """(fine-tuning config file, config.task) for a --finetune_task value."""
  from electra_jax.finetune import tasks  # pylint: disable=import-outside-toplevel
  family, _, name = task.partition('/')
  glue = sorted(n for n, t in tasks.TASKS.items() if (t.tfds_name or '').startswith('glue/'))
  if task == 'files':
    return os.path.join(_FINETUNE_DIR, 'files.py'), 'files'
  if family == 'glue' and name in glue:
    return os.path.join(_FINETUNE_DIR, 'glue.py'), name
  if family == 'squad' and name in _SQUAD:
    return os.path.join(_FINETUNE_DIR, 'squad.py'), _SQUAD[name]
  raise UserError(f"--finetune_task={task!r} is not a task; pick 'files', 'squad/v1.1', "
                  f"'squad/v2.0' or glue/TASK with TASK one of {', '.join(glue)}")


def finetune_args(task: str, overrides: list[str]) -> list[str]:
  """The finetune command's flags for the task (checked here, before any pretraining)."""
  config_file, task_name = finetune_config(task)
  budget.apply_overrides(budget.load_config(config_file), overrides, '--finetune_override',
                         _FINETUNE_MANAGED, 'configs/finetune/glue.py')
  # The fine-tuned weights are not needed for the comparison: skip saving them by default.
  return [f'--config={config_file}', f'--config.task={task_name}',
          '--config.save_best_checkpoint=false', *[f'--config.{o}' for o in overrides]]


def _normalized(record):
  return json.loads(json.dumps(record))


def comparison_spec(plans, task_args) -> dict:
  """What fixes a comparison's results: a re-run must match it to reuse the runs."""
  return _normalized(dict(
      flops_budget=FLAGS.flops_budget, budget_points=FLAGS.budget_points,
      num_seeds=FLAGS.num_seeds, finetune_task=FLAGS.finetune_task, finetune_args=task_args,
      configs=[dict(name=p.name, config_file=p.spec, config=p.config.to_dict()) for p in plans]))


def prepare_output(output: str, spec: dict) -> str:
  """Creates the output folder with its spec, or checks that an existing one holds the same
  comparison (UserError naming what differs)."""
  output = paths.absolute(output)
  spec_path = paths.join(output, 'compare.json')
  if paths.is_file(output):
    raise UserError(f"--output '{output}' is a file; pass a folder")
  if paths.is_file(spec_path):
    saved = runs.read_json(spec_path)
    differ = [k for k in spec if saved.get(k) != spec[k]]
    if 'configs' in differ:  # Name the configs added, dropped or changed.
      before = {c['name']: c for c in saved.get('configs', [])}
      now = {c['name']: c for c in spec['configs']}
      changed = sorted(n for n in set(before) | set(now) if before.get(n) != now.get(n))
      differ[differ.index('configs')] = f"configs ({', '.join(changed) or 'their order'})"
    if differ:
      raise UserError(f"--output '{output}' holds a comparison with different "
                      f"{', '.join(differ)}; re-run with its arguments "
                      f'({spec_path}) or pass a new --output')
    return output
  if paths.listdir(output):
    raise UserError(f"--output '{output}' is not empty and holds no comparison (no "
                    'compare.json); pass a new or empty folder')
  paths.check_writable_dir(output, '--output')
  atomic.write_json(spec_path, spec)
  return output


def compare() -> dict:
  plans = budget.plan_all(FLAGS.configs or [], FLAGS.override, FLAGS.flops_budget,
                          FLAGS.budget_points)
  if FLAGS.num_seeds < 1:
    raise UserError(f'--num_seeds={FLAGS.num_seeds} must be at least 1')
  task_args = finetune_args(FLAGS.finetune_task, FLAGS.finetune_override)
  output = prepare_output(FLAGS.output, comparison_spec(plans, task_args))
  # Each budget point restarts the train command: reuse its compiled steps across runs.
  cache_dir = (FLAGS.compilation_cache_dir or os.environ.get('JAX_COMPILATION_CACHE_DIR')
               or paths.join(output, 'jax_cache'))
  print(f'Writing to {output} | {len(plans)} config(s) x {FLAGS.budget_points} budget point(s) '
        f'x {FLAGS.num_seeds} seed(s) | {FLAGS.flops_budget:.4g} pretraining FLOPs each | '
        f'fine-tuning {FLAGS.finetune_task}', flush=True)
  for p in plans:
    print(f'  {p.name} ({p.objective}): {p.flops_per_step:.4g} FLOPs/step -> '
          f'{p.num_train_steps} steps ({p.total_flops:.4g} FLOPs), warmup '
          f'{p.num_warmup_steps} (config {p.config_warmup_steps}, capped at 10 % of the '
          f"steps), budget points at steps {', '.join(map(str, p.points))}", flush=True)
  counter = dict(pretrain_run=0, pretrain_skipped=0, finetune_run=0, finetune_skipped=0)
  configs, main_metric = [], None
  for p in plans:
    point_records = runs.pretrain(p, FLAGS.override, output, counter, cache_dir)
    points = []
    for record in point_records:
      ft = runs.finetune(p, record['step'], task_args, FLAGS.num_seeds, output, counter,
                         cache_dir)
      score = runs.finetune_score(ft)
      main_metric = score['main_metric']
      points.append(dict(step=record['step'], flops=record['flops'],
                         pretrain=dict(train=record['train'], eval=record['eval']),
                         finetune=dict(score, workdir=ft['workdir'])))
    configs.append(dict(name=p.name, config_file=p.spec, objective=p.objective,
                        flops_per_step=p.flops_per_step, num_train_steps=p.num_train_steps,
                        num_warmup_steps=p.num_warmup_steps,
                        config_warmup_steps=p.config_warmup_steps, total_flops=p.total_flops,
                        points=points))
  results = dict(flops_budget=FLAGS.flops_budget, finetune_task=FLAGS.finetune_task,
                 main_metric=main_metric, num_seeds=FLAGS.num_seeds,
                 budget_points=FLAGS.budget_points, overrides=list(FLAGS.override),
                 finetune_overrides=list(FLAGS.finetune_override), configs=configs)
  written = report.write_all(results, output)
  print(report.markdown(results), flush=True)
  print(f"Wrote {written['results_md']}, {written['results_json']} and the plots "
        f"{written['downstream_plot']}, {written['curves_plot']}", flush=True)
  return dict(status='completed', output=output, **written, main_metric=main_metric,
              **counter, median={c['name']: c['points'][-1]['finetune']['median']
                                 for c in configs})


def main(argv):
  if len(argv) > 1:
    raise UserError(f'unexpected arguments {argv[1:]}; flags look like --name=value')
  cli.print_result(compare())


def run():
  flags.mark_flags_as_required(['configs', 'flops_budget', 'finetune_task', 'output'])
  cli.run(main)


if __name__ == '__main__':
  run()
