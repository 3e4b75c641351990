"""Official-release parity keys, each against a NumPy transcription of the official code
(google-research/electra): model/optimization.py's AdamWeightDecayOptimizer and schedule,
pretrain/pretrain_helpers.py's masking with replacement, modeling's Glorot projections."""
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import masking
from electra_jax import model as model_lib
from electra_jax import optim
from tests.conftest import tiny_config

PAD, CLS, SEP, MASK = 0, 2, 3, 4


def official_lr(t, peak, warmup, total, power):
  """create_optimizer: polynomial_decay(peak, t, total, 0, power) * min(1, t / warmup)."""
  return peak * (1 - min(t, total) / total) ** power * min(1.0, t / warmup)


def official_updates(params, grads_per_step, peak, warmup, total, power, wd, b1=0.9, b2=0.999,
                     eps=1e-6):
  """create_optimizer + AdamWeightDecayOptimizer in NumPy: clip to global norm 1, raw moments
  (no bias correction), decoupled decay except names matching LayerNorm/layer_norm/bias."""
  params = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  for t, grads in enumerate(grads_per_step):
    norm = np.sqrt(sum(np.sum(np.square(g)) for g in grads.values()))
    scale = 1.0 / max(norm, 1.0)
    lr = official_lr(t, peak, warmup, total, power)
    for name in params:
      g = grads[name] * scale
      m[name] = b1 * m[name] + (1 - b1) * g
      v[name] = b2 * v[name] + (1 - b2) * g * g
      update = m[name] / (np.sqrt(v[name]) + eps)
      if not any(re.search(r, name) for r in ('LayerNorm', 'layer_norm', 'bias')):
        update += wd * params[name]
      params[name] = params[name] - lr * update
  return params


def test_official_optimisation_matches_a_numpy_transcription_of_the_official_optimizer():
  c = config_lib.resolve(tiny_config(
      adam_bias_correction=False, warmup_times_decay=True, lr_decay_power=0.5,
      learning_rate=1e-2, num_warmup_steps=4, num_train_steps=12, weight_decay_rate=0.1,
      max_grad_norm=1.0))
  tx, _ = optim.make_optimizer(c)
  rng = np.random.default_rng(0)
  params = {'kernel': rng.normal(size=(3, 4)).astype(np.float32),
            'LayerNorm/scale': np.ones(4, np.float32), 'bias': rng.normal(size=4)
            .astype(np.float32)}
  # A tree with the names our weight-decay mask reads (the last key).
  to_tree = lambda d: {'dense': {'kernel': d['kernel'], 'bias': d['bias']},
                       'LayerNorm': {'scale': d['LayerNorm/scale']}}
  grads = [{k: (rng.normal(size=x.shape) * (0.1 if t % 2 else 3.0)).astype(np.float32)
            for k, x in params.items()} for t in range(c.num_train_steps)]
  state, tree = tx.init(to_tree(params)), jax.tree.map(jnp.asarray, to_tree(params))
  for g in grads:
    updates, state = tx.update(to_tree(g), state, tree)
    tree = jax.tree.map(lambda p, u: p + u, tree, updates)
  want = official_updates(params, grads, c.learning_rate, c.num_warmup_steps, c.num_train_steps,
                          c.lr_decay_power, c.weight_decay_rate)
  for name, got in (('kernel', tree['dense']['kernel']), ('bias', tree['dense']['bias']),
                    ('LayerNorm/scale', tree['LayerNorm']['scale'])):
    np.testing.assert_allclose(got, want[name], rtol=2e-5, atol=1e-6, err_msg=name)
  # Today's default (bias-corrected Adam, warmup then decay) is a different optimisation.
  default_tx, _ = optim.make_optimizer(config_lib.resolve(tiny_config(
      learning_rate=1e-2, num_warmup_steps=4, num_train_steps=12, weight_decay_rate=0.1)))
  state, other = default_tx.init(to_tree(params)), jax.tree.map(jnp.asarray, to_tree(params))
  for g in grads:
    updates, state = default_tx.update(to_tree(g), state, other)
    other = jax.tree.map(lambda p, u: p + u, other, updates)
  assert np.max(np.abs(np.asarray(other['dense']['kernel']) - want['kernel'])) > 1e-3


@pytest.mark.parametrize('power', [1.0, 2.0])
@pytest.mark.parametrize('times_decay', [True, False])
def test_schedule_shapes_match_their_formulas(power, times_decay):
  peak, warmup, total = 1e-3, 100, 1000
  s = optim.learning_rate_schedule(peak, warmup, total, power, times_decay)
  for t in (0, 1, 50, 99, 100, 101, 550, 999, 1000, 1200):
    decay = peak * (1 - min(t, total) / total) ** power
    want = (decay * min(1.0, t / warmup) if times_decay
            else (peak * t / warmup if t < warmup else decay))
    np.testing.assert_allclose(float(s(t)), want, rtol=1e-5, atol=1e-10, err_msg=str(t))
  if times_decay:  # Mid-warmup the official shape is below the plain warmup's.
    assert float(s(50)) < peak * 0.5


def official_scatter_update(sequence, updates, positions):
  """pretrain_helpers.scatter_update for int ids in NumPy: sum the updates per position,
  floor-divide by their count (position 0 ignored)."""
  b, length = sequence.shape
  total = np.zeros((b, length), np.int64)
  count = np.zeros((b, length), np.int64)
  for i in range(b):
    for p, u in zip(positions[i], updates[i]):
      total[i, p] += u
      count[i, p] += 1
  count[:, 0] = 0
  written = count > 0
  return np.where(written, total // np.maximum(count, 1), sequence), written


def batch_of(seq_len=24, rows=256, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, 60, (rows, seq_len)).astype(np.int32)
  ids[:, 0], ids[:, -1] = CLS, SEP
  mask = np.ones_like(ids)
  ids[: rows // 2, 12:] = PAD
  ids[: rows // 2, 11] = SEP
  mask[ids == PAD] = 0
  return ids, mask


def test_masking_with_replacement_is_the_official_draw_without_its_averaging_bug():
  ids, mask = batch_of()
  args = dict(special_ids=(PAD, CLS, SEP, MASK), mask_id=MASK, vocab_size=60, mask_prob=0.3,
              max_predictions=8)
  m = jax.device_get(masking.mask_batch(jax.random.key(0), ids, mask, mask_token_prob=1.0,
                                        with_replacement=True, **args))
  w = m.masked_weights > 0
  # How many: the official max(1, min(N, round(num_tokens * mask_prob))), repeats included.
  np.testing.assert_array_equal(w.sum(1), np.clip(np.round(mask.sum(1) * 0.3), 1, 8))
  positions = np.where(w, m.masked_positions, 0)
  repeated = np.array([len(set(p[k])) < k.sum() for p, k in zip(positions, w)])
  assert repeated.any()  # draws repeat positions, as independent draws do
  # Every slot is a uniform candidate: no special token or padding, all candidates reached.
  chosen = np.take_along_axis(ids, positions, 1)[w]
  assert not np.isin(chosen, (PAD, CLS, SEP, MASK)).any()
  np.testing.assert_array_equal(m.masked_lm_ids[w], chosen)
  # [MASK] everywhere drawn: the official scatter of a constant.
  official_masked, _ = official_scatter_update(ids, np.full(positions.shape, MASK), positions)
  np.testing.assert_array_equal(m.masked_ids, official_masked)
  # Generator samples at repeated positions: the official scatter averages two samples into an
  # unrelated id; ours writes the first slot's sample, elsewhere the official result.
  samples = np.random.default_rng(1).integers(5, 60, positions.shape).astype(np.int32)
  ours = np.asarray(masking.scatter_positions(jnp.asarray(ids), jnp.asarray(positions),
                                              jnp.asarray(samples), m.write_weights))
  averaged, written = official_scatter_update(ids, samples, positions)
  fixed = ids.copy()
  for i in range(ids.shape[0]):
    for p, s in reversed(list(zip(positions[i][w[i]], samples[i][w[i]]))):
      fixed[i, p] = s  # reversed: the first slot's sample is written last, so it stays
  np.testing.assert_array_equal(ours, fixed)
  single = written & (fixed == averaged)
  assert (ours[single] == averaged[single]).all() and (ours != averaged).any()


def test_masking_with_replacement_repeats_positions_at_the_rate_independent_draws_do():
  # 10 candidates, 5 draws: P(all distinct) = 10·9·8·7·6 / 10^5 = 0.3024.
  ids = np.full((4000, 12), 7, np.int32)
  ids[:, 0], ids[:, -1] = CLS, SEP
  m = jax.device_get(masking.mask_batch(
      jax.random.key(3), ids, np.ones_like(ids), special_ids=(PAD, CLS, SEP, MASK),
      mask_id=MASK, vocab_size=60, mask_prob=5 / 12, max_predictions=5, with_replacement=True))
  distinct = np.mean([len(set(p)) == 5 for p in m.masked_positions])
  assert distinct == pytest.approx(0.3024, abs=0.03)
  np.testing.assert_allclose(np.bincount(m.masked_positions.ravel(), minlength=12)[1:11] /
                             m.masked_positions.size, 0.1, atol=0.01)
  # Distinct mode never repeats.
  d = jax.device_get(masking.mask_batch(
      jax.random.key(3), ids, np.ones_like(ids), special_ids=(PAD, CLS, SEP, MASK),
      mask_id=MASK, vocab_size=60, mask_prob=5 / 12, max_predictions=5))
  assert all(len(set(p)) == 5 for p in d.masked_positions)
  np.testing.assert_array_equal(d.write_weights, d.masked_weights)


@pytest.mark.parametrize('glorot', [True, False])
def test_glorot_projections_follow_tf_layers_dense_default(glorot):
  c = config_lib.resolve(tiny_config(embedding_size=64, hidden_size=256, num_heads=4,
                                     intermediate_size=64, num_layers=1,
                                     glorot_projections=glorot))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  params = jax.jit(lambda r: model_lib.init_params(model, r, c.max_seq_length,
                                                   c.max_predictions_per_seq))(jax.random.key(0))
  disc = params['discriminator']
  for kernel in (disc['encoder']['embeddings_project']['kernel'],
                 disc['head']['dense_prediction']['kernel']):
    k = np.asarray(kernel)
    fan_in, fan_out = k.shape
    limit = np.sqrt(6.0 / (fan_in + fan_out))  # glorot_uniform: U(-limit, limit)
    if glorot:
      assert np.abs(k).max() <= limit and np.abs(k).max() > 0.9 * limit
      assert np.std(k) == pytest.approx(limit / np.sqrt(3), rel=0.15)
    else:  # BERT's truncated normal at initializer_range
      assert np.abs(k).max() <= 2 * c.initializer_range
  # The other dense layers keep initializer_range either way.
  q = np.asarray(disc['encoder']['layer_0']['attention']['query']['kernel'])
  assert np.abs(q).max() <= 2 * c.initializer_range


# --- Fine-tuning -------------------------------------------------------------------------------

def official_layer_lr(name, decay, n_layers):
  """optimization._get_layer_lrs: the factor of the first key the variable's name contains."""
  key_to_depths = {'/embeddings/': 0, '/embeddings_project/': 0, 'task_specific/': n_layers + 2}
  for layer in range(n_layers):
    key_to_depths[f'encoder/layer_{layer}/'] = layer + 1
  for key, depth in key_to_depths.items():
    if key in name:
      return decay ** (n_layers + 2 - depth)
  raise ValueError(f'No learning rate specified for variable {name}')


def test_official_layerwise_decay_matches_the_official_get_layer_lrs():
  from electra_jax.finetune import loop, tasks  # pylint: disable=import-outside-toplevel
  c = config_lib.resolve(tiny_config(vocab_size=100, num_layers=3))  # E 16 != H 32
  model = loop.make_model(tasks.TASKS['mrpc'], model_lib.ModelConfig.from_config(c))
  params = jax.eval_shape(lambda: model.init(
      {'params': jax.random.key(0)},
      {k: jnp.zeros((1, 8), jnp.int32) for k in ('input_ids', 'segment_ids', 'input_mask')}
  )['params'])
  got = optim.layerwise_lr_multipliers(params, 0.8, 3, official=True)
  for path, factor in jax.tree_util.tree_leaves_with_path(got):
    keys = [p.key for p in path]
    # The official variable names: electra/embeddings/..., electra/encoder/layer_i/...,
    # electra/embeddings_project/..., task_specific/<task>/...
    name = '/'.join(keys).replace('electra/discriminator/encoder/embeddings_project',
                                  'electra/embeddings_project').replace(
                                      'electra/discriminator/encoder/', 'electra/encoder/')
    if keys[0] == 'head':
      name = 'task_specific/mrpc/' + name
    assert factor == pytest.approx(official_layer_lr(name + '/', 0.8, 3)), name
  enc = got['electra']['discriminator']['encoder']
  assert enc['layer_2']['output']['kernel'] == pytest.approx(0.8 ** 2)  # top layer: decay²
  assert got['electra']['embeddings']['word_embeddings'] == pytest.approx(0.8 ** 5)


def test_loss_reduction_sum_is_the_batch_size_times_the_mean():
  from electra_jax.finetune import steps  # pylint: disable=import-outside-toplevel

  class Task:  # A regression task: per-example loss (output - label)^2.
    kind = 'regression'

  class Model:
    cfg = types.SimpleNamespace(has_dropout=False)

    def apply(self, variables, batch, deterministic, rngs):
      del deterministic, rngs
      return variables['params']['w'] * batch['x'][:, None]

  batch = dict(x=jnp.arange(4.0), label=jnp.ones(4))
  params = {'w': jnp.asarray(2.0)}
  mean, _ = steps.TaskObjective(Model(), Task(), 0.0)(params, batch, None)
  total, _ = steps.TaskObjective(Model(), Task(), 0.0, 'sum')(params, batch, None)
  want = np.sum((2.0 * np.arange(4.0) - 1.0) ** 2)
  assert float(total) == pytest.approx(want) and float(mean) == pytest.approx(want / 4)


def test_double_unordered_adds_each_mrpc_and_stsb_pair_in_the_other_order():
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  from configs.finetune import glue  # pylint: disable=import-outside-toplevel
  from electra_jax.data import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import features, loop, tasks  # pylint: disable=import-outside-toplevel
  from tests.conftest import REPO_ROOT  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  tokenizer = tokenizer_lib.load_tokenizer(os.path.join(REPO_ROOT, 'data', 'demo_spm.model'))
  c = glue.get_config()
  c.update(dict(max_seq_length=64, double_unordered=True))
  with tfds.testing.mock_data(num_examples=5):
    mrpc = loop.load_data(c, tasks.get_task('mrpc'), tokenizer)
    rte = loop.load_data(c, tasks.get_task('rte'), tokenizer)
    raw = tasks.glue_examples(tasks.get_task('mrpc'),
                              tasks.tfds_source('glue/mrpc', 'train', None, False))
  assert len(rte.train['input_ids']) == 5  # order matters for entailment: not doubled
  swapped = [dict(e, text_a=e['text_b'], text_b=e['text_a']) for e in raw]
  want = features.encode_classification(tokenizer, raw + swapped, 64, False)
  for key in ('input_ids', 'segment_ids', 'label'):
    np.testing.assert_array_equal(mrpc.train[key], want[key])
  assert len(mrpc.evals[0].examples) == 5  # evaluation keeps one order
