"""Electric (the official release's electric_objective with its two-tower cloze generator),
against the official run_pretraining.py formulas written out."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax import config as config_lib
from electra_jax import export
from electra_jax import flops
from electra_jax import masking
from electra_jax.errors import UserError
from electra_jax.objectives import sampling
from tests.conftest import tiny_config
from tests.test_model_objective import toy_batch
from tests.test_official_options import build

SPECIAL, MASK = (0, 2, 3, 4), 4


def test_the_cloze_model_never_sees_the_token_it_predicts():
  c, model, params, _ = build(objective='electric')
  assert set(params['generator']) == {'ltr', 'rtl', 'head', 'output_bias'}
  batch = toy_batch(c)
  cloze = jax.jit(lambda ids: model.apply({'params': params}, ids, batch['segment_ids'],
                                          batch['input_mask'], method='cloze_logits'))
  before = np.asarray(cloze(batch['input_ids']))
  assert before.shape == batch['input_ids'].shape + (c.vocab_size,)
  i = 7
  after = np.asarray(cloze(batch['input_ids'].at[:, i].set(9)))
  np.testing.assert_array_equal(after[:, i], before[:, i])  # position i: unchanged
  assert not np.allclose(after[:, i - 1], before[:, i - 1])  # its neighbours see it
  assert not np.allclose(after[:, i + 1], before[:, i + 1])


def test_electric_loss_is_the_official_formula():
  c, model, params, obj = build(objective='electric')
  batch, rng = toy_batch(c), jax.random.key(3)
  got, sums = obj(params, batch, rng, deterministic=True)
  # run_pretraining.py: cloze softmax over the candidates of the unmasked input; fake data
  # from the cloze logits at the masked positions; D's logit + stop_gradient(log q(x̃)) +
  # log(p / (1 - p)); labels = the masked positions.
  ids, seg, mask = batch['input_ids'], batch['segment_ids'], batch['input_mask']
  keys = jax.vmap(lambda k: jax.random.split(k, 4))(masking.example_keys(rng, ids.shape[0]))
  m = masking.mask_batch(keys[:, 0], ids, mask, special_ids=SPECIAL, mask_id=MASK,
                         vocab_size=c.vocab_size, mask_prob=c.mask_prob,
                         max_predictions=c.max_predictions_per_seq)
  run = lambda method, *args: jax.jit(lambda *a: model.apply({'params': params}, *a, True,
                                                             method=method))(*args)
  cloze = run('cloze_logits', ids, seg, mask)
  cand = (mask > 0) & ~np.isin(np.asarray(ids), SPECIAL)
  ce = optax.softmax_cross_entropy_with_integer_labels(cloze, ids)
  cloze_loss = np.sum(ce * cand) / (cand.sum() + 1e-6)
  gen = np.take_along_axis(np.asarray(cloze), np.asarray(m.masked_positions)[..., None], 1)
  sampled = np.asarray(jax.vmap(sampling.gumbel_sample, (0, 0, None))(keys[:, 2], gen, 1.0))
  fake, labels = np.array(ids), np.zeros(ids.shape, np.float32)
  for b in range(ids.shape[0]):
    for p, tok, w in zip(m.masked_positions[b], sampled[b], m.masked_weights[b]):
      if w:
        fake[b, p], labels[b, p] = tok, 1.0
  log_q = np.take_along_axis(np.asarray(jax.nn.log_softmax(cloze)), fake[..., None], -1)[..., 0]
  logits = (np.asarray(run('discriminator_logits', jnp.asarray(fake), seg, mask)) + log_q
            + math.log(c.mask_prob / (1 - c.mask_prob)))
  nce = optax.sigmoid_binary_cross_entropy(logits, labels)
  real = np.asarray(mask, np.float32)
  want = c.gen_weight * cloze_loss + c.disc_weight * np.sum(nce * real) / (real.sum() + 1e-6)
  assert float(got) == pytest.approx(float(want), rel=2e-5)
  assert float(sums['disc_label_positive']) == float(np.sum(m.masked_weights))


def test_electric_trains_counts_two_towers_and_exports_only_its_discriminator():
  c, model, params, obj = build(objective='electric')
  batch = toy_batch(c)
  grads = jax.jit(jax.grad(lambda p: obj(p, batch, jax.random.key(1))[0]))(params)
  for tower in ('ltr', 'rtl'):
    assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(grads['generator'][tower]))
  electric = flops.forward_flops(tiny_config(objective='electric'))
  electra = flops.forward_flops(tiny_config())
  assert electric['generator_encoder'] == 2 * electra['generator_encoder']
  assert electric['discriminator_encoder'] == electra['discriminator_encoder']
  with pytest.raises(UserError, match='two-tower'):
    export.check_exportable(c, {'discriminator': '', 'generator': 'generator'})
  export.check_exportable(c, {'discriminator': ''})
  with pytest.raises(UserError, match='electric'):
    config_lib.resolve(tiny_config(objective='electric', tie='none'))
  # NCE adds log q of the noise: another noise distribution would make the logit wrong.
  for other in (dict(temperature=0.5), dict(disallow_correct=True)):
    with pytest.raises(UserError, match="'electric' samples its noise from the cloze model q"):
      config_lib.resolve(tiny_config(objective='electric', **other))
  del model
