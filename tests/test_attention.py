"""Who computes the model's fused attention call: cuDNN's flash attention where it computes what
XLA's would (config.attention_implementation='auto'), else XLA's; and the gradient of the
path that writes the probabilities (attention dropout), whose backward is written out."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import experiment as experiment_lib
from electra_jax import model as model_lib
from electra_jax.errors import UserError
from tests.conftest import tiny_config

H100 = types.SimpleNamespace(platform='gpu', device_kind='NVIDIA H100 80GB HBM3',
                             compute_capability='9.0')
ON_GPU = jax.default_backend() == 'gpu'


def _choice(requested='auto', dtype=jnp.bfloat16, head_dim=64, mask_ndim=2, has_bias=False,
            device=H100):
  return model_lib.fused_attention_implementation(requested, dtype, head_dim, mask_ndim,
                                                  has_bias, device)


def test_auto_takes_cudnn_only_where_it_computes_what_xla_does():
  assert _choice() == 'cudnn'
  assert _choice(dtype=jnp.float16, head_dim=128) == 'cudnn'
  for capability in ('8.0', '10.3', '12.0'):
    device = types.SimpleNamespace(**{**vars(H100), 'compute_capability': capability})
    assert _choice(device=device, head_dim=8) == 'cudnn', capability
  not_cudnn = {
      'asked for XLA': dict(requested='xla'),
      'float32 (cuDNN flash is bf16/fp16)': dict(dtype=jnp.float32),
      'head dim not a multiple of 8': dict(head_dim=12),
      'head dim over 128': dict(head_dim=256),
      'a query x key mask (the cloze generator)': dict(mask_ndim=3),
      'a score bias (relative_attention_span)': dict(has_bias=True),
      'a V100 (no flash attention before Ampere)': dict(
          device=types.SimpleNamespace(**{**vars(H100), 'compute_capability': '7.0'})),
      'an AMD GPU': dict(device=types.SimpleNamespace(platform='gpu', device_kind='AMD MI300X',
                                                      compute_capability='gfx942')),
      'a GPU that says nothing of its capability': dict(
          device=types.SimpleNamespace(platform='gpu', device_kind='NVIDIA H100')),
      'this machine\'s CPU': dict(device=jax.devices('cpu')[0]),
  }
  for why, kwargs in not_cudnn.items():
    assert _choice(**kwargs) == 'xla', why


def test_config_takes_auto_or_xla_and_a_resume_may_change_it():
  with pytest.raises(UserError, match=r"config.attention_implementation='cudnn' must be one of "
                     r"\('auto', 'xla'\)"):
    config_lib.resolve(tiny_config(attention_implementation='cudnn'))
  saved = config_lib.resolve(tiny_config(attention_implementation='xla')).to_dict()
  assert experiment_lib.weight_changing_differences(
      saved, config_lib.resolve(tiny_config())) == []


def _xla_in_place_of_cudnn(monkeypatch):
  """Runs the cuDNN branch on this backend: the same jax call, implemented by XLA, which reads
  key_value_seq_lengths as cuDNN does."""
  xla = jax.nn.dot_product_attention

  def swapped(*args, implementation=None, **kwargs):
    assert implementation == 'cudnn'
    return xla(*args, implementation='xla', **kwargs)
  monkeypatch.setattr(jax.nn, 'dot_product_attention', swapped)


def _model_and_inputs(**overrides):
  c = config_lib.resolve(tiny_config(**overrides))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  params = model_lib.init_params(model, jax.random.key(0), c.max_seq_length,
                                 c.max_predictions_per_seq)
  ids = jnp.asarray(np.random.default_rng(0).integers(5, c.vocab_size, (3, c.max_seq_length)),
                    jnp.int32)
  # Padding last in each row, as the pipelines write it; the third row is all padding (a
  # padded evaluation batch).
  mask = jnp.ones_like(ids).at[0, 20:].set(0).at[2].set(0)
  return model, params, ids, mask


def _disc_logits(model, params, ids, mask):
  return model.apply({'params': params}, ids, jnp.zeros_like(ids), mask, True,
                     method=model_lib.Electra.discriminator_logits)


def test_the_cudnn_branch_masks_padding_as_xla_does(monkeypatch):
  model, params, ids, mask = _model_and_inputs()
  want = _disc_logits(model, params, ids, mask)
  _xla_in_place_of_cudnn(monkeypatch)
  monkeypatch.setattr(model_lib, 'fused_attention_implementation', lambda *args: 'cudnn')
  got = _disc_logits(model, params, ids, mask)
  real = np.asarray(mask, bool)
  error = np.max(np.abs(np.asarray(got) - np.asarray(want))[real])
  assert np.isfinite(np.asarray(got)).all()  # the all-padding row too
  # Were the mask not passed on, the first row's real tokens would attend to its padding: a
  # change of the (small, initial) logits a thousand times the error above.
  unmasked = _disc_logits(model, params, ids, jnp.ones_like(mask))
  assert np.max(np.abs(np.asarray(unmasked) - np.asarray(want))[0, :20]) > 1e3 * error


@pytest.mark.skipif(not ON_GPU, reason='cuDNN attention needs an NVIDIA GPU '
                    '(benchmarks/gpu_suite.sh tests)')
def test_cudnn_attention_on_a_gpu_matches_xla_in_values_and_gradients():
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v = (jax.random.normal(key, (3, 32, 2, 64), jnp.bfloat16) for key in keys[:3])
  weights = jax.random.normal(keys[3], (2, 32, 2, 64), jnp.float32)
  mask = jnp.ones((3, 32), bool).at[0, 20:].set(False).at[2].set(False)

  def xla(q, k, v, mask):
    return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :],
                                        implementation='xla')
  cudnn = jax.jit(model_lib.cudnn_attention)
  assert 'cudnn' in cudnn.lower(q, k, v, mask).compile().as_text().lower()  # the custom call
  got, want = np.asarray(cudnn(q, k, v, mask), np.float32), np.asarray(xla(q, k, v, mask),
                                                                        np.float32)
  assert np.isfinite(got).all()  # the all-padding row too
  np.testing.assert_allclose(got[:2], want[:2], atol=0.02, rtol=0.02)
  unmasked = np.asarray(xla(q, k, v, jnp.ones_like(mask)), np.float32)
  assert np.max(np.abs(unmasked[0] - want[0])) > 0.1  # padding would move the first row

  def loss(attention, q, k, v):
    return jnp.sum(attention(q, k, v, mask)[:2].astype(jnp.float32) * weights)
  grads = [jax.grad(loss, argnums=(1, 2, 3))(f, q, k, v)
           for f in (model_lib.cudnn_attention, xla)]
  for got, want in zip(grads[0], grads[1]):
    got, want = np.asarray(got, np.float32)[:2], np.asarray(want, np.float32)[:2]
    assert np.max(np.abs(got - want)) <= 0.03 * np.max(np.abs(want))

  # The model takes it in bf16 and computes the same logits as with XLA's attention.
  model, params, ids, mask = _model_and_inputs(dtype='bfloat16')
  xla_model, _, _, _ = _model_and_inputs(dtype='bfloat16', attention_implementation='xla')
  logits = jax.jit(lambda p: _disc_logits(model, p, ids, mask))
  assert 'cudnn' in logits.lower(params).compile().as_text().lower()
  got, want = np.asarray(logits(params)), np.asarray(_disc_logits(xla_model, params, ids, mask))
  real = np.asarray(mask, bool)
  assert np.isfinite(got).all()
  assert np.max(np.abs(got - want)[real]) <= 0.05 * np.max(np.abs(want[real]))


@pytest.mark.parametrize('mask_kind', ['keys', 'query_by_key'])
def test_softmax_dropout_gradient_is_autodiffs(mask_kind):
  """The written-out backward against JAX's autodiff of the same forward: float32 to rounding,
  nothing through masked keys (also in a row whose keys are all padding, where the
  probabilities are uniform, not zero), and in bf16 (probabilities kept in bf16) within the
  error autodiff's own bf16 gradient has. Runs on the GPU too (gpu_suite.sh tests)."""
  batch, heads, seq = 3, 4, 32
  keys = jax.random.split(jax.random.key(0), 3)
  scores = 4 * jax.random.normal(keys[0], (batch, heads, seq, seq))
  lengths = jnp.array([seq, 20, 0])  # Full, padded, padding only.
  mask = (jnp.arange(seq)[None, :] < lengths[:, None])[:, None, None, :]
  if mask_kind == 'query_by_key':  # E.g. causal, as [batch, 1, seq, seq].
    mask = mask & jnp.tril(jnp.ones((seq, seq), bool))[None, None]
  keep_prob = 0.875
  keep = jax.random.bernoulli(keys[1], keep_prob, scores.shape)
  weights = jax.random.normal(keys[2], scores.shape)

  def grad(fn, s, keep=keep):
    loss = lambda s: jnp.sum(fn(s, mask, keep, keep_prob).astype(jnp.float32) * weights)
    return jax.grad(loss)(s)

  for keep_or_none in (keep, None):
    got = grad(model_lib.softmax_dropout, scores, keep_or_none)
    want = grad(model_lib.autodiff_softmax_dropout, scores, keep_or_none)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        model_lib.softmax_dropout(scores, mask, keep_or_none, keep_prob),
        model_lib.autodiff_softmax_dropout(scores, mask, keep_or_none, keep_prob))
  got = grad(model_lib.softmax_dropout, scores)
  assert jnp.all(jnp.where(jnp.broadcast_to(mask, got.shape), 0.0, got) == 0)
  # The padding-only row's probabilities are uniform: only the mask keeps its gradient zero.
  np.testing.assert_allclose(model_lib.softmax_dropout(scores, mask, None, 1.0)[2], 1 / seq)

  # bf16: against the float32 gradient of the same bf16 scores, op by op (no XLA fusion keeping
  # the probabilities in float32 after all).
  bf16 = scores.astype(jnp.bfloat16)
  truth = grad(model_lib.autodiff_softmax_dropout, bf16.astype(jnp.float32))
  error = lambda g: float(jnp.linalg.norm(g.astype(jnp.float32) - truth) / jnp.linalg.norm(truth))
  with jax.disable_jit():
    got = grad(model_lib.softmax_dropout, bf16)
    autodiff = grad(model_lib.autodiff_softmax_dropout, bf16)
  assert got.dtype == jnp.bfloat16
  assert 0 < error(autodiff) < 5e-3  # bf16's own rounding of the gradient
  assert error(got) < 2 * error(autodiff)
