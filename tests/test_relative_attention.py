"""config.relative_attention_span: the one architecture option off the paper (issue 19)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import export
from electra_jax import model as model_lib
from electra_jax.errors import UserError
from tests.conftest import tiny_config


def _params(span):
  c = config_lib.resolve(tiny_config(relative_attention_span=span))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  return c, model, model_lib.init_params(model, jax.random.key(0), c.max_seq_length,
                                         c.max_predictions_per_seq)


def _disc_logits(model, params, c):
  ids = jnp.asarray(np.random.default_rng(0).integers(5, c.vocab_size, (2, c.max_seq_length)),
                    jnp.int32)
  mask = jnp.ones_like(ids).at[0, 20:].set(0)
  return model.apply({'params': params}, ids, jnp.zeros_like(ids), mask, True,
                     method=model_lib.Electra.discriminator_logits)


def test_starts_as_a_local_window_and_a_zero_table_is_the_absolute_position_model():
  c0, model0, params0 = _params(0)
  c4, model4, params4 = _params(4)
  is_table = lambda path: 'relative_position_bias' in jax.tree_util.keystr(path)
  tables = [v for p, v in jax.tree_util.tree_leaves_with_path(params4) if is_table(p)]
  # One (2 * span + 1, heads) table per attention layer, generator's and discriminator's.
  assert len(tables) == 2 * c4.num_layers
  disc = params4['discriminator']['encoder']['layer_0']['attention']['relative_position_bias']
  np.testing.assert_array_equal(disc[:, 0], [-4, -3, -2, -1, 0, -1, -2, -3, -4])
  np.testing.assert_array_equal(disc[:, 1], disc[:, 0] / 2)
  assert not np.allclose(_disc_logits(model4, params4, c4), _disc_logits(model0, params0, c0))
  # Every other parameter matches the model without the option, drawn from the same key.
  zeroed = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.zeros_like(x) if is_table(p) else x, params4)
  np.testing.assert_array_equal(_disc_logits(model0, params0, c0),
                                _disc_logits(model4, zeroed, c4))


@pytest.mark.parametrize('attention_dropout_rate', [0.0, 1e-4])  # fused and explicit paths
def test_bias_makes_a_head_read_the_token_at_its_offset(attention_dropout_rate):
  span, seq, width = 3, 10, 8
  attn = model_lib.SelfAttention(width, 2, 0.0, attention_dropout_rate, jnp.float32,
                                 relative_span=span)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(1, seq, width)), jnp.float32)
  mask = jnp.ones((1, seq), bool)
  variables = attn.init({'params': jax.random.key(0), 'dropout': jax.random.key(1)}, x, mask,
                        False)
  p = jax.tree.map(lambda v: v, variables['params'])
  for name in ('query', 'key'):  # content scores all zero: only the position bias decides
    p[name]['kernel'] = jnp.zeros_like(p[name]['kernel'])
  p['output']['kernel'] = jnp.eye(width)
  # Head 0 reads the left neighbour (key offset -1), head 1 the token two to the right.
  table = jnp.zeros((2 * span + 1, 2)).at[span - 1, 0].set(40.0).at[span + 2, 1].set(40.0)
  p['relative_position_bias'] = table
  out = attn.apply({'params': p}, x, mask, False, rngs={'dropout': jax.random.key(2)})
  v = x @ p['value']['kernel'] + p['value']['bias']
  np.testing.assert_allclose(out[0, 1:, :4], v[0, :-1, :4], rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(out[0, :-2, 4:], v[0, 2:, 4:], rtol=1e-3, atol=1e-5)


def test_offsets_beyond_the_span_share_the_edge_entry():
  bias = model_lib.relative_position_bias(jnp.arange(5.0)[:, None], 6)
  assert bias.shape == (1, 1, 6, 6)
  # Query 0: keys 0, 1, 2, 3+ are offsets 0, +1, +2, clipped +2.
  np.testing.assert_array_equal(bias[0, 0, 0], [2, 3, 4, 4, 4, 4])
  np.testing.assert_array_equal(bias[0, 0, 5], [0, 0, 0, 0, 1, 2])


def test_export_refuses_it_with_one_line_and_validation_rejects_negative_spans():
  with pytest.raises(UserError) as e:
    export.check_exportable(config_lib.resolve(tiny_config(relative_attention_span=8)),
                            {'discriminator': ''})
  assert 'relative_attention_span=8' in str(e.value) and '\n' not in str(e.value)
  with pytest.raises(UserError, match='relative_attention_span=-1'):
    config_lib.resolve(tiny_config(relative_attention_span=-1))
