"""setup.cfg: every command (a module with a `run()` entry point) is installed as a console
script, and every console script names such a function; every package the code imports is
declared."""
import ast
import configparser
import glob
import importlib
import importlib.metadata
import os
import re
import sys

from tests.conftest import REPO_ROOT


def test_every_command_module_has_a_console_script_and_each_script_runs_one():
  setup = configparser.ConfigParser()
  setup.read(os.path.join(REPO_ROOT, 'setup.cfg'))
  scripts = dict(line.split(' = ') for line in
                 setup['options.entry_points']['console_scripts'].strip().splitlines())
  commands = set()
  for path in glob.glob(os.path.join(REPO_ROOT, 'electra_jax', '**', '*.py'), recursive=True):
    with open(path, encoding='utf-8') as f:
      if re.search(r'^def run\(\):', f.read(), re.M):
        module = os.path.relpath(path, REPO_ROOT)[:-len('.py')].replace(os.sep, '.')
        commands.add(f'{module}:run')
  assert sorted(scripts.values()) == sorted(commands)
  for name, target in scripts.items():
    module, function = target.split(':')
    assert callable(getattr(importlib.import_module(module), function)), name


# Imported modules no distribution of their own declares: a namespace (google.auth is
# google-auth's) or what an extra of jax brings (jax[tpu]: libtpu; jax[cuda12]: its plugins).
_MODULE_DISTRIBUTIONS = {'google.auth': 'google-auth', 'libtpu': 'jax', 'jax_plugins': 'jax'}


def test_every_package_the_code_imports_is_declared_in_setup_cfg():
  """Where it is not, an install that happens to bring it today (through another package's
  dependencies) breaks when that package drops it."""
  setup = configparser.ConfigParser()
  setup.read(os.path.join(REPO_ROOT, 'setup.cfg'))
  requirements = setup['options']['install_requires'] + ''.join(
      setup['options.extras_require'].values())
  normal = lambda name: re.sub(r'[-_.]+', '-', name).lower()
  declared = {normal(re.match(r'[A-Za-z0-9_.-]+', line.strip())[0])
              for line in requirements.splitlines() if line.strip()}
  imported = set()
  for path in glob.glob(os.path.join(REPO_ROOT, 'electra_jax', '**', '*.py'), recursive=True):
    with open(path, encoding='utf-8') as f:
      for node in ast.walk(ast.parse(f.read())):
        if isinstance(node, ast.Import):
          imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
          imported.add(node.module)
  distributions = importlib.metadata.packages_distributions()
  undeclared = {}
  for module in imported:
    top = module.split('.')[0]
    if top in sys.stdlib_module_names or top in ('electra_jax', 'configs'):
      continue
    name = next((d for m, d in _MODULE_DISTRIBUTIONS.items()
                 if module == m or module.startswith(m + '.') or top == m), None)
    names = [name] if name else distributions.get(top, [top])
    if not {normal(n) for n in names} & declared:
      undeclared[module] = names
  assert not undeclared, undeclared
