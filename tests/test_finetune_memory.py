"""Fine-tuning in less memory trains the same model: grad_accum_steps micro-batches (dropout on:
each row drops what it drops in the whole batch) and remat match the plain run."""
import json
import os

import jax
import numpy as np
import pytest

from electra_jax import checkpoint
from electra_jax.errors import UserError
from electra_jax.finetune import loop
from tests.test_finetune_resume import config


def _run(workdir, **overrides):
  summary = loop.finetune(config(num_seeds=1, dropout_rate=0.1, attention_dropout_rate=0.1,
                                 save_checkpoints_steps=0, **overrides), workdir)
  with open(os.path.join(workdir, 'results.json'), encoding='utf-8') as f:
    run = json.load(f)['runs'][0]
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, 'seed_0', 'best'), read_only=True)
  params = jax.tree.map(np.asarray, ckpt.read_state(run['best']['step']))
  ckpt.close()
  return summary, run['history'], params


@pytest.fixture(scope='module')
def plain(tmp_path_factory):
  return _run(str(tmp_path_factory.mktemp('ft') / 'plain'))


@pytest.mark.parametrize('overrides', [dict(grad_accum_steps=4), dict(remat='full')],
                         ids=['grad_accum_steps=4', 'remat=full'])
def test_less_memory_trains_the_same_model(overrides, plain, tmp_path):
  _, history, params = _run(str(tmp_path / 'ft'), **overrides)
  _, expected_history, expected_params = plain
  for row, expected in zip(history, expected_history, strict=True):
    for key, value in expected.items():
      assert row[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
  # Two epochs of Adam from the same start: float32 summation order apart.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=2e-5), params,
               expected_params)


def test_micro_batches_must_split_the_batch_evenly(tmp_path):
  with pytest.raises(UserError, match='grad_accum_steps=3'):
    loop.finetune(config(grad_accum_steps=3), str(tmp_path / 'ft'))
  with pytest.raises(UserError, match="config.remat='some' must be ''"):
    loop.finetune(config(remat='some'), str(tmp_path / 'ft'))
