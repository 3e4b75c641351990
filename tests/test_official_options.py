"""The official release's generator options: disallow_correct, uniform_generator,
generator_layers, each against its formula in google-research/electra's run_pretraining.py."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import flops
from electra_jax.errors import UserError
from electra_jax.hf import configs as hf_configs
from electra_jax.objectives import base
from tests.conftest import tiny_config
from tests.test_model_objective import build as build_tiny
from tests.test_model_objective import toy_batch


def build(**overrides):
  """(config, model, params, objective) of a 1-layer model over 32 tokens."""
  return build_tiny(**dict(dict(num_layers=1, vocab_size=32), **overrides))


def test_disallow_correct_samples_from_the_official_penalised_softmax():
  # sample_from_softmax(logits / T, disallow=one_hot(target)): logits / T - 1000 * one_hot.
  logits = np.log(np.array([0.5, 0.2, 0.2, 0.1]))
  temperature, n = 2.0, 40_000
  keys = jax.random.split(jax.random.key(0), n)
  targets = jnp.zeros((n, 1), jnp.int32)
  tiled = jnp.tile(jnp.asarray(logits, jnp.float32), (n, 1, 1))
  for disallow in (True, False):
    got = np.asarray(base.sample_replacements(keys, tiled, targets, temperature, disallow))
    z = logits / temperature - (1000.0 if disallow else 0.0) * np.eye(4)[0]
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    np.testing.assert_allclose(np.bincount(got.ravel(), minlength=4) / n, want, atol=0.01)
  assert not (np.asarray(base.sample_replacements(keys, tiled, targets, temperature, True)) == 0
              ).any()


def test_disallow_correct_replaces_every_masked_position():
  c, _, params, obj = build(disallow_correct=True)
  _, sums = obj(params, toy_batch(c), jax.random.key(1), deterministic=True)
  assert float(sums['sampled_correct']) == 0
  assert float(sums['disc_label_positive']) == float(sums['mlm_count'])


def test_uniform_generator_has_no_network_a_constant_mlm_loss_and_uniform_samples():
  c, _, params, obj = build(uniform_generator=True)
  assert 'generator' not in params
  batch = toy_batch(c)
  loss, sums = obj(params, batch, jax.random.key(1), deterministic=True)
  mlm = float(sums['mlm_loss_sum'] / sums['mlm_count'])
  assert mlm == pytest.approx(np.log(c.vocab_size), rel=1e-6)  # CE of all-zero logits
  # Samples: uniform over the vocabulary (the official zeros logits), so most are replaced.
  keys = jax.random.split(jax.random.key(2), 20_000)
  samples = base.sample_replacements(keys, jnp.zeros((20_000, 1, 32)),
                                     jnp.zeros((20_000, 1), jnp.int32), 1.0, False)
  np.testing.assert_allclose(np.bincount(np.asarray(samples).ravel(), minlength=32) / 20_000,
                             1 / 32, atol=0.006)
  grads = jax.grad(lambda p: obj(p, batch, jax.random.key(1))[0])(params)
  assert np.isfinite(float(loss)) and any(np.any(np.asarray(g) != 0)
                                          for g in jax.tree.leaves(grads['discriminator']))
  full = flops.forward_flops(tiny_config(num_layers=2, vocab_size=32))
  assert not [k for k in flops.forward_flops(tiny_config(
      num_layers=2, vocab_size=32, uniform_generator=True)) if k.startswith('generator')]
  assert [k for k in full if k.startswith('generator')]


@pytest.mark.parametrize('tie', ['none', 'all'])
def test_a_tie_that_means_nothing_without_a_generator_is_refused(tie):
  """uniform_generator has no generator network to tie: tie='none' or 'all' trained the same
  weights as 'embeddings' without a word (objective 'mlm' refuses them the same way). A run
  that trained so still loads (evaluate, export, fine-tuning: training=False)."""
  sizes = dict(generator_hidden_size=1.0, generator_layers=1.0)  # What tie='all' needs.
  with pytest.raises(UserError, match=re.escape(
      f"config.tie={tie!r} means nothing with config.uniform_generator=True")):
    config_lib.resolve(tiny_config(uniform_generator=True, tie=tie, **sizes), training=True)
  config_lib.resolve(tiny_config(uniform_generator=True, tie=tie, **sizes))
  config_lib.resolve(tiny_config(uniform_generator=False, tie=tie, **sizes), training=True)


def test_generator_layers_is_the_official_fraction_of_the_discriminator_depth():
  c, _, params, _ = build(num_layers=4, generator_layers=0.5)
  gen_layers = [k for k in params['generator']['encoder'] if k.startswith('layer_')]
  disc_layers = [k for k in params['discriminator']['encoder'] if k.startswith('layer_')]
  assert len(disc_layers) == 4 and len(gen_layers) == int(round(4 * 0.5)) == 2
  assert hf_configs.hf_config_dict(c, 'generator')['num_hidden_layers'] == 2
  assert hf_configs.hf_config_dict(c, 'discriminator')['num_hidden_layers'] == 4
  for layers, fraction in ((12, 0.25), (12, 1 / 3), (3, 0.1)):  # round, at least 1
    sizes = config_lib.generator_sizes(config_lib.resolve(tiny_config(
        num_layers=layers, generator_layers=fraction)))
    assert sizes['num_layers'] == max(1, int(round(layers * fraction)))
  half = flops.forward_flops(tiny_config(num_layers=4, generator_layers=0.5))
  whole = flops.forward_flops(tiny_config(num_layers=4))
  assert half['generator_encoder'] * 2 == whole['generator_encoder']
  for overrides in (dict(generator_layers=0.0), dict(tie='all', generator_hidden_size=1.0,
                                                     generator_layers=0.5)):
    with pytest.raises(UserError, match='generator_layers'):
      config_lib.resolve(tiny_config(**overrides))
