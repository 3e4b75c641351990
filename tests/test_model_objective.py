import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import base, large, small
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import objectives
from electra_jax import optim
from electra_jax.objectives import metrics as objective_metrics
from electra_jax.objectives import sampling
from tests.conftest import tiny_config

SPECIAL, MASK = (0, 2, 3, 4), 4


def build(**overrides):
  c = config_lib.resolve(tiny_config(**overrides))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  params = model_lib.init_params(model, jax.random.key(0), c.max_seq_length,
                                 c.max_predictions_per_seq)
  obj = objectives.build(model, c, SPECIAL, MASK)
  return c, model, params, obj


def toy_batch(c, seed=0, token_range=(5, None)):
  rng = np.random.default_rng(seed)
  hi = token_range[1] or c.vocab_size
  ids = rng.integers(token_range[0], hi, (c.train_batch_size, c.max_seq_length)).astype(np.int32)
  mask = np.ones_like(ids)
  ids[:, 0] = 2
  ids[:, -1] = 3
  ids[: c.train_batch_size // 2, 20:] = 0  # padded rows
  ids[: c.train_batch_size // 2, 19] = 3
  mask[ids == 0] = 0
  return dict(input_ids=jnp.asarray(ids), input_mask=jnp.asarray(mask),
              segment_ids=jnp.zeros_like(ids))


def assert_micro_batches_sum_to_the_whole(obj, params, batch, rng):
  """Two micro-batches (rows 0, 2, ... and 1, 3, ...), each with its rows' global ids and the
  whole batch's loss_denominators, have gradients summing to the whole batch's: what
  train_state's grad_accum_steps relies on."""
  whole = jax.grad(lambda p: obj(p, batch, rng, deterministic=True)[0])(params)
  denominators = obj.loss_denominators(batch, rng)
  summed = None
  for first in (0, 1):
    rows = jnp.arange(first, batch['input_ids'].shape[0], 2)
    micro = {k: v[rows] for k, v in batch.items()}
    grads = jax.grad(lambda p, m=micro, r=rows: obj(
        p, m, rng, deterministic=True, example_ids=r, denominators=denominators)[0])(params)
    summed = grads if summed is None else jax.tree.map(jnp.add, summed, grads)
  for got, want in zip(jax.tree.leaves(summed), jax.tree.leaves(whole)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def grads_of(objective, params, batch):
  return jax.jit(jax.grad(lambda p: objective(p, batch, jax.random.key(1))[0]))(params)


def leaves_by_path(tree):
  return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize('module,expected_millions', [(small, 14), (base, 110), (large, 335)])
def test_discriminator_parameter_counts_match_paper(module, expected_millions):
  c = module.get_config()
  c.vocab_size = 30522  # the paper's WordPiece vocabulary
  c = config_lib.resolve(c)
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  shapes = jax.eval_shape(lambda r: model_lib.init_params(model, r, 128, 19), jax.random.key(0))
  count = lambda t: sum(x.size for x in jax.tree.leaves(t))
  disc = count(shapes['embeddings']) + count(shapes['discriminator'])
  assert abs(disc / 1e6 - expected_millions) / expected_millions < 0.05, disc


@pytest.fixture(scope='module')
def split_grads():
  """Gradients of the MLM-only and the RTD-only loss (compiled once for the module)."""
  c, _, params, obj = build()
  batch = toy_batch(c)
  only = lambda g, d: obj.__class__(**{**obj.__dict__, 'gen_weight': g, 'disc_weight': d})
  return c, params, grads_of(only(1.0, 0.0), params, batch), grads_of(only(0.0, 1.0), params,
                                                                         batch)


def test_token_embeddings_are_one_array_used_by_both_networks(split_grads):
  c, params, mlm_grads, disc_grads = split_grads
  assert set(params) == {'embeddings', 'generator', 'discriminator'}
  table_shape = (c.vocab_size, c.embedding_size)
  tables = [k for k, v in leaves_by_path(params).items() if v.shape == table_shape]
  assert tables == ["['embeddings']['word_embeddings']"]
  for grads in (mlm_grads, disc_grads):
    assert float(jnp.abs(grads['embeddings']['word_embeddings']).sum()) > 0


def test_discriminator_loss_sends_no_gradient_into_the_generator(split_grads):
  _, _, mlm_grads, disc_grads = split_grads
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(disc_grads['generator']))
  assert float(jnp.abs(disc_grads['discriminator']['head']['dense']['kernel']).max()) > 0
  assert float(jnp.abs(mlm_grads['generator']['output_bias']).max()) > 0
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(mlm_grads['discriminator']))


def test_generator_logits_exist_only_at_masked_positions():
  c, model, params, _ = build()
  batch = toy_batch(c)
  positions = jnp.tile(jnp.arange(c.max_predictions_per_seq)[None], (c.train_batch_size, 1))
  logits = model.apply({'params': params}, batch['input_ids'], batch['segment_ids'],
                       batch['input_mask'], positions, method=model_lib.Electra.generator_logits)
  assert logits.shape == (c.train_batch_size, c.max_predictions_per_seq, c.vocab_size)


def test_sample_equal_to_original_is_labelled_original():
  # A generator whose output bias overwhelms everything always samples token 9.
  c, _, params, obj = build(temperature=0.01)
  params = jax.tree.map(lambda x: x, params)
  params['generator']['output_bias'] = params['generator']['output_bias'].at[9].set(1e4)
  all_nines = toy_batch(c, token_range=(9, 10))
  _, sums = obj(params, all_nines, jax.random.key(0))
  assert float(sums['sampled_correct']) == float(sums['mlm_count']) > 0
  assert float(sums['disc_label_positive']) == 0.0
  no_nines = toy_batch(c, token_range=(10, None))
  _, sums = obj(params, no_nines, jax.random.key(0))
  assert float(sums['sampled_correct']) == 0.0
  assert float(sums['disc_label_positive']) == float(sums['mlm_count'])


def test_padding_never_counts_in_the_discriminator_loss():
  c, _, params, obj = build()
  batch = toy_batch(c)
  _, sums = obj(params, batch, jax.random.key(0))
  assert float(sums['disc_count']) == float(batch['input_mask'].sum())
  # Changing what sits under the padding changes nothing.
  garbage = dict(batch, input_ids=jnp.where(batch['input_mask'] > 0, batch['input_ids'], 17))
  loss_a, _ = obj(params, batch, jax.random.key(0), deterministic=True)
  loss_b, _ = obj(params, garbage, jax.random.key(0), deterministic=True)
  np.testing.assert_allclose(loss_a, loss_b, rtol=1e-5)


def test_gumbel_max_samples_follow_the_softmax():
  logits = jnp.log(jnp.array([0.5, 0.3, 0.15, 0.05]))
  samples = sampling.gumbel_sample(jax.random.key(0), jnp.tile(logits, (20000, 1)), 1.0)
  freq = np.bincount(np.asarray(samples), minlength=4) / 20000
  np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.015)
  cold = sampling.gumbel_sample(jax.random.key(1), jnp.tile(logits, (1000, 1)), 0.01)
  assert np.all(np.asarray(cold) == 0)


@pytest.mark.parametrize('vocab,block', [(11, 4), (12, 4), (11, 11), (300, 128), (5, 128)])
def test_two_level_gumbel_max_samples_every_token_with_its_softmax_mass(vocab, block):
  # Blocks that divide the vocabulary or leave a short last block (read through a window
  # shifted into the previous block), a wholly impossible block, and temperature.
  rng = np.random.default_rng(vocab)
  logits = rng.normal(size=vocab) * 1.5
  logits[1:3] = -np.inf
  if vocab > 8:
    logits[4:8] = -np.inf
  temperature = 0.7
  probs = np.exp(logits / temperature - np.max(logits / temperature))
  probs /= probs.sum()
  n = 40000
  samples = np.asarray(sampling.gumbel_sample(
      jax.random.key(3), jnp.tile(jnp.asarray(logits, jnp.float32), (n, 1)), temperature, block))
  assert samples.min() >= 0 and samples.max() < vocab
  freq = np.bincount(samples, minlength=vocab) / n
  assert np.all(freq[probs == 0] == 0)
  np.testing.assert_allclose(freq, probs, atol=4 * np.sqrt(probs.max() / n) + 1e-3)
  # Batched leading axes keep their shape and rows draw independently.
  batched = sampling.gumbel_sample(
      jax.random.key(4), jnp.tile(jnp.asarray(logits, jnp.float32), (3, 5, 1)), 1.0, block)
  assert batched.shape == (3, 5) and len(np.unique(np.asarray(batched))) > 1


def test_auc_is_exact_mann_whitney_with_ties_and_ignores_padding():
  rng = np.random.default_rng(0)
  labels = (rng.random(3000) < 0.15).astype(np.float32)
  # Tiny score differences and many ties: what an untrained discriminator produces.
  logits = np.round(1e-4 * rng.normal(size=3000) + 3e-5 * labels, 5).astype(np.float32)
  weights = (rng.random(3000) < 0.9).astype(np.float32)
  num, pairs = objective_metrics.auc_pair_counts(jnp.asarray(logits), jnp.asarray(labels),
                                             jnp.asarray(weights))
  keep = weights > 0
  p, n = logits[keep & (labels == 1)], logits[keep & (labels == 0)]
  exact = np.mean(p[:, None] > n[None, :]) + 0.5 * np.mean(p[:, None] == n[None, :])
  assert float(pairs) == len(p) * len(n)
  assert float(num) / float(pairs) == pytest.approx(exact, abs=1e-6)
  assert exact > 0.55  # the tiny signal is visible


def test_auc_tie_bounds_match_searchsorted_without_a_loop():
  rng = np.random.default_rng(1)
  s = np.sort(np.concatenate([np.round(rng.normal(size=500), 1), [-0.0, 0.0, 0.0],
                              [-np.inf, np.inf, np.inf]]).astype(np.float32))
  first, last = objective_metrics.tie_bounds(jnp.asarray(s))
  np.testing.assert_array_equal(first, np.searchsorted(s, s, 'left'))
  np.testing.assert_array_equal(last, np.searchsorted(s, s, 'right'))
  # XLA:GPU runs a while loop's iterations from the host, between two CUDA graphs.
  x = jnp.zeros(4096, jnp.float32)
  assert 'while' not in jax.jit(objective_metrics.auc_pair_counts).lower(x, x, x).as_text()


def test_learning_rate_schedule_warms_up_then_decays_to_zero_like_the_official_code():
  s = optim.learning_rate_schedule(1e-3, 100, 1000)
  assert float(s(0)) == 0.0
  np.testing.assert_allclose(float(s(50)), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(s(100)), 1e-3 * (1 - 100 / 1000), rtol=1e-6)
  np.testing.assert_allclose(float(s(550)), 1e-3 * (1 - 550 / 1000), rtol=1e-5)
  assert float(s(1000)) == pytest.approx(0.0, abs=1e-12)


def test_weight_decay_skips_layer_norm_and_biases_but_not_embeddings():
  _, _, params, _ = build()
  mask = leaves_by_path(optim.weight_decay_mask(params))
  assert mask["['embeddings']['word_embeddings']"]
  assert mask["['embeddings']['position_embeddings']"]
  assert not mask["['embeddings']['LayerNorm']['scale']"]
  assert not mask["['generator']['output_bias']"]
  assert mask["['discriminator']['encoder']['layer_0']['attention']['query']['kernel']"]
  assert not mask["['discriminator']['encoder']['layer_0']['attention']['query']['bias']"]
  # The relative attention table is decayed as the position embeddings are (README: a table by
  # position; the demo's figures were measured so).
  _, _, params, _ = build(relative_attention_span=4)
  mask = leaves_by_path(optim.weight_decay_mask(params))
  relative = [k for k in mask if k.endswith("['relative_position_bias']")]
  assert relative and all(mask[k] for k in relative)


def test_bfloat16_compute_keeps_float32_params_and_close_loss():
  c32, _, params, obj32 = build()
  _, _, _, obj16 = build(dtype='bfloat16')
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  batch = toy_batch(c32)
  l32, _ = obj32(params, batch, jax.random.key(0))
  l16, _ = obj16(params, batch, jax.random.key(0))
  assert abs(float(l32) - float(l16)) / float(l32) < 0.02
  # The per-token logit keeps float32 resolution (AUC ranks tokens by it): not bf16 values,
  # near the prior bias where a young discriminator's logits sit.
  hidden = jax.random.normal(jax.random.key(1), (4, 64, c32.hidden_size), jnp.bfloat16) * 0.01
  head = model_lib.DiscriminatorHead(model_lib.ModelConfig.from_config(config_lib.resolve(
      tiny_config(dtype='bfloat16', disc_output_bias_init=-1.95))))  # The prior at 12.5 %.
  logits = head.apply(head.init(jax.random.key(2), hidden), hidden)
  assert logits.dtype == jnp.float32
  assert len(np.unique(np.asarray(logits))) > 0.9 * logits.size


def test_remat_keeps_parameters_loss_and_gradients_and_recomputes_the_layers():
  # Dropout on: the rematerialised forward must redraw the same masks in the backward pass.
  overrides = dict(num_layers=2, dropout_rate=0.1, attention_dropout_rate=0.1)
  c, _, params, obj = build(**overrides)
  batch = toy_batch(c)

  def run(o):
    """(loss, grads, (matmuls, remat barriers) in the StableHLO handed to XLA): one jitted
    function, traced once for both."""
    step = jax.jit(jax.value_and_grad(lambda p: o(p, batch, jax.random.key(1))[0]))
    text = step.lower(params).as_text()
    counts = text.count('stablehlo.dot_general'), text.count('stablehlo.optimization_barrier')
    return *step(params), counts

  assert c.remat == 'none'  # The default: the reference each policy must reproduce.
  loss, grads, none_counts = run(obj)
  program = {'none': none_counts}
  for remat in ('save_dots', 'full'):
    _, _, r_params, r_obj = build(remat=remat, **overrides)
    assert jax.tree.structure(r_params) == jax.tree.structure(params)
    r_loss, r_grads, program[remat] = run(r_obj)
    np.testing.assert_allclose(r_loss, loss, rtol=1e-6)
    for path, g in leaves_by_path(r_grads).items():
      np.testing.assert_allclose(g, leaves_by_path(grads)[path], rtol=1e-4, atol=1e-6,
                                 err_msg=path)
  # The program handed to XLA recomputes every matmul of the generator's and discriminator's
  # layers under 'full'; under 'save_dots' only the two attention matmuls (batched dots, which
  # that policy does not save). XLA's CPU compiler then merges the recomputation back, so the
  # memory saving shows on GPU/TPU only (benchmarks/gpu_suite.sh).
  (dots, barriers), (dots_saved, _), (dots_full, _) = (program[k] for k in
                                                       ('none', 'save_dots', 'full'))
  assert barriers == 0 and program['save_dots'][1] > 0 and program['full'][1] > 0
  layers = 2 * c.num_layers  # generator + discriminator
  assert dots_saved - dots == layers * 2, program
  assert dots_full - dots == layers * 8, program  # Q, K, V, scores, context, output, FFN x2


def test_remat_must_name_a_policy():
  with pytest.raises(config_lib.UserError, match=r"config.remat='layers'"):
    config_lib.resolve(tiny_config(remat='layers'))
