"""The objective registry: every objective's loss equals its formula written out from the
model's methods (the numbers before the registry), and a new objective is one class plus one
registry entry."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax import config as config_lib
from electra_jax import experiment
from electra_jax import flops
from electra_jax import masking
from electra_jax import model as model_lib
from electra_jax import objectives
from electra_jax import parallel
from electra_jax.objectives import base
from electra_jax.objectives import metrics as objective_metrics
from electra_jax.objectives import sampling
from tests.conftest import tiny_config, tiny_trainer
from tests.test_model_objective import toy_batch

SPECIAL, MASK = (0, 2, 3, 4), 4
TWO_STAGE = dict(objective='two_stage', tie='none', generator_hidden_size=1.0,
                 two_stage_generator_steps=3, num_warmup_steps=1)


def masked_by_hand(c, batch, rng):
  """(each row's 4 keys [B, 4]: mask, generator, samples, full-size network; the masked batch)."""
  ids = batch['input_ids']
  keys = jax.vmap(lambda k: jax.random.split(k, 4))(masking.example_keys(rng, ids.shape[0]))
  return keys, masking.mask_batch(keys[:, 0], ids, batch['input_mask'], special_ids=SPECIAL,
                                  mask_id=MASK, vocab_size=c.vocab_size, mask_prob=c.mask_prob,
                                  max_predictions=c.max_predictions_per_seq)


def reference_loss(name, c, model, params, batch, rng, step=None):
  """The objective's loss by hand: mask, generator, Gumbel sample, the full-size network."""
  ids, seg, mask = batch['input_ids'], batch['segment_ids'], batch['input_mask']
  keys, m = masked_by_hand(c, batch, rng)
  run = lambda method, *args: model.apply({'params': params}, *args, True, method=method)
  real, w = mask.astype(jnp.float32), m.masked_weights
  mean = lambda x, weights: jnp.sum(x * weights) / (jnp.sum(weights) + 1e-6)
  ce = optax.softmax_cross_entropy_with_integer_labels
  if name == 'mlm':
    logits = run('discriminator_outputs', m.masked_ids, seg, mask, m.masked_positions)['mlm']
    return mean(ce(logits, m.masked_lm_ids), w)
  gen_logits = run('generator_logits', m.masked_ids, seg, mask, m.masked_positions)
  mlm = c.gen_weight * mean(ce(gen_logits, m.masked_lm_ids), w)
  sampled = jax.vmap(sampling.gumbel_sample, (0, 0, None))(keys[:, 2], gen_logits,
                                                            c.temperature)
  # The samples at the masked positions; every other token as it was.
  at = jax.nn.one_hot(m.masked_positions, ids.shape[1]) * w[..., None]  # [B, P, S]
  hit = at.sum(1)
  corrupted = jnp.where(hit > 0, jnp.einsum('bps,bp->bs', at, sampled).astype(jnp.int32), ids)
  labels = (corrupted != ids) * real
  if name in ('electra', 'electra_15', 'two_stage'):
    rtd = optax.sigmoid_binary_cross_entropy(
        run('discriminator_logits', corrupted, seg, mask), labels)
    disc = c.disc_weight * mean(rtd, hit if name == 'electra_15' else real)
    if name == 'two_stage' and step is not None:
      return mlm if step < c.two_stage_generator_steps else disc
    return mlm + disc
  if name == 'replace_mlm':
    logits = run('discriminator_outputs', corrupted, seg, mask, m.masked_positions)['mlm']
    return mlm + mean(ce(logits, m.masked_lm_ids), w)
  assert name == 'all_tokens_mlm'
  every = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  out = run('discriminator_outputs', corrupted, seg, mask, every)
  copy = jax.nn.sigmoid(-out['rtd'])
  p_mlm = jnp.take_along_axis(jax.nn.softmax(out['mlm']), ids[..., None], -1)[..., 0]
  p = copy * (corrupted == ids) + (1 - copy) * p_mlm
  return mlm + mean(-jnp.log(p), real)


CASES = [dict(objective=name) for name in ('electra', 'electra_15', 'mlm', 'replace_mlm',
                                           'all_tokens_mlm')] + [
    dict(objective='electra', tie='none'),
    dict(objective='electra', tie='all', generator_hidden_size=1.0), TWO_STAGE]


@pytest.mark.parametrize('overrides', CASES, ids=lambda o: '-'.join(map(str, o.values()))[:40])
def test_each_objective_is_its_formula_written_out(overrides):
  c = config_lib.resolve(tiny_config(**dict(dict(num_layers=1, vocab_size=32), **overrides)))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  params = model_lib.init_params(model, jax.random.key(0), c.max_seq_length,
                                 c.max_predictions_per_seq)
  obj = objectives.build(model, c, SPECIAL, MASK)
  assert isinstance(obj, objectives.get(c.objective))
  batch, rng = toy_batch(c), jax.random.key(3)
  steps = [None] + ([2, 3] if c.objective == 'two_stage' else [])
  for step in steps:
    objective = obj if step is None else obj.at_step(step)
    got, _ = objective(params, batch, rng, deterministic=True)
    want = reference_loss(c.objective, c, model, params, batch, rng, step)
    np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=str(step))


def test_replaced_fraction_is_of_the_real_tokens_also_where_the_discriminator_sees_the_masked():
  """electra_15's discriminator loss covers only the masked positions; the share of tokens
  replaced is still over every real token: the same as electra's on the same batch."""
  got = {}
  for name in ('electra', 'electra_15'):
    c = config_lib.resolve(tiny_config(objective=name, num_layers=1, vocab_size=32))
    model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
    params = model_lib.init_params(model, jax.random.key(0), c.max_seq_length,
                                   c.max_predictions_per_seq)
    batch, rng = toy_batch(c), jax.random.key(3)
    _, sums = objectives.build(model, c, SPECIAL, MASK)(params, batch, rng, deterministic=True)
    got[name] = objective_metrics.summarize(jax.device_get(sums), c.gen_weight, c.disc_weight)
    _, m = masked_by_hand(c, batch, rng)
    real = float(np.sum(batch['input_mask']))
    assert 0 < got[name]['replaced_fraction'] <= float(np.sum(m.masked_weights)) / real
  assert got['electra_15']['replaced_fraction'] == got['electra']['replaced_fraction']


class GeneratorOnly(base.Objective):
  """A toy objective: the generator's MLM alone (the discriminator's head unused)."""
  name = 'generator_only'
  layout = base.Layout(generator=True, rtd_head=True, mlm_head=False)

  def loss(self, s):
    g = s.corrupt()
    return self.gen_weight * g.mlm_loss, dict(g.gen_sums, token_count=jnp.sum(s.real))


def test_a_new_objective_is_one_class_and_one_registry_entry(monkeypatch):
  monkeypatch.setitem(objectives.OBJECTIVES, 'generator_only', GeneratorOnly)
  c, objective, state, step, mesh = tiny_trainer(objective='generator_only', num_layers=1,
                                                 vocab_size=32, learning_rate=1e-2,
                                                 num_warmup_steps=0)
  assert isinstance(objective, GeneratorOnly) and flops.model_flops_per_step(c) > 0
  before = jax.device_get(state.params)
  batch = toy_batch(c)
  grads = jax.grad(lambda p: objective(p, batch, jax.random.key(1))[0])(before)
  nonzero = lambda tree: any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(tree))
  assert nonzero(grads['generator']) and not nonzero(grads['discriminator'])
  state, sums = step(state, parallel.global_batch(jax.device_get(batch), mesh), jax.random.key(1))
  assert 'mlm_loss_sum' in sums and 'disc_loss_sum' not in sums
  assert not np.array_equal(jax.device_get(state.params)['generator']['output_bias'],
                            before['generator']['output_bias'])


def test_keys_an_objective_never_reads_do_not_stop_reusing_its_run():
  """MLM has no generator: its weights after training steps are the same whatever the
  generator's learning rate, so compare's --pretrained check skips that key for an 'mlm' run
  (not for 'electra', and never a key MLM reads such as learning_rate)."""
  params = {}
  for multiplier in (1.0, 0.25):
    c, _, state, step, mesh = tiny_trainer(objective='mlm', num_layers=1, vocab_size=32,
                                           generator_lr_multiplier=multiplier)
    for i in range(2):
      state, _ = step(state, parallel.global_batch(toy_batch(c, seed=i), mesh),
                      jax.random.key(i))
    params[multiplier] = jax.device_get(state.params)
  assert jax.tree.all(jax.tree.map(np.array_equal, params[1.0], params[0.25]))

  def differences(objective, **run):
    saved = config_lib.resolve(tiny_config(objective=objective, **run)).to_dict()
    return experiment.weight_changing_differences(
        saved, config_lib.resolve(tiny_config(objective=objective, generator_lr_multiplier=0.25)))

  assert differences('mlm', generator_lr_multiplier=1.0, generator_hidden_size=1.0) == []
  assert differences('mlm', learning_rate=3e-3) == ['learning_rate']
  assert differences('electra', generator_lr_multiplier=1.0) == ['generator_lr_multiplier']
  assert differences('electra', generator_lr_multiplier=0.25, log_every_steps=7) == []
  # A run started from other weights is no run from scratch (resuming ignores init_from).
  assert differences('electra', generator_lr_multiplier=0.25, init_from='/a/run') == ['init_from']
