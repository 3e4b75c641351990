"""detect: the discriminator's p(replaced) of given texts, as written or corrupted as in training."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import detect
from electra_jax import model as model_lib
from electra_jax import objectives
from electra_jax import saved_config
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError
from electra_jax.objectives import base
from electra_jax.objectives import metrics
from tests.conftest import REPO_ROOT, tiny_config
from tests.test_model_objective import toy_batch
from tests.test_train_cli import last_json, run_cli

PERSUASION = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'eval', 'persuasion.txt')
TEXTS = ['Anne Elliot walked to the house with her sister and spoke of Captain Wentworth.',
         'It was a fine morning.']


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  from electra_jax import train  # pylint: disable=import-outside-toplevel
  path = str(tmp_path_factory.mktemp('detect') / 'run')
  c = tiny_config(vocab_size=8000, num_layers=1, train_files=PERSUASION, eval_every_steps=0,
                  num_train_steps=3, save_checkpoints_steps=3, progress_bar=False)
  train.train_and_evaluate(c, path)
  return path


def built(workdir):
  c = config_lib.resolve(saved_config.load(workdir))
  tokenizer = tokenizer_lib.for_config(c)
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  objective = objectives.build(model, c, tokenizer.special_ids, tokenizer.mask_id)
  return c, tokenizer, objective, checkpoint.read_params(workdir)[0]


def test_sampling_corrupts_as_the_training_step_and_discriminates_what_it_made(workdir):
  c, tokenizer, objective, params = built(workdir)
  batch, cut = detect.texts_batch(tokenizer, TEXTS, c.max_seq_length)
  assert cut == [0, 0]
  rng = jax.random.key(7)
  out = jax.device_get(detect.discriminate(objective, params, batch, rng))
  real = batch['input_mask'] == 1
  # Replaced exactly where the input read differs from the text, and only at real tokens.
  np.testing.assert_array_equal(out['replaced'], (out['input'] != batch['input_ids']) & real)
  assert 0 < out['replaced'].sum() <= len(TEXTS) * c.max_predictions_per_seq
  # The training step's own sums over the same batch and key count the same tokens.
  _, sums = objective(params, jax.tree.map(jax.numpy.asarray, batch), rng, deterministic=True)
  flagged = (out['p_replaced'] > 0.5) & real
  assert out['replaced'].sum() == int(sums['disc_label_positive'])
  assert flagged.sum() == int(sums['disc_predicted_positive'])
  assert (flagged & out['replaced']).sum() == int(sums['disc_true_positive'])
  # As written, the corrupted text gets the probabilities the sampled run gave it.
  as_written = detect.discriminate(objective, params, dict(batch, input_ids=out['input']))
  np.testing.assert_allclose(as_written['p_replaced'], out['p_replaced'], atol=1e-6)
  other = jax.device_get(detect.discriminate(objective, params, batch, jax.random.key(8)))
  assert (other['input'] != out['input']).any()


def test_texts_are_cut_to_the_runs_length_and_empty_ones_refused(workdir):
  c, tokenizer, objective, params = built(workdir)
  long_text = ' '.join(['Anne'] * 100)
  batch, cut = detect.texts_batch(tokenizer, [long_text, 'Emma'], c.max_seq_length)
  assert cut[0] == len(tokenizer.encode(long_text)) - (c.max_seq_length - 2) > 0 and cut[1] == 0
  assert batch['input_ids'][0, -1] == tokenizer.sep_id and batch['input_mask'][0].all()
  # The JSON record says so too: its tokens are not the whole text.
  out = jax.device_get(detect.discriminate(objective, params, batch))
  # pylint: disable-next=protected-access
  record = detect._table(tokenizer, long_text, batch, out, 0, False, cut[0])
  assert record['cut_tokens'] == cut[0] and len(record['tokens']) == c.max_seq_length - 2
  with pytest.raises(UserError, match=r"--text='  ' has no tokens"):
    detect.texts_batch(tokenizer, ['  '], c.max_seq_length)


def objective_of(name):
  c = config_lib.resolve(tiny_config(objective=name, vocab_size=8000))
  tokenizer = tokenizer_lib.for_config(c)
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  return objectives.build(model, c, tokenizer.special_ids, tokenizer.mask_id)


def test_objectives_without_a_replaced_token_probability_are_refused():
  for name in ('mlm', 'replace_mlm'):
    with pytest.raises(UserError, match=f"objective '{name}' has no per-token head .* detect "
                       'reads runs of electra, electra_15, all_tokens_mlm, two_stage, '
                       'electric, adversarial$'):
      detect.check_detects(objective_of(name), name)
  for name in ('electra', 'electra_15', 'all_tokens_mlm', 'electric'):
    detect.check_detects(objective_of(name), name)


def random_run(name):
  """(objective, freshly initialised params, a toy batch) of a 1-layer `name` run."""
  c = config_lib.resolve(tiny_config(objective=name, vocab_size=32, num_layers=1))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  params = model_lib.init_params(model, jax.random.key(0), c.max_seq_length,
                                 c.max_predictions_per_seq)
  return objectives.build(model, c, (0, 2, 3, 4), 4), params, toy_batch(c)


def outputs(objective, params, batch, method, *extra):
  """The model's `method` on the batch (no dropout), in float64 numpy."""
  out = objective.model.apply({'params': params}, batch['input_ids'], batch['segment_ids'],
                              batch['input_mask'], *extra, True, method=method)
  return jax.tree.map(lambda x: np.asarray(x, np.float64), out)


def softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_all_tokens_mlm_reads_one_minus_its_probability_of_the_token_it_was_given():
  """Its network predicts each original token with a copy mechanism (paper section 3.2):
  p(v) = D 1[v = input] + (1 - D) softmax(mlm)(v), so p(replaced) = 1 - p(input)."""
  objective, params, batch = random_run('all_tokens_mlm')
  ids = np.asarray(batch['input_ids'])
  every = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
  out = outputs(objective, params, batch, 'discriminator_outputs', every)
  copy = 1 / (1 + np.exp(out['rtd']))  # The head's logit says "replaced": D is its complement.
  p_input = copy + (1 - copy) * np.take_along_axis(softmax(out['mlm']), ids[..., None], -1)[..., 0]
  got = jax.device_get(detect.discriminate(objective, params, batch))['p_replaced']
  np.testing.assert_allclose(got, 1 - p_input, atol=2e-6)
  assert 0.05 < got.mean() < 0.95  # Neither certain: the comparison above means something.
  # --sample reads the corrupted text as the command reads it written out.
  sampled = jax.device_get(detect.discriminate(objective, params, batch, jax.random.key(3)))
  assert sampled['replaced'].any()
  as_written = detect.discriminate(objective, params, dict(batch, input_ids=sampled['input']))
  np.testing.assert_allclose(as_written['p_replaced'], sampled['p_replaced'], atol=1e-6)


@pytest.mark.parametrize('name', ['electra', 'all_tokens_mlm', 'adversarial'])
def test_the_training_metrics_read_the_probability_detect_prints(name):
  """disc_accuracy and disc_auc of a step are those of detect --sample's p(replaced) against
  what the step replaced (all_tokens_mlm: 1 - p(input), not its copy gate alone)."""
  objective, params, batch = random_run(name)
  rng = jax.random.key(5)
  _, sums = objective(params, batch, rng, deterministic=True)
  out = jax.device_get(detect.discriminate(objective, params, batch, rng))
  p, replaced = out['p_replaced'], out['replaced'].astype(np.float32)
  real = np.asarray(batch['input_mask'], np.float32)
  assert 0 < replaced.sum() < real.sum() and np.ptp(p[real > 0]) > 1e-3
  numerator, pairs = metrics.auc_pair_counts(jnp.asarray(p), replaced, real)
  np.testing.assert_allclose(sums['auc_numerator'], numerator, rtol=1e-6)
  np.testing.assert_allclose(sums['auc_pairs'], pairs)
  np.testing.assert_allclose(sums['disc_correct'], np.sum(((p > 0.5) == replaced) * real))
  # all_tokens_mlm trains no classifier.
  assert ('disc_loss_sum' in sums) == (name != 'all_tokens_mlm')


def test_electric_reads_the_nce_logit_its_training_step_computes():
  """Electric's logit is energy + log q(token | context) + log prior odds: on a text as written
  q reads that text; under --sample, q reads the text before its samples went in, as the
  training step's own loss does."""
  objective, params, batch = random_run('electric')
  ids = np.asarray(batch['input_ids'])
  energy = outputs(objective, params, batch, 'discriminator_logits')
  q = np.take_along_axis(softmax(outputs(objective, params, batch, 'cloze_logits')),
                         ids[..., None], -1)[..., 0]
  logits = energy + np.log(q) + np.log(objective.mask_prob / (1 - objective.mask_prob))
  got = jax.device_get(detect.discriminate(objective, params, batch))['p_replaced']
  np.testing.assert_allclose(got, 1 / (1 + np.exp(-logits)), atol=2e-6)
  rng = jax.random.key(3)
  step = objective.masked_step(params, batch, rng, deterministic=True)
  corrupted, sampled_logits = objective.detect_corrupted(step)
  labels = base.masked_position_indicator(batch['input_ids'], step.masked) * step.real
  _, sums = objective(params, batch, rng, deterministic=True)
  np.testing.assert_allclose(
      jnp.sum(optax.sigmoid_binary_cross_entropy(sampled_logits, labels) * step.real),
      sums['disc_loss_sum'], rtol=1e-5)
  out = jax.device_get(detect.discriminate(objective, params, batch, rng))
  np.testing.assert_array_equal(out['input'], corrupted)
  np.testing.assert_allclose(out['p_replaced'], jax.nn.sigmoid(sampled_logits), atol=1e-6)


def test_the_command_prints_a_table_per_text_and_their_tokens_in_json(workdir):
  _, tokenizer, objective, params = built(workdir)
  proc = run_cli('electra_jax.detect', f'--workdir={workdir}/', *[f'--text={t}' for t in TEXTS],
                 '--sample', '--seed=7')
  result = last_json(proc.stdout)
  assert (result['step'], result['sample'], result['seed']) == (3, True, 7)
  assert result['workdir'] == str(workdir)  # As found: no trailing '/'.
  batch, _ = detect.texts_batch(tokenizer, TEXTS, 32)
  out = jax.device_get(detect.discriminate(objective, params, batch, jax.random.key(7)))
  for i, (text, record) in enumerate(zip(TEXTS, result['texts'])):
    ids = tokenizer.encode(text)
    assert record['tokens'] == [tokenizer.id_to_piece(t) for t in ids]
    assert record['cut_tokens'] == 0
    span = slice(1, len(ids) + 1)  # Past [CLS], before [SEP].
    assert record['input'] == [tokenizer.id_to_piece(int(t)) for t in out['input'][i, span]]
    assert record['replaced'] == out['replaced'][i, span].tolist()
    np.testing.assert_allclose(record['p_replaced'], out['p_replaced'][i, span], atol=1e-4)
    assert f'text {i + 1} of 2 (step 3): {sum(record["replaced"])} of {len(ids)} tokens ' \
           'replaced' in proc.stdout
  proc = run_cli('electra_jax.detect', f'--workdir={workdir}', check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      'error: pass --workdir=DIR (a pretraining run) and --text="..." (one or more)']
  for flags, message in [
      (['--sample', '--seed=4294967296'], '--seed=4294967296 must be in [0, 2**32)'),
      (['--seed=3'], "--seed=3 picks --sample's randomness; add --sample, or drop --seed to "
                     'read the text as written')]:
    proc = run_cli('electra_jax.detect', f'--workdir={workdir}', '--text=Emma', *flags,
                   check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [f'error: {message}']
