"""Every command of every ```bash block of README.md runs as written, so none can break silently.

The commands are found in README.md (not listed here), run in README order in a shell from the
repository root, each with tiny sizes appended (RULES: a command prefix -> the flags appended)
and every `/tmp/` path moved into the test's own directory. What cannot run here is handled
by a rule that says so, never skipped: `pip install` is what CI did before the tests; `hf
download` (the network) is replaced by a tiny random transformers pair of the same layout
(tests/hf_pair.py), and `curl` of the official release by the tiny TF1 checkpoint in
tests/data; GLUE / SQuAD / CoNLL-2003 come from TFDS over the network, so those fine-tuning
commands run up to loading the dataset and must stop there with the one-line error naming it
(and predictions of such a run with the one naming its missing workdir);
`pytest` collects the suite (CI runs it); the GCS emulator that serves until Ctrl-C is started
in the background on a free port, and `export` sets the variable for the commands after it
(naming that port). A command no rule knows fails the test: add a rule.
"""
import dataclasses
import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests import gcs_emulator
from tests import hf_pair
from tests.conftest import REPO_ROOT

README = os.path.join(REPO_ROOT, 'README.md')
# Data for every command: a slice of one novel, so tokenizing takes no time.
CORPUS_BYTES = 30_000


def readme_commands(text: str) -> list[str]:
  """Each command of each ```bash block: continuation lines joined, comments dropped, `&&`
  chains split into their commands."""
  commands = []
  for block in re.findall(r'^```bash\n(.*?)^```', text, re.S | re.M):
    for line in re.sub(r'\s*\\\n\s*', ' ', block).splitlines():
      line = line.strip()
      if line and not line.startswith('#'):
        commands += [part.strip() for part in line.split(' && ')]
  return commands


def _argv(command: str) -> tuple[dict, list[str]]:
  """(environment assignments before the program, the program's argv)."""
  words = shlex.split(command)
  env = {}
  while words and re.fullmatch(r'[A-Z_][A-Z0-9_]*=.*', words[0]):
    name, value = words.pop(0).split('=', 1)
    env[name] = value
  return env, words


def _module(argv: list[str]) -> str | None:
  return argv[2] if argv[:2] == ['python', '-m'] and len(argv) > 2 else None


def _flag(argv: list[str], name: str) -> str | None:
  prefix = f'--{name}='
  return next((a[len(prefix):] for a in argv if a.startswith(prefix)), None)


@dataclasses.dataclass
class Plan:
  """What the test does with one README command."""
  rule: str
  extra: list[str] = dataclasses.field(default_factory=list)  # flags appended
  expect_error: str | None = None  # run, and it must stop with an error line holding this
  stand_in: object = None          # instead of running: a function of (argv, context)
  skip_reason: str | None = None   # not run at all (only `pip install`: CI ran it)


SIZES = ['--config.num_layers=1', '--config.hidden_size=32', '--config.embedding_size=16',
         '--config.intermediate_size=64', '--config.num_heads=2']


def _train(argv, ctx) -> Plan:
  if '--dry_run' in argv and _flag(argv, 'topology'):
    # Compiles the step for the slice as written, of a tiny model; libtpu is in the test extra
    # (without it: the one-line error that says how to install it).
    if importlib.util.find_spec('libtpu') is None:
      return Plan('train --dry_run --topology (no libtpu here)', expect_error='needs libtpu')
    return Plan('train --dry_run --topology (tiny model)',
                [*SIZES, '--config.max_seq_length=32', '--config.dropout_rate=0.0',
                 '--config.attention_dropout_rate=0.0'])
  if '--dry_run' in argv:  # Writes nothing, allocates nothing: runs as written.
    return Plan('train --dry_run')
  corpus = ctx['corpus']
  # No evaluation and no dropout: each costs a compilation (the evaluate command has its own).
  extra = ['--config.num_train_steps=2', '--config.train_batch_size=8',
           '--config.eval_batch_size=8', '--config.max_seq_length=32',
           '--config.eval_every_steps=0', '--config.dropout_rate=0.0',
           '--config.attention_dropout_rate=0.0', '--config.log_every_steps=1',
           '--config.save_checkpoints_steps=2', '--config.progress_bar=false',
           f'--config.train_files={corpus}', f'--config.eval_files={corpus}']
  if not _flag(argv, 'config.init_from'):  # With init_from the sizes come from the source.
    extra += SIZES
  return Plan('train', extra)


def _finetune(argv, ctx) -> Plan:
  from electra_jax.finetune import tasks  # pylint: disable=import-outside-toplevel
  config = _flag(argv, 'config') or ''
  task = tasks.TASKS.get(_flag(argv, 'config.task') or '')
  if config.endswith(('glue.py', 'squad.py', 'conll2003.py')) or (task and task.tfds_name):
    return Plan('finetune (TFDS task: up to loading the dataset)',
                ['--config.tfds_download=false', f'--config.tfds_data_dir={ctx["tmp"]}/no_tfds'],
                expect_error='TFDS dataset')
  return Plan('finetune', ['--config.train_batch_size=8', '--config.eval_batch_size=8',
                           '--config.num_epochs=1', '--config.max_train_examples=16',
                           '--config.max_eval_examples=16', '--config.max_seq_length=32',
                           '--config.num_seeds=1', '--config.progress_bar=false'])


def _predict(argv, ctx) -> Plan:
  del ctx
  if _flag(argv, 'split'):  # Its workdir is a GLUE run, which stopped at loading the dataset.
    return Plan('predict --split (of a TFDS run: no workdir here)',
                expect_error='does not exist; pass a fine-tuning workdir')
  return Plan('predict', ['--max_examples=16'])


def _compare(argv, ctx) -> Plan:
  del argv
  tiny = [*SIZES, 'train_batch_size=8', 'max_seq_length=32', 'eval_every_steps=0',
          f'train_files={ctx["corpus"]}', f'eval_files={ctx["corpus"]}', 'progress_bar=false']
  finetune = ['max_seq_length=32', 'num_epochs=1', 'max_train_examples=16',
              'max_eval_examples=16', 'train_batch_size=8', 'eval_batch_size=8']
  return Plan('experiments.compare',
              ['--flops_budget=2e9', '--budget_points=1', '--num_seeds=1',
               *[f'--override={o.removeprefix("--config.")}' for o in tiny],
               *[f'--finetune_override={o}' for o in finetune]])


def _hf_download(argv, ctx) -> Plan:
  del argv, ctx
  return Plan('hf download (a tiny random pair of the same layout)', stand_in=_fake_download)


def _fake_download(argv, ctx):
  """`hf download ORG/NAME-discriminator|generator --local-dir DIR`: one tiny pair per NAME."""
  repo, local_dir = argv[2], _flag(argv, 'local-dir') or argv[argv.index('--local-dir') + 1]
  family, _, kind = repo.rpartition('-')
  assert kind in ('discriminator', 'generator'), f'no stand-in for {repo}'
  pair = os.path.join(ctx['tmp'], '_hf_stand_ins', family.replace('/', '_'))
  if not os.path.isdir(pair):
    vocab = hf_pair.wordpiece_vocab(os.path.join(pair, 'vocab'))
    hf_pair.save_pair(os.path.join(pair, 'discriminator'), os.path.join(pair, 'generator'),
                      vocab)
  shutil.copytree(os.path.join(pair, kind), local_dir, dirs_exist_ok=True)


def _curl(argv, ctx) -> Plan:
  del argv, ctx
  return Plan('curl (the official release: the tiny TF1 checkpoint tests/data ships)',
              stand_in=_fake_curl)


def _fake_curl(argv, ctx):
  """`curl -L -o FILE URL` of the official release: NAME.zip as the release lays it out
  (NAME/NAME.index, NAME/NAME.data-00000-of-00001, NAME/checkpoint), from the tiny checkpoint
  TensorFlow wrote (tests/data/official_checkpoint); vocab.txt its vocabulary."""
  import zipfile  # pylint: disable=import-outside-toplevel
  del ctx
  output, url = argv[argv.index('-o') + 1], argv[-1]
  fixture = os.path.join(REPO_ROOT, 'tests', 'data', 'official_checkpoint')
  if url.endswith('/vocab.txt'):
    shutil.copy(os.path.join(fixture, 'vocab.txt'), output)
    return
  name = os.path.basename(url).removesuffix('.zip')
  with zipfile.ZipFile(output, 'w') as archive:
    for suffix in ('index', 'data-00000-of-00001'):
      archive.write(os.path.join(fixture, f'model.ckpt-7.{suffix}'), f'{name}/{name}.{suffix}')
    archive.writestr(f'{name}/checkpoint', f'model_checkpoint_path: "{name}"\n')


def _emulator(argv, ctx) -> Plan:
  del argv, ctx
  return Plan('GCS emulator (in the background on a free port)', stand_in=_start_emulator)


def _start_emulator(argv, ctx):
  bucket = _flag(argv, 'bucket')
  emulator = gcs_emulator.Emulator(bucket)
  ctx['finalizers'].append(emulator.stop)
  ctx['ports'][_flag(argv, 'port')] = str(emulator.port)


def _export(argv, ctx) -> Plan:
  del argv, ctx
  return Plan('export (for the commands after it)', stand_in=_set_variable)


def _set_variable(argv, ctx):
  name, value = argv[1].split('=', 1)
  for readme_port, port in ctx['ports'].items():
    value = value.replace(f':{readme_port}', f':{port}')
  ctx['env'][name] = value


# A command's prefix -> what the test does with it (first match wins), and whether it is slow
# (marked `slow`: run with `pytest -m slow`).
RULES = [
    (lambda argv: argv[:2] == ['pip', 'install'],
     lambda argv, ctx: Plan('pip install', skip_reason='CI installed the package and extras'),
     False),
    (lambda argv: argv[:2] == ['hf', 'download'], _hf_download, False),
    (lambda argv: argv[:1] == ['curl'], _curl, False),
    (lambda argv: _module(argv) == 'zipfile',
     lambda argv, ctx: Plan('python -m zipfile (as written)'), False),
    (lambda argv: _module(argv) == 'tests.gcs_emulator', _emulator, False),
    (lambda argv: argv[:1] == ['export'], _export, False),
    (lambda argv: argv[:1] == ['pytest'],
     lambda argv, ctx: Plan('pytest (collect only: CI runs the suite)', ['--collect-only']),
     False),
    (lambda argv: _module(argv) == 'electra_jax.train', _train, False),
    (lambda argv: _module(argv) == 'electra_jax.evaluate',
     lambda argv, ctx: Plan('evaluate', ['--num_batches=1', f'--eval_files={ctx["corpus"]}']),
     False),
    (lambda argv: _module(argv) == 'electra_jax.detect', lambda argv, ctx: Plan('detect'), False),
    (lambda argv: _module(argv) == 'electra_jax.finetune', _finetune, False),
    (lambda argv: _module(argv) == 'electra_jax.predict', _predict, False),
    (lambda argv: _module(argv) == 'electra_jax.export', lambda argv, ctx: Plan('export'), False),
    # Pretrains and fine-tunes every config in its own process: a compilation each (minutes).
    (lambda argv: _module(argv) == 'electra_jax.experiments.compare', _compare, True),
]


def _rule(command: str):
  _, argv = _argv(command)
  for matches, plan, slow in RULES:
    if matches(argv):
      return plan, slow
  raise AssertionError(f'README command with no rule in tests/test_readme.py: {command!r}; '
                       'add a rule (the flags that make it tiny)')


def plan_for(command: str, ctx) -> Plan:
  plan, _ = _rule(command)
  return plan(_argv(command)[1], ctx)


with open(README, encoding='utf-8') as _f:
  COMMANDS = readme_commands(_f.read())


def test_the_readme_parser_finds_the_commands():
  assert len(COMMANDS) >= 10
  assert 'python -m electra_jax.train --config=configs/demo.py --workdir=/tmp/electra_demo' in (
      COMMANDS)
  assert readme_commands('```bash\n# c\na \\\n  b && c\n```\n```python\nx\n```\n') == [
      'a b', 'c']


def test_ci_runs_the_readme_test_command_as_written():
  """CI runs exactly the README's test command (its set-up command 2): the last command of
  .ci/run is that line, so neither can change alone."""
  with open(os.path.join(REPO_ROOT, '.ci', 'run'), encoding='utf-8') as f:
    ci_command = [line.strip() for line in f if line.strip() and not line.startswith('#')][-1]
  with open(README, encoding='utf-8') as f:
    quick_start = f.read().split('## Quick start', 1)[1].split('\n## ', 1)[0]
  block = quick_start.split('# 2. Run the tests', 1)[1].split('```', 1)[0]
  assert ci_command in block.splitlines(), (ci_command, block)


@pytest.fixture(scope='module')
def ctx(tmp_path_factory):
  tmp = str(tmp_path_factory.mktemp('readme'))
  corpus = os.path.join(tmp, 'corpus.txt')
  with open(hf_pair.CORPUS, encoding='utf-8') as f:
    text = f.read(CORPUS_BYTES).rsplit('\n', 1)[0]
  with open(corpus, 'w', encoding='utf-8') as f:
    f.write(text + '\n')
  env = dict(os.environ, PYTHONUNBUFFERED='1', JAX_PLATFORMS='cpu',
             PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', ''),
             PYTHONPATH=REPO_ROOT, JAX_COMPILATION_CACHE_DIR=os.path.join(tmp, 'jax_cache'),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='-1')
  context = dict(tmp=tmp, corpus=corpus, env=env, ports={}, finalizers=[])
  yield context
  for finalize in context['finalizers']:
    finalize()


def _relocate(command: str, tmp: str) -> str:
  """Every /tmp/ path of the README under the test's directory."""
  return command.replace('/tmp/', f'{tmp}/')


def _params():
  """One test per command, in README order; a command no rule knows still gets its test (which
  fails saying so)."""
  params = []
  for i, command in enumerate(COMMANDS):
    try:
      slow = _rule(command)[1]
    except AssertionError:
      slow = False
    params.append(pytest.param(command, id=f'{i:02d}-{" ".join(_argv(command)[1][:3])[:60]}',
                               marks=[pytest.mark.slow] if slow else []))
  return params


@pytest.mark.parametrize('command', _params())
def test_readme_command_runs_as_written(command, ctx):
  plan = plan_for(command, ctx)
  if plan.skip_reason:
    pytest.skip(plan.skip_reason)
  command = _relocate(command, ctx['tmp'])
  env, argv = _argv(command)
  for name in ('workdir', 'output', 'local-dir'):  # Under /tmp, or in the emulator's bucket.
    value = _flag(argv, name) or (argv[argv.index(f'--{name}') + 1]
                                  if f'--{name}' in argv else None)
    assert value is None or value.startswith(ctx['tmp']) or (
        value.startswith('gs://') and 'STORAGE_EMULATOR_HOST' in ctx['env']), (name, value)
  if plan.stand_in is not None:
    plan.stand_in(argv, ctx)
    return
  line = command + ''.join(' ' + shlex.quote(flag) for flag in plan.extra)
  proc = subprocess.run(['bash', '-c', line], cwd=REPO_ROOT, env=dict(ctx['env'], **env),
                        capture_output=True, text=True, timeout=900)
  output = f'{plan.rule}: {line}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n' + (
      proc.stderr[-3000:])
  if plan.expect_error is not None:
    assert proc.returncode == 2, output
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith('error: ') and plan.expect_error in last, output
    return
  assert proc.returncode == 0, output
  if argv[:1] == ['pytest']:
    assert re.search(r'\d+ tests? collected', proc.stdout), output
  elif (_module(argv) or '').startswith('electra_jax'):  # Each ends with a JSON summary line.
    assert proc.stdout.strip().splitlines()[-1].startswith('{'), output


def command_modules() -> list[str]:
  """Every `python -m` command: the modules that run through cli.run."""
  files = glob.glob(os.path.join(REPO_ROOT, 'electra_jax', '**', '*.py'), recursive=True)
  return sorted(os.path.relpath(f, REPO_ROOT)[:-3].replace(os.sep, '.') for f in files
                if 'cli.run(' in open(f, encoding='utf-8').read())


COMMAND_MODULES = command_modules()


@pytest.mark.parametrize('module', COMMAND_MODULES)
def test_help_shows_the_usage_as_a_command_to_copy(module):
  """--help prints the module docstring: a usage command over several lines must keep its
  backslashes (a plain docstring joins the lines with a run of spaces)."""
  doc = importlib.import_module(module).__doc__
  usage = [line for line in doc.splitlines() if line.strip().startswith('python -m ')]
  assert usage, f'{module} docstring shows no command'
  assert not re.search(r'\S {3,}\S', doc), doc
