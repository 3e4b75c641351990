"""Adversarial ELECTRA (objective 'adversarial'): the generator learns by REINFORCE from the
discriminator's loss, never by maximum likelihood; the discriminator trains exactly as in
ELECTRA."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax import objectives
from electra_jax import parallel
from electra_jax.errors import UserError
from electra_jax.hf import weights as hf_weights
from electra_jax.objectives import base
from electra_jax.objectives import metrics
from electra_jax.objectives import sampling
from electra_jax import config as config_lib
from tests.conftest import tiny_config, tiny_trainer
from tests.test_model_objective import assert_micro_batches_sum_to_the_whole, toy_batch
from tests.test_objective_registry import MASK, SPECIAL, masked_by_hand
from tests.test_objectives import build


def by_hand(c, model, params, batch, rng):
  """The step's parts written out from the model's methods: masked slots, the generator's
  logits and baseline, its Gumbel samples in the input, the discriminator's losses."""
  ids, seg, mask = batch['input_ids'], batch['segment_ids'], batch['input_mask']
  keys, m = masked_by_hand(c, batch, rng)
  run = lambda method, *args: model.apply({'params': params}, *args, True, method=method)
  gen_logits, baseline_logits = run('generator_outputs', m.masked_ids, seg, mask,
                                    m.masked_positions)
  t, target = c.temperature, jax.nn.one_hot(m.masked_lm_ids, c.vocab_size)
  # The official sampling: logits / T - 1000 * one_hot(target) under disallow_correct.
  disallowed = gen_logits - 1000.0 * t * target * c.disallow_correct
  sampled = jax.vmap(sampling.gumbel_sample, (0, 0, None))(keys[:, 2], disallowed, t)
  at = jax.nn.one_hot(m.masked_positions, ids.shape[1]) * m.masked_weights[..., None]
  corrupted = jnp.where(at.sum(1) > 0, jnp.einsum('bps,bp->bs', at, sampled), ids)
  real = mask.astype(jnp.float32)
  labels = (corrupted != ids) * real
  disc_losses = optax.sigmoid_binary_cross_entropy(
      run('discriminator_logits', corrupted.astype(jnp.int32), seg, mask), labels)
  rewards = jnp.take_along_axis(disc_losses, m.masked_positions, axis=1)
  return dict(w=m.masked_weights, q=jax.nn.softmax(disallowed / t),
              baseline_logits=baseline_logits, sampled=sampled, rewards=rewards,
              disc_loss=jnp.sum(disc_losses * real) / (jnp.sum(real) + 1e-6))


# The paper's sampling, and a temperature with the official disallow_correct: REINFORCE's
# log-probability must be the sampled distribution's, not G's plain softmax.
SAMPLING = [dict(), dict(temperature=2.0, disallow_correct=True)]


@pytest.fixture(scope='module', params=SAMPLING, ids=['softmax', 'T2_disallow_correct'])
def tiny(request):
  c, model, params, obj = build(objective='adversarial', num_layers=1, vocab_size=32,
                                **request.param)
  return c, model, params, obj, toy_batch(c), jax.random.key(3)


def test_loss_is_reinforce_with_a_learned_baseline_plus_rtd(tiny):
  c, model, params, obj, batch, rng = tiny
  assert 'baseline' in params['generator']
  h = by_hand(c, model, params, batch, rng)
  w, n = h['w'], jnp.sum(h['w']) + 1e-6
  log_q = jnp.log(jnp.take_along_axis(h['q'], h['sampled'][..., None], -1)[..., 0])
  baseline = -jax.nn.log_sigmoid(h['baseline_logits'])
  policy = -jnp.sum(w * (h['rewards'] - baseline) * log_q) / n
  fit = jnp.sum(w * optax.sigmoid_binary_cross_entropy(h['baseline_logits'],
                                                       jnp.exp(-h['rewards']))) / n
  want = c.gen_weight * (policy + fit) + c.disc_weight * h['disc_loss']
  got, sums = obj(params, batch, rng, deterministic=True)
  np.testing.assert_allclose(got, want, rtol=2e-5)
  reported = metrics.summarize(jax.device_get(sums), c.gen_weight, c.disc_weight)
  np.testing.assert_allclose(reported['generator_reward'], jnp.sum(w * h['rewards']) / n,
                             rtol=1e-5)
  np.testing.assert_allclose(reported['baseline_loss'], fit, rtol=1e-5)
  assert {'mlm_loss', 'mlm_accuracy', 'sampled_accuracy', 'disc_auc'} <= set(reported)


def test_gradients_reach_each_part_only_through_its_own_loss(tiny):
  c, model, params, obj, batch, rng = tiny
  grads = jax.grad(lambda p: obj(p, batch, rng, deterministic=True)[0])(params)
  h = by_hand(c, model, params, batch, rng)
  w, n = h['w'], jnp.sum(h['w']) + 1e-6
  advantage = h['rewards'] + jax.nn.log_sigmoid(h['baseline_logits'])
  # The generator's output bias: REINFORCE's -(R - b) d log q(sample) = -(R - b)(onehot(sample)
  # - q) / T, q the distribution sampled from; no MLE term.
  score = (jax.nn.one_hot(h['sampled'], c.vocab_size) - h['q']) / c.temperature
  want_bias = -c.gen_weight * jnp.einsum('bp,bpv->v', w * advantage, score) / n
  np.testing.assert_allclose(grads['generator']['output_bias'], want_bias, atol=1e-6,
                             rtol=1e-4)
  # The baseline head: only its cross-entropy against exp(-R).
  want_baseline = c.gen_weight * jnp.sum(
      w * (jax.nn.sigmoid(h['baseline_logits']) - jnp.exp(-h['rewards']))) / n
  np.testing.assert_allclose(grads['generator']['baseline']['bias'][0], want_baseline,
                             rtol=1e-4)
  # The discriminator: exactly ELECTRA's gradient (the rewards carry none back to it).
  electra_c = config_lib.resolve(tiny_config(
      num_layers=1, vocab_size=32, temperature=c.temperature,
      disallow_correct=c.disallow_correct))
  electra_model = type(model)(type(model.cfg).from_config(electra_c))
  electra = objectives.build(electra_model, electra_c, SPECIAL, MASK)
  without = dict(params, generator={k: v for k, v in params['generator'].items()
                                    if k != 'baseline'})
  electra_grads = jax.grad(lambda p: electra(p, batch, rng, deterministic=True)[0])(without)
  for got, want in zip(jax.tree.leaves(grads['discriminator']),
                       jax.tree.leaves(electra_grads['discriminator'])):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-8)
  assert not np.allclose(grads['generator']['output_bias'],
                         electra_grads['generator']['output_bias'])


def test_the_generator_learns_to_fool_a_fixed_discriminator():
  """Ascending the policy gradient raises the discriminator's loss on G's samples: the sign."""
  c, _, params, obj = build(objective='adversarial', num_layers=1, vocab_size=32, tie='none')
  # A discriminator whose verdicts differ from token to token (at init all are near 0.5).
  head = params['discriminator']['head']
  params = dict(params, discriminator=dict(params['discriminator'], head=dict(
      head, dense_prediction=dict(head['dense_prediction'],
                                  kernel=head['dense_prediction']['kernel'] * 300))))
  batch = toy_batch(c)
  eval_rngs = jax.random.split(jax.random.key(7), 8)

  @jax.jit
  def reward(p):
    def one(r):
      _, sums = obj(p, batch, r, deterministic=True)
      return sums['reward_sum'] / sums['mlm_count']
    return jnp.mean(jax.vmap(one)(eval_rngs))

  tx = optax.adam(3e-2)
  own = lambda tree: {k: v for k, v in tree.items() if base.is_generator(k)}

  @jax.jit
  def step(p, opt, r):
    grads = own(jax.grad(lambda q: obj(q, batch, r, deterministic=True)[0])(p))
    updates, opt = tx.update(grads, opt, own(p))
    return dict(p, **optax.apply_updates(own(p), updates)), opt

  before = float(reward(params))
  opt = tx.init(own(params))
  for i in range(40):
    params, opt = step(params, opt, jax.random.key(100 + i))
  after = float(reward(params))
  assert after > before + 0.1, (before, after)


def test_the_train_step_moves_the_baseline_and_reports_the_reward():
  c, _, state, step, mesh = tiny_trainer(objective='adversarial', num_layers=1, vocab_size=32,
                                         learning_rate=1e-2, num_warmup_steps=0)
  before = jax.device_get(state.params)['generator']['baseline']['kernel']
  state, sums = step(state, parallel.global_batch(jax.device_get(toy_batch(c)), mesh),
                     jax.random.key(1))
  reported = metrics.summarize(jax.device_get(sums), c.gen_weight, c.disc_weight)
  assert all(np.isfinite(reported[k]) for k in ('loss', 'generator_reward', 'baseline_loss'))
  assert not np.array_equal(jax.device_get(state.params)['generator']['baseline']['kernel'],
                            before)


def test_micro_batches_sum_to_the_whole_batchs_gradient(tiny):
  """Gradient accumulation: each micro-batch's loss is its share of the whole batch's (the
  policy and baseline terms over the whole batch's masked-slot count)."""
  _, _, params, obj, batch, rng = tiny
  assert_micro_batches_sum_to_the_whole(obj, params, batch, rng)


def test_exports_both_networks_without_the_baseline(tiny):
  c, _, params, _, _, _ = tiny
  state = hf_weights.params_to_hf(params, c, 'generator')
  assert 'generator_lm_head.bias' in state and not any('baseline' in k for k in state)
  back = hf_weights.hf_to_params(state, c, 'generator')
  np.testing.assert_array_equal(back['generator']['output_bias'],
                                params['generator']['output_bias'])


@pytest.mark.parametrize('overrides, message', [
    (dict(uniform_generator=True),
     "uniform_generator=True has no generator for objective 'adversarial'"),
    (dict(tie='all', generator_hidden_size=1.0),
     "config.tie='all' runs the generator on the discriminator's encoder")])
def test_configs_it_cannot_train_are_refused(overrides, message):
  with pytest.raises(UserError, match=message):
    config_lib.resolve(tiny_config(objective='adversarial', **overrides))
