"""Relative data paths resolve against the current directory, then the repository root.

So `python -m electra_jax.train --config=configs/demo.py` finds data/ from any working
directory inside a clone, while paths that exist from the current directory win.
"""
import glob
import os

# The directory that holds the electra_jax package (a clone's root).
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_path(path: str) -> str:
  """`path` if it exists (or is absolute), else the repository-root candidate if that does."""
  path = os.path.expanduser(path)
  if os.path.isabs(path) or os.path.exists(path):
    return path
  candidate = os.path.join(REPO_ROOT, path)
  return candidate if os.path.exists(candidate) else path


def resolve_glob(pattern: str) -> list[str]:
  """Sorted files matching one glob (`**` recurses), from the cwd or else the repository root."""
  pattern = os.path.expanduser(pattern.strip())
  matches = glob.glob(pattern, recursive=True)
  if not matches and not os.path.isabs(pattern):
    matches = glob.glob(os.path.join(REPO_ROOT, pattern), recursive=True)
  return sorted(m for m in matches if os.path.isfile(m))
