"""The bundled fine-tuning sets are what their scripts in data/ build (byte for byte), and the
acceptability set's corruptions are what its docstring says."""
import filecmp
import os
import random
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO_ROOT, 'data')


@pytest.mark.parametrize('script,directory,files', [
    ('make_finetune_set.py', 'austen_novels', ('train.tsv', 'eval.tsv')),
    ('make_tagging_set.py', 'austen_names', ('train.txt', 'eval.txt')),
    ('make_acceptability_set.py', 'austen_acceptability', ('train.tsv', 'eval.tsv')),
])
def test_the_bundled_set_is_what_its_script_builds(script, directory, files, tmp_path):
  subprocess.run([sys.executable, os.path.join(DATA, script), f'--output_dir={tmp_path}'],
                 cwd=REPO_ROOT, check=True, capture_output=True)
  for name in files:
    assert filecmp.cmp(tmp_path / name, os.path.join(DATA, directory, name), shallow=False), name


@pytest.fixture(name='acceptability')
def fixture_acceptability(monkeypatch):
  monkeypatch.syspath_prepend(DATA)
  import make_acceptability_set  # pylint: disable=import-outside-toplevel
  return make_acceptability_set


def test_a_corrupted_sentence_differs_after_its_first_word(acceptability):
  rng = random.Random(0)
  words = 'she could not but smile at the idea of it'.split()
  replacements = ['the', 'a', 'smile', 'and', 'Emma']
  kinds = set()
  for _ in range(200):
    out = acceptability.corrupt(words, replacements, rng)
    assert out != words and out[0] == words[0] and len(out) == len(words)
    changed = sum(a != b for a, b in zip(out, words))
    assert changed >= 2  # At least two words, as the docstring says (a swap moves two).
    kinds.add('swap' if sorted(out) == sorted(words) else 'replace')
  assert kinds == {'swap', 'replace'}
  # Swapping neighbours that are the same word leaves the sentence as it was: replaced instead.
  same = 'no no no no'.split()
  for _ in range(20):
    assert acceptability.corrupt(same, ['yes', 'no'], rng) != same


def test_evaluation_sentences_come_from_the_novel_pretraining_never_sees(acceptability):
  def texts(path, label):
    with open(path, encoding='utf-8') as f:
      rows = [line.rstrip('\n').split('\t') for line in f][1:]
    return [text for text, row_label in rows if row_label == label]

  corpus = os.path.join(DATA, 'demo_corpus')
  held_out = set(acceptability.sentences(os.path.join(corpus, 'eval', 'persuasion.txt')))
  acceptable = texts(os.path.join(DATA, 'austen_acceptability', 'eval.tsv'), 'acceptable')
  corrupted = texts(os.path.join(DATA, 'austen_acceptability', 'eval.tsv'), 'corrupted')
  assert acceptable and set(acceptable) <= held_out
  assert corrupted and not set(corrupted) & held_out
  assert 0.4 < len(corrupted) / (len(acceptable) + len(corrupted)) < 0.6
