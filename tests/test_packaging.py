"""setup.cfg: every command (a module with a `run()` entry point) is installed as a console
script, and every console script names such a function."""
import configparser
import glob
import importlib
import os
import re

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
