"""Pretrain several configs for the same FLOPs, fine-tune each, and compare.

  python -m electra_jax.experiments.compare --configs=configs/demo.py,other.py \\
      --flops_budget=1e15 --finetune_task=files --output=DIR \\
      [--override=KEY=VALUE ...] [--finetune_override=KEY=VALUE ...] [--num_seeds=3] \\
      [--budget_points=1] [--pretrained=NAME=WORKDIR ...]

Each config gets floor(budget / model FLOPs per step) steps (electra_jax/flops.py; keys counted
in steps, two_stage's split, keep their share of the run), warmup capped at 10 % of them, and checkpoints at --budget_points evenly spaced FLOPs points; each
point is fine-tuned with --num_seeds seeds; --pretrained reuses a run already trained with the
planned config instead of training it again. Re-running the same command resumes: finished
pretraining and fine-tuning runs are skipped. Writes DIR/{results.json, results.md,
downstream_vs_flops.png, pretraining_curves.png} and the runs under DIR/{pretrain, points,
finetune, logs}; the last stdout line is a JSON summary.
"""
import json
import os

from absl import flags

from electra_jax import atomic
from electra_jax import checkpoint
from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import experiment
from electra_jax import paths
from electra_jax import saved_config
from electra_jax.errors import UserError
from electra_jax.experiments import budget
from electra_jax.experiments import report
from electra_jax.experiments import runs

FLAGS = flags.FLAGS

_FINETUNE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'configs', 'finetune')
_SQUAD = {'v1.1': 'squad_v1', 'v1': 'squad_v1', 'v2.0': 'squad_v2', 'v2': 'squad_v2'}
# Fine-tuning keys the comparison sets itself.
_FINETUNE_MANAGED = {'init_checkpoint': 'the budget point', 'init_step': "the budget point's step",
                     'random_init': "the budget point's checkpoint", 'num_seeds': '--num_seeds',
                     'task': '--finetune_task'}


def finetune_config(task: str) -> tuple[str, str]:
  """(fine-tuning config file, config.task) for a --finetune_task value."""
  from electra_jax.finetune import tasks  # pylint: disable=import-outside-toplevel
  family, _, name = task.partition('/')
  glue = sorted(n for n, t in tasks.TASKS.items() if (t.tfds_name or '').startswith('glue/'))
  if task in ('files', 'tagging'):
    return os.path.join(_FINETUNE_DIR, f'{task}.py'), task
  if task == 'acceptability':  # The bundled CoLA-like set: files.py's task on its own config.
    return os.path.join(_FINETUNE_DIR, 'acceptability.py'), 'files'
  if tasks.TASKS.get(task) and tasks.TASKS[task].tfds_name == 'conll2003':
    return os.path.join(_FINETUNE_DIR, 'conll2003.py'), task
  if family == 'glue' and name in glue:
    return os.path.join(_FINETUNE_DIR, 'glue.py'), name
  if family == 'squad' and name in _SQUAD:
    return os.path.join(_FINETUNE_DIR, 'squad.py'), _SQUAD[name]
  raise UserError(f"--finetune_task={task!r} is not a task; pick 'files', 'acceptability', "
                  "'tagging', 'conll2003' (or conll2003_chunk, conll2003_pos), 'squad/v1.1', "
                  f"'squad/v2.0' or glue/TASK with TASK one of {', '.join(glue)}")


def finetune_args(task: str, overrides: list[str]) -> list[str]:
  """The finetune command's flags for the task (checked here, before any pretraining)."""
  config_file, task_name = finetune_config(task)
  config = budget.load_config(config_file, overrides, '--finetune_override', _FINETUNE_MANAGED,
                              '--finetune_task', 'configs/finetune/glue.py')
  config.task = task_name
  _check_finetune_data(config)
  # The fine-tuned weights are not needed for the comparison: skip saving them by default.
  return [f'--config={config_file}', f'--config.task={task_name}',
          '--config.save_best_checkpoint=false', *[f'--config.{o}' for o in overrides]]


def _check_finetune_data(config):
  """Reads the task's data now (a TFDS task's first rows): a missing file or a bad row fails
  before any pretraining, not after hours of it."""
  from electra_jax.finetune import loop, settings, tasks  # pylint: disable=import-outside-toplevel
  task = tasks.get_task(config.task)
  # The width only picks default learning rates, which reading the data does not use.
  c = settings.resolve(config, task, hidden_size=256)
  with c.unlocked():
    c.max_train_examples = c.max_eval_examples = 1
  try:
    loop.read_examples(c, task)
  except UserError as e:
    raise UserError(f'--finetune_task={FLAGS.finetune_task}: {e}') from None


def pretrained_workdirs(values: list[str], plans) -> dict:
  """{config name: workdir} from the --pretrained flags, each run checked against its plan:
  the same resolved config (up to keys that never change the weights, or that its objective
  never reads) and a checkpoint at every budget point (runs.step_source: a comparison's own
  run may have it only as its kept point). UserError naming the mismatch."""
  by_name = {p.name: p for p in plans}
  workdirs = {}
  for value in values:
    name, sep, workdir = value.partition('=')
    if not sep or not name or not workdir:
      raise UserError(f'--pretrained={value!r} is not NAME=WORKDIR; e.g. '
                      f'--pretrained={plans[0].name}=/path/to/workdir')
    if name not in by_name:
      raise UserError(f'--pretrained={value!r}: {name!r} is not one of the configs '
                      f"({', '.join(by_name)}); runs are named after their config file")
    if name in workdirs:
      raise UserError(f'--pretrained names {name!r} twice; pass one workdir per config')
    plan, workdir = by_name[name], paths.absolute(workdir)
    try:
      saved = saved_config.load(workdir).to_dict()
    except UserError as e:
      raise UserError(f'--pretrained={value!r}: {e}') from None
    resolved = config_lib.resolve(plan.config, training=True)
    planned = resolved.to_dict()
    differ = experiment.weight_changing_differences(saved, resolved)
    if differ:
      diffs = ', '.join(f'{k}: {saved.get(k)!r} in the run, {planned[k]!r} planned'
                        for k in differ)
      raise UserError(f'--pretrained={value!r}: that run was trained with another config '
                      f'than the comparison plans for {name} ({diffs}); drop the flag to '
                      'train it here, or match the budget and --override to the run')
    missing = [step for step in plan.points if runs.step_source(workdir, step) is None]
    if missing:
      have = checkpoint.steps(workdir)
      raise UserError(f'--pretrained={value!r}: no checkpoint of step(s) '
                      f"{', '.join(map(str, missing))} (the budget points) in {workdir}; it "
                      f"holds {', '.join(map(str, have)) or 'none'}; drop the flag to train the "
                      'config here, or pick --budget_points whose steps it holds')
    workdirs[name] = workdir
  return workdirs


def _normalized(record):
  return json.loads(json.dumps(record))


def comparison_spec(plans, task_args, pretrained: dict) -> dict:
  """What fixes a comparison's results: a re-run must match it to reuse the runs."""
  spec = dict(
      flops_budget=FLAGS.flops_budget, budget_points=FLAGS.budget_points,
      num_seeds=FLAGS.num_seeds, finetune_task=FLAGS.finetune_task, finetune_args=task_args,
      configs=[dict(name=p.name, config_file=p.spec, config=p.config.to_dict()) for p in plans])
  if pretrained:  # Only then: outputs written before the flag existed still resume.
    spec['pretrained'] = pretrained
  return _normalized(spec)


# What a comparison's runs write under its --output; compare.json and logs/ alone mean nothing ran.
RUN_FOLDERS = ('pretrain', 'points', 'finetune')


def prepare_output(output: str, spec: dict, plans) -> str:
  """Creates the output folder with its spec, or checks that an existing one holds the same
  comparison (UserError naming what differs, and the --pretrained flags that reuse its
  pretraining when only fine-tuning differs: checked against `plans`, never advised in vain)."""
  output = paths.absolute(output)
  spec_path = paths.join(output, 'compare.json')
  if paths.is_file(output):
    raise UserError(f"--output '{output}' is a file; pass a folder")
  if paths.is_file(spec_path):
    saved = paths.read_json(spec_path, 'pass a new --output')
    for entry in [*saved.get('configs', []), *spec['configs']]:  # Paths however written.
      config_lib.paths_as_found(entry.get('config', {}))
    differ = [k for k in {**spec, **saved} if saved.get(k) != spec.get(k)]
    if 'configs' in differ:  # Name the configs added, dropped or changed.
      before = {c['name']: c for c in saved.get('configs', [])}
      now = {c['name']: c for c in spec['configs']}
      changed = sorted(n for n in set(before) | set(now) if before.get(n) != now.get(n))
      differ[differ.index('configs')] = f"configs ({', '.join(changed) or 'their order'})"
    if differ and not any(paths.exists(paths.join(output, folder)) for folder in RUN_FOLDERS):
      # Nothing ran yet (its first train command failed, e.g. on a mistyped train_files): a
      # corrected command would otherwise be refused here for good.
      print(f"--output '{output}' ran nothing of its earlier comparison ({', '.join(differ)} "
            'differed): planning this one instead', flush=True)
      atomic.write_json(spec_path, spec)
      return output
    if differ:
      reuse = ''
      if set(differ) <= {'num_seeds', 'finetune_task', 'finetune_args'}:
        # Only fine-tuning differs: the new --output can start from these pretraining runs.
        workdirs = {c['name']: paths.join(output, 'pretrain', c['name'])
                    for c in saved.get('configs', [])} | saved.get('pretrained', {})
        values = [f'{n}={w}' for n, w in workdirs.items()]
        try:
          pretrained_workdirs(values, plans)
          reuse = (' with ' + ' '.join(f'--pretrained={v}' for v in values)
                   + ' to reuse its pretraining')
        except UserError as e:  # E.g. a point not reached yet: say why it cannot be reused.
          reuse = f' (its pretraining cannot be reused: {e})'
      raise UserError(f"--output '{output}' holds a comparison with different "
                      f"{', '.join(differ)}; re-run with its arguments "
                      f'({spec_path}) or pass a new --output{reuse}')
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
  pretrained = pretrained_workdirs(FLAGS.pretrained, plans)
  output = prepare_output(FLAGS.output, comparison_spec(plans, task_args, pretrained), plans)
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
          f"steps), budget points at steps {', '.join(map(str, p.points))}"
          + ''.join(f' | {k}={v} (the config\'s share of the run)' for k, v in p.scaled.items())
          + (f' | pretrained: {pretrained[p.name]}' if p.name in pretrained else ''), flush=True)
  counter = dict(pretrain_run=0, pretrain_skipped=0, pretrain_reused=0, finetune_run=0,
                 finetune_skipped=0)
  configs, main_metric = [], None
  for p in plans:
    workdir = pretrained.get(p.name) or paths.join(output, 'pretrain', p.name)
    point_records = runs.pretrain(p, FLAGS.override, output, workdir, counter, cache_dir,
                                  train=p.name not in pretrained)
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
                        pretrain_workdir=workdir,
                        flops_per_step=p.flops_per_step, flops_stages=p.flops_stages,
                        num_train_steps=p.num_train_steps,
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
  del argv  # cli.run refuses stray arguments.
  cli.print_result(compare())


def _define_flags():
  flags.DEFINE_list('configs', None, 'Pretraining config files to compare, separated by commas '
                    '(path.py or path.py:arg, as --config= of the train command).')
  flags.DEFINE_float('flops_budget', None, 'Pretraining model FLOPs per config (e.g. 1e15); each '
                     'config trains the most steps whose FLOPs fit it.')
  flags.DEFINE_string('finetune_task', None, "Downstream task: 'files' (configs/finetune/"
                      "files.py: data/austen_novels unless --finetune_override=train_file=... "
                      "eval_file=...), 'acceptability' (configs/finetune/acceptability.py: "
                      "data/austen_acceptability, the bundled CoLA-like set), 'tagging' "
                      "(configs/finetune/tagging.py: data/austen_names unless overridden "
                      "likewise), 'conll2003' (NER; conll2003_chunk, "
                      "conll2003_pos), 'glue/TASK' (e.g. glue/sst2), 'squad/v1.1' or "
                      "'squad/v2.0' (these from TFDS).")
  flags.DEFINE_string('output', None, 'Folder for every run and the results (re-run the same '
                      'command on it to resume).')
  flags.DEFINE_multi_string('override', [], 'KEY=VALUE applied to every pretraining config '
                            '(repeat the flag for several), e.g. --override=train_batch_size=8.')
  flags.DEFINE_multi_string('finetune_override', [], 'KEY=VALUE for the fine-tuning config '
                            '(configs/finetune/glue.py lists the keys), e.g. '
                            '--finetune_override=max_seq_length=64.')
  flags.DEFINE_integer('num_seeds', 3, 'Fine-tuning runs (seeds) per budget point; the table '
                       'reports their median and range.')
  flags.DEFINE_multi_string('pretrained', [], 'NAME=WORKDIR: use the train command\'s existing '
                            'run in WORKDIR as config NAME\'s pretraining instead of training '
                            'it again (read only; its saved config must be the one the budget '
                            'plans, and it must hold a checkpoint at every budget point: another '
                            'comparison\'s OUTPUT/pretrain/NAME may hold it as its kept point, '
                            'OUTPUT/points/NAME/STEP). Repeat for several configs.')
  flags.DEFINE_integer('budget_points', 1, 'Checkpoints per config that are fine-tuned, evenly '
                       'spaced in FLOPs; the last is the end of pretraining.')


def run():
  _define_flags()
  flags.mark_flags_as_required(['configs', 'flops_budget', 'finetune_task', 'output'])
  cli.run(main)


if __name__ == '__main__':
  run()
