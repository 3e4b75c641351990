"""How the suite itself runs: its files in parallel, one pytest-xdist worker a usable CPU."""
import configparser
import os

import conftest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_auto_workers_are_one_a_usable_cpu_at_most_8(monkeypatch):
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(2)))
  assert conftest.pytest_xdist_auto_num_workers(None) == 2
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(64)))
  assert conftest.pytest_xdist_auto_num_workers(None) == 8
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set())
  assert conftest.pytest_xdist_auto_num_workers(None) == 1
  monkeypatch.delattr(os, 'sched_getaffinity')  # macOS: the CPU count.
  monkeypatch.setattr(os, 'cpu_count', lambda: 4)
  assert conftest.pytest_xdist_auto_num_workers(None) == 4


def test_the_default_run_is_parallel_by_file():
  """Whole files a worker: a file's module-scoped fixtures are built once, and README's
  commands run in order in one worker."""
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(REPO_ROOT, 'setup.cfg'))
  addopts = cfg['tool:pytest']['addopts'].split()
  assert addopts[addopts.index('-n') + 1] == 'auto'
  assert addopts[addopts.index('--dist') + 1] == 'loadfile'
  assert any(r.startswith('pytest-xdist') for r in cfg['options.extras_require']['test'].split())
