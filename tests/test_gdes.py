"""tie='gdes', DeBERTa-v3's gradient-disentangled embedding sharing: the discriminator reads
stop_gradient(each of the generator's embedding arrays) + its own zero-initialised delta."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax.errors import UserError
from electra_jax.finetune import pretrained
from electra_jax.hf import files as hf_files
from electra_jax.hf import weights as hf_weights
from tests.conftest import tiny_config
from tests.test_model_objective import toy_batch
from tests.test_official_options import build


def term_grads(obj, params, batch):
  """(gradients of the MLM loss sum, of the RTD loss sum, the loss), in one compile."""
  def terms(p):
    loss, sums = obj(p, batch, jax.random.key(1))
    return jnp.stack([sums['mlm_loss_sum'], sums['disc_loss_sum']]), loss
  jac, loss = jax.jit(jax.jacrev(terms, has_aux=True))(params)
  return jax.tree.map(lambda g: g[0], jac), jax.tree.map(lambda g: g[1], jac), loss


NAMES = ('word_embeddings', 'position_embeddings', 'token_type_embeddings', 'LayerNorm')


def test_rtd_loss_sends_exactly_no_gradient_into_the_generators_embeddings():
  """Not the token table alone: positions, token types and the LayerNorm are shared too, and
  the RTD loss (x50) pulled on them."""
  c, _, params, obj = build(tie='gdes')
  deltas = params['discriminator_embeddings']
  assert jax.tree.structure(deltas) == jax.tree.structure(params['embeddings'])
  assert all(np.all(np.asarray(d) == 0) for d in jax.tree.leaves(deltas))
  batch = toy_batch(c)
  mlm, rtd, loss_gdes = term_grads(obj, params, batch)
  for name in NAMES:
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(rtd['embeddings'][name]))
    assert any(np.any(np.asarray(g) != 0)
               for g in jax.tree.leaves(rtd['discriminator_embeddings'][name])), name
    assert all(np.all(np.asarray(g) == 0)
               for g in jax.tree.leaves(mlm['discriminator_embeddings'][name]))
    assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(mlm['embeddings'][name]))
  # With tie='embeddings' the same RTD loss does reach the shared arrays; and at
  # initialisation (deltas 0) gdes computes the same loss.
  _, _, shared, shared_obj = build()
  _, shared_rtd, loss_shared = term_grads(shared_obj, shared, batch)
  for name in NAMES:
    assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(shared_rtd['embeddings'][name]))
  assert float(loss_gdes) == pytest.approx(float(loss_shared), rel=1e-6)


def test_export_and_finetuning_read_the_merged_embeddings(tmp_path):
  c, model, params, _ = build(tie='gdes')
  keys = iter(jax.random.split(jax.random.key(5), 8))
  deltas = jax.tree.map(lambda d: jax.random.normal(next(keys), d.shape) * 0.1,
                        params['discriminator_embeddings'])
  params = dict(params, discriminator_embeddings=deltas)
  batch = toy_batch(c)
  ours = model.apply({'params': params}, batch['input_ids'], batch['segment_ids'],
                     batch['input_mask'], method=model_lib.Electra.discriminator_logits)
  merged = model_lib.discriminator_view(params)
  table = np.asarray(params['embeddings']['word_embeddings'] + deltas['word_embeddings'])
  np.testing.assert_allclose(merged['embeddings']['word_embeddings'], table)
  np.testing.assert_allclose(merged['embeddings']['LayerNorm']['scale'],
                             params['embeddings']['LayerNorm']['scale']
                             + deltas['LayerNorm']['scale'])
  state = hf_weights.params_to_hf(params, c, 'discriminator')
  np.testing.assert_allclose(state['electra.embeddings.word_embeddings.weight'], table)
  np.testing.assert_allclose(state['electra.embeddings.position_embeddings.weight'],
                             params['embeddings']['position_embeddings']
                             + deltas['position_embeddings'])
  gen_state = hf_weights.params_to_hf(params, c, 'generator')  # G keeps its own table
  np.testing.assert_allclose(gen_state['electra.embeddings.word_embeddings.weight'],
                             params['embeddings']['word_embeddings'])
  # transformers' ElectraForPreTraining with the exported state gives the same logits.
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  hf_files.write_model(params, c, 'discriminator', tmp_path)
  hf = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    theirs = hf(input_ids=torch.from_numpy(np.asarray(batch['input_ids'], np.int64)),
                attention_mask=torch.from_numpy(np.asarray(batch['input_mask'], np.int64)),
                token_type_ids=torch.from_numpy(np.asarray(batch['segment_ids'], np.int64))
                ).logits.numpy()
  real = np.asarray(batch['input_mask']) > 0
  np.testing.assert_allclose(theirs[real], np.asarray(ours)[real], atol=2e-4)
  # Fine-tuning keeps one (merged) set of embeddings and no delta.
  kept = pretrained._keep_discriminator(params)  # pylint: disable=protected-access
  np.testing.assert_allclose(kept['embeddings']['word_embeddings'], table)


def test_gdes_needs_an_rtd_objective_with_a_generator():
  for overrides in (dict(objective='mlm'), dict(objective='replace_mlm'),
                    dict(uniform_generator=True)):
    with pytest.raises(UserError, match='gdes'):
      config_lib.resolve(tiny_config(tie='gdes', **overrides))
  config_lib.resolve(tiny_config(tie='gdes', objective='electra_15'))
