"""python -m electra_jax.experiments.compare: FLOPs-matched step counts, the end-to-end sweep on
tiny configs, resuming without redoing finished runs, and one-line errors."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from electra_jax import cli
from electra_jax import paths
from electra_jax import saved_config
from electra_jax.errors import UserError
from electra_jax.experiments import budget
from tests.conftest import REPO_ROOT

# A 1-layer, 32-wide model on 32-token rows: each train / finetune command runs in seconds.
TINY = ['num_layers=1', 'hidden_size=32', 'embedding_size=16', 'intermediate_size=64',
        'num_heads=2', 'max_seq_length=32', 'train_batch_size=8', 'eval_batch_size=8',
        'num_eval_steps=1', 'log_every_steps=1', 'eval_every_steps=0', 'progress_bar=false']
TINY_FINETUNE = ['max_seq_length=16', 'train_batch_size=16', 'eval_batch_size=32',
                 'num_epochs=1', 'progress_bar=false', 'dropout_rate=0.0',
                 'attention_dropout_rate=0.0', 'learning_rate=5e-3']


def write_config(path, generator_hidden_size, num_warmup_steps=100):
  path.write_text('from configs import demo\n\n\ndef get_config():\n'
                  '  c = demo.get_config()\n'
                  f'  c.generator_hidden_size = {generator_hidden_size}\n'
                  f'  c.num_warmup_steps = {num_warmup_steps}\n'
                  '  return c\n')
  return str(path)


def test_steps_are_inversely_proportional_to_flops_per_step(tmp_path):
  small = write_config(tmp_path / 'quarter.py', 0.25)
  large = write_config(tmp_path / 'whole.py', 1.0, num_warmup_steps=3)
  flops_budget = 3.3e14
  a, b = budget.plan_all([small, large], [], flops_budget, 3)
  assert (a.name, b.name) == ('quarter', 'whole')
  assert b.flops_per_step > 1.5 * a.flops_per_step  # a full-width generator costs more
  for plan in (a, b):
    # As many whole steps as the budget buys, and not one more.
    assert plan.total_flops <= flops_budget < plan.total_flops + plan.flops_per_step
    assert plan.config.num_train_steps == plan.num_train_steps
    # Three points evenly spaced in FLOPs, the last at the end of pretraining.
    gaps = np.diff([0] + plan.points)
    assert plan.points[-1] == plan.num_train_steps and len(plan.points) == 3
    assert gaps.max() - gaps.min() <= 1
  # Step counts in inverse proportion to FLOPs per step, within one step.
  assert abs(a.num_train_steps - b.num_train_steps * b.flops_per_step / a.flops_per_step) <= 1
  # Warmup: the config's, capped at 10 % of the run.
  assert a.num_warmup_steps == min(100, a.num_train_steps // 10) and a.config_warmup_steps == 100
  assert b.num_warmup_steps == min(3, b.num_train_steps // 10)
  assert b.scaled == {} and b.train_overrides(['seed=1'])[-2:] == [f'--config.num_train_steps={b.num_train_steps}',
                                                f'--config.num_warmup_steps={b.num_warmup_steps}']


TWO_STAGE = os.path.join(REPO_ROOT, 'configs', 'ablations', 'two_stage.py')
SHRUNK = ['train_batch_size=8', 'max_seq_length=64', 'vocab_size=1000']


@pytest.mark.parametrize('flops_budget', [1e15, 1e17])
def test_two_stage_keeps_its_stage_split_and_its_run_spends_the_budget(flops_budget):
  """two_stage's steps differ in cost: the generator stage keeps its share of the run (half in
  the config), the run's FLOPs (from its stage split) fit the budget with no step to spare,
  and the budget points sit evenly in FLOPs, not in steps."""
  from electra_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from electra_jax import flops  # pylint: disable=import-outside-toplevel
  plan = budget.plan_config(TWO_STAGE, SHRUNK, flops_budget, 2)
  steps, n = plan.num_train_steps, plan.config.two_stage_generator_steps
  assert abs(n - steps / 2) <= 1 and plan.scaled == {'two_stage_generator_steps': n}
  resolved = config_lib.resolve(plan.config)  # the train command would accept it
  spent = flops.flops_to_step(flops.model_flops_stages(resolved), steps)
  assert spent == plan.total_flops <= flops_budget
  # One more step (with the split scaled to it) would pass the budget.
  more = budget.plan_config(TWO_STAGE, SHRUNK, plan.total_flops * (steps + 1) / steps * 1.01, 2)
  assert more.num_train_steps > steps and more.total_flops > flops_budget
  (first_stage, gen_step), (switch, disc_step) = plan.flops_stages
  assert (first_stage, switch) == (0, n) and disc_step > gen_step
  assert plan.flops_at(n + 1) == n * gen_step + disc_step
  # Half the FLOPs is spent after the switch (stage 2 costs more a step) ...
  half = plan.points[0]
  assert half > n and plan.flops_at(half) <= plan.total_flops // 2 < plan.flops_at(half + 1)
  assert plan.points[-1] == steps
  assert f'--config.two_stage_generator_steps={n}' in plan.train_overrides([])


def test_budget_points_are_distinct_steps_when_steps_differ_in_cost():
  """two_stage's steps cost less in its generator-only stage: points evenly spaced in FLOPs
  put two on step 20 of 40 (and none on 19); every point has a step of its own."""
  stages = [(0, 60278439936), (20, 66813165568)]  # two_stage at the demo size, 40 steps.
  for num_points in range(1, 41):
    points = budget.budget_points(stages, 40, num_points)
    assert len(points) == num_points and points[-1] == 40 and points[0] >= 1
    assert all(a < b for a, b in zip(points, points[1:])), (num_points, points)
  assert budget.budget_points(stages, 40, 40) == list(range(1, 41))
  assert budget.budget_points([(0, 10)], 40, 4) == [10, 20, 30, 40]  # Equal costs: unmoved.


def test_a_planned_two_stage_run_warms_up_within_its_shorter_stage(tmp_path):
  """A generator stage whose share of the budget's run is shorter than the planned warmup:
  the plan warms up over that stage, as the run would (each stage warms up anew), and records
  the warmup the run trains with."""
  from electra_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  short = tmp_path / 'short.py'
  short.write_text('from configs.ablations import two_stage\n\n\ndef get_config():\n'
                   '  c = two_stage.get_config()\n'
                   '  c.two_stage_generator_steps = 14000  # of 1,000,000 steps\n'
                   '  return c\n')
  (plan,) = budget.plan_all([str(short)], SHRUNK, 1e15, 1)
  stage = plan.config.two_stage_generator_steps
  assert plan.scaled == {'two_stage_generator_steps': stage} and stage < plan.num_train_steps // 10
  assert plan.num_warmup_steps == plan.config.num_warmup_steps == stage
  assert config_lib.resolve(plan.config, training=True).num_warmup_steps == stage


def test_an_infinite_budget_is_a_one_line_error(tmp_path):
  plain = write_config(tmp_path / 'plain.py', 0.25)
  for value in (float('inf'), float('nan'), 0.0):
    with pytest.raises(UserError, match='must be a positive, finite number of FLOPs'):
      budget.plan_all([plain], [], value, 1)


def test_overrides_are_typed_like_the_config_and_change_the_flops(tmp_path):
  path = write_config(tmp_path / 'a.py', 0.25)
  plain = budget.plan_config(path, [], 1e15, 1)
  wider = budget.plan_config(path, ['hidden_size=256', 'num_heads=4', 'progress_bar=false'],
                             1e15, 1)
  assert wider.config.hidden_size == 256 and wider.config.progress_bar is False
  assert wider.flops_per_step > plain.flops_per_step
  assert wider.num_train_steps < plain.num_train_steps
  for bad, message in [
      ('hidden_size=wide', "--override='hidden_size=wide': --config.hidden_size=wide: invalid "
       'literal for int()'),
      ('hiden_size=1', "--override='hiden_size=1': unknown config key --config.hiden_size (did "
       'you mean --config.hidden_size?); every key is listed in configs/base_config.py'),
      ('num_train_steps=5', 'set by --flops_budget'),
      ('init_from=/some/run', "sets init_from='/some/run': a comparison pretrains every "
       'config from scratch on the same FLOPs; drop init_from'),
      ('hidden_size', 'is not KEY=VALUE')]:
    with pytest.raises(UserError, match=re.escape(message)):
      budget.plan_config(path, ['seed=3', bad, 'progress_bar=false'], 1e15, 1)


def test_overrides_parse_as_the_train_command_parses_them(tmp_path):
  """Every --config.KEY=VALUE spelling the train command accepts (config_flags: bools as t / f,
  ints in hex, a later value of a key winning) means the same in --override, and in
  --finetune_override (placeholder keys included): compare passes them on as they are."""
  path = write_config(tmp_path / 'a.py', 0.25)
  c = budget.plan_config(path, ['progress_bar=f', 'disallow_correct=t',
                                'hidden_size=0x100', 'num_heads=8', 'num_heads=4'], 1e15, 1).config
  assert (c.progress_bar, c.disallow_correct) == (False, True)
  assert (c.hidden_size, c.num_heads) == (256, 4)
  finetune = budget.load_config(os.path.join(REPO_ROOT, 'configs', 'finetune', 'files.py'),
                                ['save_best_checkpoint=f', 'learning_rate=1e-3'],
                                '--finetune_override', {}, '--finetune_task',
                                'configs/finetune/glue.py')
  assert finetune.save_best_checkpoint is False and finetune.learning_rate == 1e-3
  from electra_jax.experiments import compare  # pylint: disable=import-outside-toplevel
  assert compare.finetune_config('tagging') == (
      os.path.join(REPO_ROOT, 'configs', 'finetune', 'tagging.py'), 'tagging')
  assert compare.finetune_config('acceptability') == (
      os.path.join(REPO_ROOT, 'configs', 'finetune', 'acceptability.py'), 'files')
  assert compare.finetune_config('conll2003_chunk') == (
      os.path.join(REPO_ROOT, 'configs', 'finetune', 'conll2003.py'), 'conll2003_chunk')


def test_config_file_mistakes_name_the_file_and_each_file_is_its_own(tmp_path):
  """A file without get_config() is refused even right after one with it (config_flags keeps
  the module it imports), and a file that fails to import or to build its config is named."""
  with_config = write_config(tmp_path / 'good.py', 0.25)
  (tmp_path / 'no_get.py').write_text('X = 1\n')
  (tmp_path / 'bad_import.py').write_text('import no_such_module_here\n')
  (tmp_path / 'raises.py').write_text('def get_config():\n  raise ValueError("no size")\n')
  (tmp_path / 'attribute.py').write_text('import os\nX = os.nope\n')
  (tmp_path / 'name.py').write_text('def get_config():\n  c = None\n  return nope\n')
  (tmp_path / 'run').mkdir()
  (tmp_path / 'run' / 'config.json').write_text('{"model_size": "demo", "tied": true}\n')
  (tmp_path / 'typo.py').write_text('from configs import demo\n\n\ndef get_config():\n'
                                    '  c = demo.get_config()\n  c.num_layer = 1\n  return c\n')
  for spec, message in [
      (str(tmp_path / 'typo.py'), "sets unknown key 'num_layer' (did you mean 'num_layers'?)"),
      (str(tmp_path / 'no_get.py'), 'has no get_config() function'),
      (str(tmp_path / 'nope.py'), f"cannot load config file '{tmp_path / 'nope.py'}'"),
      (str(tmp_path / 'bad_import.py'),
       "failed to import (ModuleNotFoundError: No module named 'no_such_module_here')"),
      (str(tmp_path / 'raises.py'), 'get_config() failed (ValueError: no size)'),
      (f'{with_config}:arg', 'get_config() failed (TypeError: '),
      # Errors of the file's own code (not config_flags' TypeError / ValueError) were reported
      # as unknown keys (AttributeError) or a bad command line (NameError), without the file.
      (str(tmp_path / 'attribute.py'), 'attribute.py\' failed at line 2 (AttributeError: '
       "module 'os' has no attribute 'nope')"),
      (str(tmp_path / 'name.py'), "name.py' failed at line 3 (NameError: name 'nope' is not "
       'defined)'),
      (str(tmp_path / 'run' / 'config.json'), "config.json' is JSON; --config takes a Python "
       'config file such as configs/demo.py')]:
    with pytest.raises(UserError, match=re.escape(message)) as e:
      budget.plan_all([with_config, spec], ['seed=1'], 1e15, 1)
    assert str(e.value).startswith('--configs: ') and '\n' not in str(e.value)


def test_a_config_path_resolves_from_the_repository_root_as_data_paths_do(tmp_path,
                                                                          monkeypatch):
  monkeypatch.chdir(tmp_path)  # No configs/ here: configs/demo.py is the repository's.
  assert cli.load_config('configs/demo.py:mlm').objective == 'mlm'
  (tmp_path / 'configs').mkdir()  # The current directory's own file wins.
  (tmp_path / 'configs' / 'demo.py').write_text(
      'from configs import demo\n\n\ndef get_config():\n  c = demo.get_config()\n'
      '  c.seed = 7\n  return c\n')
  assert cli.load_config('configs/demo.py').seed == 7


_CHILD = """import signal, sys, time
def stop(*_):
  print('Stopped at step 3; checkpoint saved', flush=True)
  sys.exit(0)
signal.signal(signal.SIGINT, stop)
print('started', flush=True)
time.sleep(60)
"""
_DRIVER = """import os, sys
from electra_jax.experiments import runs
from electra_jax.errors import UserError
try:
  runs.run_command('child', [], os.path.join(sys.argv[1], 'child.log'), 'child')
except UserError as e:
  print('error:', e)
"""


def test_a_ctrl_c_keeps_the_commands_last_lines_in_its_log(tmp_path):
  """Ctrl-C reaches compare and the command it runs (one process group): the command's last
  lines, where it stopped and its result, still go to the command log."""
  (tmp_path / 'child.py').write_text(_CHILD)
  (tmp_path / 'driver.py').write_text(_DRIVER)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(tmp_path), REPO_ROOT)))
  proc = subprocess.Popen([sys.executable, str(tmp_path / 'driver.py'), str(tmp_path)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True)
  log = tmp_path / 'child.log'
  for _ in range(300):
    if log.exists() and 'started' in log.read_text():
      break
    time.sleep(0.1)
  os.killpg(proc.pid, signal.SIGINT)
  out, err = proc.communicate(timeout=60)
  assert 'error: child was stopped (signal 2)' in out, err
  assert 'Stopped at step 3; checkpoint saved' in log.read_text()


def run_compare(*flags, env=None):
  env = dict(os.environ, PYTHONUNBUFFERED='1', JAX_PLATFORMS='cpu', **(env or {}),
             PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
  return subprocess.run([sys.executable, '-m', 'electra_jax.experiments.compare', *flags],
                        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)


def _write_sentiment(path, n, seed):
  """A toy two-class task: the words decide the label."""
  rng = np.random.default_rng(seed)
  lines = ['text\tlabel']
  for _ in range(n):
    label = int(rng.integers(2))
    words = list(rng.choice(['the', 'day', 'was', 'and', 'very'], 4)) + list(
        rng.choice(['happy', 'kind'] if label else ['sad', 'cruel'], 2))
    rng.shuffle(words)
    lines.append(' '.join(words) + '\t' + ('good' if label else 'bad'))
  path.write_text('\n'.join(lines) + '\n')


@pytest.fixture(scope='module')
def sweep(tmp_path_factory):
  """Two configs (generator 1/4 and 1/2 width) matched on FLOPs, 2 seeds each, run twice."""
  root = tmp_path_factory.mktemp('compare')
  with open(os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'train',
                         sorted(os.listdir(os.path.join(REPO_ROOT, 'data', 'demo_corpus',
                                                        'train')))[0]), encoding='utf-8') as f:
    (root / 'corpus.txt').write_text(f.read(30_000).rsplit('\n', 1)[0] + '\n', encoding='utf-8')
  _write_sentiment(root / 'train.tsv', 64, 0)
  _write_sentiment(root / 'eval.tsv', 32, 1)
  configs = [write_config(root / 'gen_quarter.py', 0.25), write_config(root / 'gen_half.py', 0.5)]
  # Progress bars left at the configs' default (on): compare turns its commands' bars off.
  with_bars = lambda overrides: [o for o in overrides if o != 'progress_bar=false']
  flags = [f'--configs={",".join(configs)}', '--flops_budget=2.3e8', '--finetune_task=files',
           f'--output={root / "out"}', '--num_seeds=2',
           *[f'--override={o}' for o in with_bars(TINY) + [f'train_files={root / "corpus.txt"}']],
           *[f'--finetune_override={o}' for o in with_bars(TINY_FINETUNE)
             + [f'train_file={root / "train.tsv"}', f'eval_file={root / "eval.tsv"}']]]
  # One compilation cache for the whole module (compare otherwise keeps one per output).
  env = dict(JAX_COMPILATION_CACHE_DIR=str(root / 'jax_cache'))
  first = run_compare(*flags, env=env)
  assert first.returncode == 0, first.stdout + first.stderr
  out = str(root / 'out')
  mtimes = {p: os.path.getmtime(os.path.join(out, p)) for p in (
      'finetune/gen_quarter/5/results.json', 'points/gen_half/4/point.json',
      'pretrain/gen_quarter/checkpoints/5')}
  second = run_compare(*flags, env=env)
  return dict(root=root, out=out, flags=flags, env=env, first=first, second=second,
              mtimes=mtimes)


def last_json(stdout):
  return json.loads(stdout.strip().splitlines()[-1])


def test_sweep_pretrains_each_config_for_the_budget_and_fine_tunes_every_seed(sweep):
  summary = last_json(sweep['first'].stdout)
  assert summary['status'] == 'completed' and summary['main_metric'] == 'accuracy'
  # The commands' log lines come through; their progress bars (a line per redraw) do not.
  assert '[pretrain gen_quarter] Writing to' in sweep['first'].stderr
  assert '%|' not in sweep['first'].stderr, sweep['first'].stderr
  assert (summary['pretrain_run'], summary['finetune_run']) == (2, 2)
  with open(os.path.join(sweep['out'], 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  assert [c['name'] for c in results['configs']] == ['gen_quarter', 'gen_half']
  for run in results['configs']:
    assert run['objective'] == 'electra'
    assert run['num_train_steps'] == int(2.3e8 // run['flops_per_step'])
    assert run['total_flops'] == run['num_train_steps'] * run['flops_per_step'] <= 2.3e8
    assert run['num_warmup_steps'] == 0  # 10 % of 4-5 steps
    (point,) = run['points']
    assert point['step'] == run['num_train_steps']
    # The pretraining run really went that far and logged its last step.
    workdir = os.path.join(sweep['out'], 'pretrain', run['name'])
    with open(os.path.join(workdir, 'config.json'), encoding='utf-8') as f:
      assert json.load(f)['num_train_steps'] == run['num_train_steps']
    assert point['pretrain']['train']['step'] == point['step']
    # The point keeps its own copy of the run's vocabulary (it outlives the run).
    point_dir = os.path.join(sweep['out'], 'points', run['name'], str(point['step']))
    vocab = saved_config.load(point_dir).vocab_file
    assert paths.parent(vocab) == point_dir
    assert paths.same_file(vocab, saved_config.load(workdir).vocab_file)
    assert np.isfinite(point['pretrain']['train']['loss'])
    # Fine-tuned from exactly that checkpoint, with every seed.
    ft = point['finetune']
    with open(os.path.join(ft['workdir'], 'results.json'), encoding='utf-8') as f:
      ft_results = json.load(f)
    assert ft_results['init_checkpoint'].endswith(f"points/{run['name']}/{point['step']}")
    assert len(ft['seeds']) == 2 and ft['median'] == pytest.approx(np.median(ft['seeds']))
    assert ft['seeds'] == ft_results['best_accuracy_per_seed']
  steps = {c['name']: c['num_train_steps'] for c in results['configs']}
  assert steps['gen_quarter'] > steps['gen_half']  # the wider generator costs more per step


def test_results_markdown_matches_results_json_and_plots_exist(sweep):
  out = sweep['out']
  with open(os.path.join(out, 'results.json'), encoding='utf-8') as f:
    results = json.load(f)
  with open(os.path.join(out, 'results.md'), encoding='utf-8') as f:
    rows = [line for line in f if re.match(r'\| gen_', line)]
  assert len(rows) == 2
  for row, run in zip(rows, results['configs']):
    name, objective, flops, steps, median, spread = [x.strip() for x in row.strip('|\n')
                                                     .split('|')]
    point = run['points'][-1]
    assert (name, objective, int(steps)) == (run['name'], run['objective'], point['step'])
    assert float(flops) == pytest.approx(point['flops'], rel=5e-3)
    assert float(median) == pytest.approx(point['finetune']['median'], abs=5e-5)
    low, high = (float(x) for x in spread.split('–'))
    assert low == pytest.approx(min(point['finetune']['seeds']), abs=5e-5)
    assert high == pytest.approx(max(point['finetune']['seeds']), abs=5e-5)
  for name in ('downstream_vs_flops.png', 'pretraining_curves.png'):
    with open(os.path.join(out, name), 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_rerunning_the_same_command_skips_finished_runs(sweep):
  summary = last_json(sweep['second'].stdout)
  assert (summary['pretrain_run'], summary['pretrain_skipped']) == (0, 2)
  assert (summary['finetune_run'], summary['finetune_skipped']) == (0, 2)
  assert 'already done, skipped' in sweep['second'].stdout
  for path, mtime in sweep['mtimes'].items():
    assert os.path.getmtime(os.path.join(sweep['out'], path)) == mtime, path
  assert summary['median'] == last_json(sweep['first'].stdout)['median']


def test_a_different_budget_on_the_same_output_is_refused(sweep):
  flags = [f for f in sweep['flags'] if not f.startswith('--flops_budget')]
  proc = run_compare(*flags, '--flops_budget=4e8', env=sweep['env'])
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
  assert 'holds a comparison with different flops_budget' in proc.stderr


def test_a_spec_matches_the_same_files_however_its_paths_were_written(tmp_path, monkeypatch):
  """compare.json holds each config as planned (paths as typed; older versions wrote resolved
  ones with paths as typed too): a re-run naming the same files, relative or absolute, is the
  same comparison; other files are another."""
  # pylint: disable=import-outside-toplevel
  from configs import demo
  from electra_jax.experiments import compare
  (tmp_path / 'mine').mkdir()
  (tmp_path / 'mine' / 'a.txt').write_text('text\n')
  monkeypatch.chdir(tmp_path)
  spec = lambda **keys: {'configs': [{'name': 'demo', 'config': dict(demo.get_config().to_dict(),
                                                                     **keys)}]}
  output = str(tmp_path / 'out')
  assert compare.prepare_output(output, spec(train_files='mine/*.txt'), []) == output
  assert compare.prepare_output(output, spec(train_files='mine/*.txt'), []) == output  # A re-run.
  assert compare.prepare_output(output, spec(train_files=str(tmp_path / 'mine' / '*.txt')), [])
  (tmp_path / 'out' / 'pretrain' / 'demo').mkdir(parents=True)  # Its first run started.
  with pytest.raises(UserError, match=r'holds a comparison with different configs \(demo\)'):
    compare.prepare_output(output, spec(train_files='data/demo_corpus/train/*.txt'), [])


def test_an_output_whose_comparison_ran_nothing_takes_a_corrected_command(tmp_path, capsys):
  """A mistyped train_files failed the first train command before it wrote anything; the
  corrected command was refused for good as "a comparison with different configs"."""
  from configs import demo  # pylint: disable=import-outside-toplevel
  from electra_jax.experiments import compare  # pylint: disable=import-outside-toplevel
  spec = lambda files: {'configs': [{'name': 'demo', 'config': dict(demo.get_config().to_dict(),
                                                                    train_files=files)}]}
  output = str(tmp_path / 'out')
  compare.prepare_output(output, spec('data/demo_corpus/train/*.tx'), [])
  (tmp_path / 'out' / 'logs').mkdir()  # The failed command's log.
  assert compare.prepare_output(output, spec('data/demo_corpus/train/*.txt'), []) == output
  assert 'ran nothing of its earlier comparison (configs (demo) differed)' in (
      capsys.readouterr().out)
  with open(tmp_path / 'out' / 'compare.json', encoding='utf-8') as f:
    assert json.load(f) == spec('data/demo_corpus/train/*.txt')


def test_other_fine_tuning_on_the_same_output_is_refused_naming_the_runs_to_reuse(sweep):
  """Only fine-tuning differs: the refusal says how a new --output starts from this one's
  pretraining (each --pretrained=NAME=WORKDIR)."""
  flags = [f for f in sweep['flags'] if not f.startswith('--num_seeds')]
  proc = run_compare(*flags, '--num_seeds=1', env=sweep['env'])
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
  assert 'holds a comparison with different num_seeds' in proc.stderr
  reuse = ' '.join(f'--pretrained={n}={os.path.join(sweep["out"], "pretrain", n)}'
                   for n in ('gen_quarter', 'gen_half'))
  assert proc.stderr.strip().endswith(f'pass a new --output with {reuse} to reuse its pretraining')


def test_the_advised_reuse_works_after_rotation_and_is_not_advised_in_vain(sweep, tmp_path):
  """keep_checkpoint_max may rotate a budget point's checkpoint out of OUTPUT/pretrain/NAME: the
  advised --pretrained=NAME=OUTPUT/pretrain/NAME then reads the point's kept copy
  (OUTPUT/points/NAME/STEP). Without that copy either, no --pretrained is advised."""
  from electra_jax.experiments import compare  # pylint: disable=import-outside-toplevel
  old = tmp_path / 'old'  # A copy: other tests read the sweep's own checkpoints.
  old.mkdir()
  shutil.copy(os.path.join(sweep['out'], 'compare.json'), old)
  for part in ('pretrain', 'points'):
    shutil.copytree(os.path.join(sweep['out'], part), old / part)
  for name, step in (('gen_quarter', 5), ('gen_half', 4)):  # Rotated away.
    shutil.rmtree(old / 'pretrain' / name / 'checkpoints' / str(step))
  configs = [f for f in sweep['flags'] if f.startswith('--configs')][0].split('=')[1].split(',')
  overrides = [f.split('=', 1)[1] for f in sweep['flags'] if f.startswith('--override=')]
  plans = budget.plan_all(configs, overrides, 2.3e8, 1)
  spec = dict(paths.read_json(str(old / 'compare.json')), num_seeds=1)
  with pytest.raises(UserError) as e:
    compare.prepare_output(str(old), spec, plans)
  advice = re.findall(r'--pretrained=\S+', str(e.value))
  assert advice == [f'--pretrained={n}={old / "pretrain" / n}' for n in ('gen_quarter', 'gen_half')]
  flags = [f for f in sweep['flags'] if not f.startswith(('--num_seeds', '--output'))]
  proc = run_compare(*flags, '--num_seeds=1', f'--output={tmp_path / "new"}', *advice,
                     env=sweep['env'])
  assert proc.returncode == 0, proc.stdout + proc.stderr
  summary = last_json(proc.stdout)
  assert (summary['pretrain_run'], summary['pretrain_reused']) == (0, 2)
  assert f"step 5 in {old / 'points' / 'gen_quarter' / '5'} (--pretrained)" in proc.stdout
  with open(tmp_path / 'new' / 'points' / 'gen_quarter' / '5' / 'point.json',
            encoding='utf-8') as f:
    assert json.load(f) == paths.read_json(str(old / 'points' / 'gen_quarter' / '5' / 'point.json'))
  shutil.rmtree(old / 'points' / 'gen_half')  # Its point is gone too: nothing to reuse.
  with pytest.raises(UserError, match=re.escape(
      "or pass a new --output (its pretraining cannot be reused: --pretrained='gen_half=")) as e:
    compare.prepare_output(str(old), spec, plans)
  assert 'no checkpoint of step(s) 4 (the budget points)' in str(e.value)


def test_pretrained_reuses_a_finished_run_read_only_and_refuses_another_config(sweep, tmp_path):
  """--pretrained=NAME=WORKDIR: no training, the same budget point, so the same fine-tuning
  scores; the run's folder is left as it was. A run of another config, a name that is not a
  config, or a run without the budget point's checkpoint is refused before anything is written."""
  flags = [f for f in sweep['flags'] if not f.startswith(('--configs', '--output'))]
  quarter = [f for f in sweep['flags'] if f.startswith('--configs')][0].split('=')[1].split(',')[0]
  run_dir = os.path.join(sweep['out'], 'pretrain', 'gen_quarter')
  before = {p: os.path.getmtime(os.path.join(root, p)) for root, _, names in os.walk(run_dir)
            for p in names}
  out = tmp_path / 'reused'
  proc = run_compare(f'--configs={quarter}', f'--output={out}', *flags,
                     f'--pretrained=gen_quarter={run_dir}', env=sweep['env'])
  assert proc.returncode == 0, proc.stdout + proc.stderr
  summary = last_json(proc.stdout)
  assert (summary['pretrain_run'], summary['pretrain_reused'], summary['finetune_run']) == (0, 1, 1)
  assert f'pretrained: {run_dir}' in proc.stdout
  assert not (out / 'pretrain').exists()
  assert summary['median']['gen_quarter'] == last_json(sweep['first'].stdout)['median'][
      'gen_quarter']
  with open(out / 'results.json', encoding='utf-8') as f:
    (run,) = json.load(f)['configs']
  assert run['pretrain_workdir'] == run_dir
  assert run['points'][0]['pretrain']['train']['step'] == run['num_train_steps']
  assert before == {p: os.path.getmtime(os.path.join(root, p))
                    for root, _, names in os.walk(run_dir) for p in names}
  # The same output without the flag is another comparison.
  again = run_compare(f'--configs={quarter}', f'--output={out}', *flags, env=sweep['env'])
  assert again.returncode == 2 and 'holds a comparison with different pretrained' in again.stderr
  half_dir = os.path.join(sweep['out'], 'pretrain', 'gen_half')
  bad = tmp_path / 'bad'
  for extra, message in [
      ([f'--pretrained=gen_quarter={half_dir}'],
       'that run was trained with another config than the comparison plans for gen_quarter '
       '(generator_hidden_size: 0.5 in the run, 0.25 planned'),
      ([f'--pretrained=gen_third={run_dir}'], "'gen_third' is not one of the configs"),
      ([f'--pretrained={run_dir}'], 'is not NAME=WORKDIR'),
      ([f'--pretrained=gen_quarter={tmp_path}'], 'not a training workdir'),
      ([f'--pretrained=gen_quarter={run_dir}', '--budget_points=2'],
       f'no checkpoint of step(s) 2 (the budget points) in {run_dir}')]:
    proc = run_compare(f'--configs={quarter}', f'--output={bad}',
                       *[f for f in flags if not f.startswith('--budget_points')], *extra,
                       env=sweep['env'])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert not bad.exists()


@pytest.mark.parametrize('override, set_by', [
    ('init_checkpoint=/elsewhere', 'the budget point'),
    ('init_step=3', "the budget point's step"),
    ('random_init=true', "the budget point's checkpoint")])
def test_a_fine_tuning_override_of_the_budget_points_weights_is_refused(override, set_by):
  """random_init=true fine-tuned random weights under each config's name (results.md showed
  them as its pretraining's score); init_step failed only after the pretraining."""
  from electra_jax.experiments import compare  # pylint: disable=import-outside-toplevel
  key = override.partition('=')[0]
  with pytest.raises(UserError, match=re.escape(
      f"--finetune_override={override!r}: {key} is set by {set_by}; drop it")):
    compare.finetune_args('files', [override])


def test_a_damaged_record_in_the_output_is_one_line_naming_it(tmp_path):
  """A hand-edited compare.json (or point.json, results.json) was a JSONDecodeError traceback."""
  from electra_jax.experiments import compare  # pylint: disable=import-outside-toplevel
  spec_path = tmp_path / 'compare.json'
  for content, problem in (('{"configs": [\n', 'is not valid JSON (Expecting value'),
                           ('[]', 'holds a JSON list, not an object')):
    spec_path.write_text(content)
    with pytest.raises(UserError, match=re.escape(f"'{spec_path}' {problem}") + '.*; pass a new '
                       '--output$'):
      compare.prepare_output(str(tmp_path), dict(configs=[]), [])
    assert spec_path.read_text() == content


@pytest.mark.parametrize('points', [1, 2])
def test_the_budget_a_too_small_budget_asks_for_is_enough(points):
  """The figure was the cost rounded to 4 digits, often below it: the advice was refused."""
  from electra_jax.experiments import budget  # pylint: disable=import-outside-toplevel
  for batch in (8, 10, 14):
    overrides = [f'train_batch_size={batch}']
    with pytest.raises(UserError, match='raise the budget to at least') as error:
      budget.plan_all(['configs/demo.py'], overrides, 1e9, points)
    suggested = float(re.search(r'at least ([0-9.e+]+)$', str(error.value)).group(1))
    plan, = budget.plan_all(['configs/demo.py'], overrides, suggested, points)
    assert plan.num_train_steps == points


def test_bad_config_path_and_too_small_budget_are_one_line_errors(tmp_path):
  out = tmp_path / 'out'
  cases = [(['--configs=configs/demo.py,configs/nope.py', '--flops_budget=1e15'],
            "--configs: cannot load config file 'configs/nope.py'"),
           (['--configs=configs/demo.py', '--flops_budget=1e6'],
            '--flops_budget=1e+06 is too small for config demo'),
           (['--configs=configs/demo.py', '--flops_budget=1e15', '--override=hidden_size=x'],
            "--override='hidden_size=x': --config.hidden_size=x: invalid literal for int()")]
  for flags, message in cases:
    proc = run_compare(*flags, '--finetune_task=files', f'--output={out}')
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ') and message in lines[0], lines
    assert not out.exists()  # nothing written before the arguments check out
  proc = run_compare('--configs=configs/demo.py', '--flops_budget=1e15',
                     '--finetune_task=glue/nope', f'--output={out}')
  assert proc.returncode == 2 and "--finetune_task='glue/nope' is not a task" in proc.stderr
  # The fine-tuning data is read before any pretraining.
  proc = run_compare('--configs=configs/demo.py', '--flops_budget=1e15', '--finetune_task=files',
                     f'--finetune_override=eval_file={tmp_path}/nope.tsv', f'--output={out}')
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: --finetune_task=files: file '{tmp_path}/nope.tsv' not found; pass an existing "
      'CSV/TSV (a header row), JSON Lines, Parquet or Arrow file'], proc.stderr
  assert not out.exists()


@pytest.mark.slow
def test_budget_points_fine_tune_the_checkpoint_of_each_point(tmp_path):
  """Two budget points: the train command stops at the first (exact checkpoint), continues to
  the end, and each point is fine-tuned from its own step."""
  _write_sentiment(tmp_path / 'train.tsv', 64, 0)
  _write_sentiment(tmp_path / 'eval.tsv', 32, 1)
  config = write_config(tmp_path / 'gen.py', 0.25)
  out = tmp_path / 'out'
  proc = run_compare(f'--configs={config}', '--flops_budget=2.7e8', '--finetune_task=files',
                     f'--output={out}', '--num_seeds=1', '--budget_points=2',
                     *[f'--override={o}' for o in TINY],
                     *[f'--finetune_override={o}' for o in TINY_FINETUNE
                       + [f'train_file={tmp_path / "train.tsv"}',
                          f'eval_file={tmp_path / "eval.tsv"}']])
  assert proc.returncode == 0, proc.stdout + proc.stderr
  with open(out / 'results.json', encoding='utf-8') as f:
    (run,) = json.load(f)['configs']
  steps = run['num_train_steps']
  assert [p['step'] for p in run['points']] == [steps // 2, steps]
  assert f'Stopped at step {steps // 2}' in proc.stderr
  for point in run['points']:
    step = point['step']
    assert point['flops'] == step * run['flops_per_step'] == step * run['flops_stages'][0][1]
    assert os.listdir(out / 'points' / 'gen' / str(step) / 'checkpoints') == [str(step)]
    assert point['pretrain']['train']['step'] == step
    with open(os.path.join(point['finetune']['workdir'], 'results.json'), encoding='utf-8') as f:
      assert json.load(f)['init_checkpoint'] == str(out / 'points' / 'gen' / str(step))
  # Stopping at the first point neither skipped nor repeated a logged step.
  with open(out / 'pretrain' / 'gen' / 'metrics.jsonl', encoding='utf-8') as f:
    assert [json.loads(line)['step'] for line in f] == list(range(1, steps + 1))
