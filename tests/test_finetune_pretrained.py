"""The claim pretraining exists for: fine-tuning a pretrained demo model beats the same
architecture from random weights on the bundled Austen set. Slow (pretrains the demo model,
then 2 x 3 fine-tuning runs): `pytest -m slow tests/test_finetune_pretrained.py`. Set
ELECTRA_DEMO_WORKDIR to an existing demo pretraining workdir to skip the pretraining."""
import json
import os

import pytest

from tests.conftest import FAST_COMPILE_XLA_FLAGS
from tests.test_finetune import run_cli
from tests.test_train_cli import run_cli as run_module

FLAGS = ['--config=configs/finetune/files.py', '--config.max_seq_length=64',
         '--config.num_seeds=3', '--config.progress_bar=false']


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason=(
    'not yet true at CPU-demo scale (benchmarks/RESULTS.md, issue 19 and session 16): the '
    'demo checkpoint fine-tunes to a median 0.303 vs 0.328 from random init; configs/demo_long.py '
    '(6,000 steps, held-out AUC 0.786) fine-tunes to median accuracies below random init on '
    'this lexical task (3 epochs: 0.312 vs 0.328; 10 epochs, seed 0: 0.463 vs 0.511), and '
    'below it with classifier_pooling=mean too (0.325 vs 0.369), where the MLM baseline at '
    'equal FLOPs transfers (0.498). '
    'Remove this mark once pretraining beats the baseline.'))
def test_finetuning_a_pretrained_demo_model_beats_random_init(tmp_path, monkeypatch):
  # Thousands of demo-size steps: optimised XLA code (the suite's fast-compile flags run the
  # demo's step 2.3x slower; benchmarks/RESULTS.md, session 10).
  monkeypatch.setenv('XLA_FLAGS',
                     os.environ['XLA_FLAGS'].replace(FAST_COMPILE_XLA_FLAGS, '').strip())
  workdir = os.environ.get('ELECTRA_DEMO_WORKDIR')
  if not workdir:
    workdir = str(tmp_path / 'pretrain')
    run_module('electra_jax.train', '--config=configs/demo.py', f'--workdir={workdir}',
               '--config.progress_bar=false')
  summaries = {}
  for name, extra in (('pretrained', []), ('random', ['--config.random_init=true'])):
    proc = run_cli(*FLAGS, *extra, f'--config.init_checkpoint={workdir}',
                   f'--workdir={tmp_path / name}')
    summaries[name] = json.loads(proc.stdout.strip().splitlines()[-1])
  pretrained, random = summaries['pretrained'], summaries['random']
  assert random['random_init'] and not pretrained['random_init']
  assert pretrained['median_best_accuracy'] > random['median_best_accuracy'], summaries
