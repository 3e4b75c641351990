"""How the suite itself runs: `pytest -n auto` starts one pytest-xdist worker a usable CPU."""
import os

import conftest


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
