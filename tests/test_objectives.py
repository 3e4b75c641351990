"""The paper's ablation objectives and weight sharing (config.objective, config.tie) through the
real model, objective and train step; FLOPs accounting by hand; fine-tuning their workdirs."""
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from electra_jax import config as config_lib
from electra_jax import flops
from electra_jax import masking
from electra_jax import model as model_lib
from electra_jax import objectives
from electra_jax.objectives import all_tokens_mlm
from electra_jax.objectives import base as objective_base
from electra_jax.objectives import metrics as objective_metrics
from electra_jax import parallel
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, tiny_config, tiny_trainer
from tests.test_model_objective import leaves_by_path, toy_batch

TWO_STAGE = dict(objective='two_stage', tie='none', generator_hidden_size=1.0,
                 two_stage_generator_steps=3, num_warmup_steps=1)


def build(abstract=False, **overrides):
  """(config, model, params, objective) of a tiny model; params initialised under jit, or only
  their shapes (jax.eval_shape: nothing compiled) when `abstract`."""
  c = config_lib.resolve(tiny_config(**overrides))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  init = lambda r: model_lib.init_params(model, r, c.max_seq_length, c.max_predictions_per_seq)
  rng = jax.random.key(0)
  params = jax.eval_shape(init, rng) if abstract else jax.jit(init)(rng)
  return c, model, params, objectives.build(model, c, (0, 2, 3, 4), 4)


def one_token_batch(c, mesh):
  """toy_batch with every text token 7: a language each objective's loss learns in steps."""
  batch = jax.device_get(toy_batch(c))
  batch['input_ids'] = np.where(batch['input_ids'] >= 5, 7, batch['input_ids']).astype(np.int32)
  return parallel.global_batch(batch, mesh)


def run_steps(state, step, batch, num_steps, c):
  losses = []
  for _ in range(num_steps):
    state, sums = step(state, batch, jax.random.key(1))
    metrics = objective_metrics.summarize(jax.device_get(sums), c.gen_weight, c.disc_weight)
    assert np.isfinite(metrics['loss'])
    losses.append(metrics['loss'])
  return state, losses


def flat(tree):
  return {k: np.asarray(v) for k, v in leaves_by_path(jax.device_get(tree)).items()}


@pytest.mark.parametrize('objective', ['mlm', 'electra_15', 'replace_mlm', 'all_tokens_mlm'])
def test_each_objective_fits_one_batch_through_the_train_step(objective):
  # (electra: tests/test_train_step.py; two_stage: its own test below.)
  c, _, state, step, mesh = tiny_trainer(learning_rate=1e-2, num_train_steps=20, num_layers=1,
                                         num_warmup_steps=2, vocab_size=32, objective=objective)
  _, losses = run_steps(state, step, one_token_batch(c, mesh), c.num_train_steps, c)
  first, last = np.mean(losses[:3]), np.mean(losses[-3:])
  assert last < 0.5 * first, (first, last)


def test_mlm_is_one_full_size_masked_lm_without_discriminator_parameters():
  c, _, params, obj = build(abstract=True, objective='mlm')
  assert set(params) == {'embeddings', 'discriminator'}  # no generator
  assert set(params['discriminator']) == {'encoder', 'mlm_head'}  # no RTD head
  assert params['discriminator']['encoder']['layer_0']['attention']['query']['kernel'].shape == (
      c.hidden_size, c.hidden_size)
  _, sums = jax.eval_shape(obj, params, toy_batch(c), jax.random.key(0))
  metrics = objective_metrics.summarize({k: np.ones(()) for k in sums}, 1.0, 50.0)
  assert not [k for k in list(sums) + list(metrics) if k.startswith(('disc_', 'mlm_'))]
  assert {'full_mlm_loss', 'full_mlm_accuracy'} <= set(metrics)


def generator_logit_grads(model, params, c):
  """Gradients of G's summed MLM logits: which parameters the generator's output depends on."""
  batch = toy_batch(c)
  positions = jnp.tile(jnp.arange(c.max_predictions_per_seq)[None], (c.train_batch_size, 1))
  logits = lambda p: model.apply({'params': p}, batch['input_ids'], batch['segment_ids'],
                                 batch['input_mask'], positions,
                                 method=model_lib.Electra.generator_logits).sum()
  return jax.jit(jax.grad(logits))(params)


def test_tie_all_runs_the_generator_on_the_discriminator_encoder():
  c, model, params, _ = build(tie='all', generator_hidden_size=1.0, num_layers=1)
  assert set(params['generator']) == {'head', 'output_bias'}  # one encoder, D's
  # G's output depends on (so its loss trains) that one encoder: D and G always see the same
  # values, before and after any step.
  grads = generator_logit_grads(model, params, c)
  layer = grads['discriminator']['encoder']['layer_0']
  assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(layer))
  # Against tie='embeddings' at the same sizes, exactly one encoder's parameters are gone.
  _, _, untied, _ = build(abstract=True, generator_hidden_size=1.0, num_layers=1)
  count = lambda t: sum(x.size for x in jax.tree.leaves(t))
  assert count(untied) - count(params) == count(untied['generator']['encoder'])


def test_tie_none_gives_each_network_its_own_embedding_table():
  c, model, params, _ = build(tie='none', num_layers=1)
  table = (c.vocab_size, c.embedding_size)
  tables = sorted(k for k, v in leaves_by_path(params).items() if v.shape == table)
  assert tables == ["['embeddings']['word_embeddings']",
                    "['generator_embeddings']['word_embeddings']"]
  grads = generator_logit_grads(model, params, c)
  absmax = lambda t: max(float(jnp.abs(x).max()) for x in jax.tree.leaves(t))
  assert absmax(grads['embeddings']) == 0.0  # G never reads D's table
  assert absmax(grads['generator_embeddings']['word_embeddings']) > 0


def _disc_logit_gradient(objective_name):
  """d loss / d (discriminator logits) [B, S], via an additive perturbation of the RTD head."""
  c, _, params, obj = build(objective=objective_name, gen_weight=0.0, num_layers=1)
  batch, rng = toy_batch(c), jax.random.key(3)

  def loss_with(eps):
    def add_eps(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      is_head = (isinstance(context.module, model_lib.DiscriminatorHead)
                 and context.method_name == '__call__')
      return out + eps if is_head else out
    with nn.intercept_methods(add_eps):
      return obj(params, batch, rng, deterministic=True)[0]

  grad = jax.jit(jax.grad(loss_with))(jnp.zeros(batch['input_ids'].shape))
  keys = masking.example_keys(rng, c.train_batch_size)
  mask_keys = jax.vmap(lambda k: jax.random.split(k, 4))(keys)[:, 0]
  m = masking.mask_batch(mask_keys, batch['input_ids'], batch['input_mask'],
                         special_ids=obj.special_ids, mask_id=obj.mask_id,
                         vocab_size=c.vocab_size, mask_prob=c.mask_prob,
                         max_predictions=c.max_predictions_per_seq)
  return np.asarray(grad), np.asarray(objective_base.masked_position_indicator(
      batch['input_ids'], m)), np.asarray(batch['input_mask'])


def test_electra_15_discriminator_loss_ignores_unmasked_positions():
  grad, masked, real = _disc_logit_gradient('electra_15')
  assert np.all(grad[masked == 0] == 0)
  assert np.all(grad[masked == 1] != 0) and masked.sum() > 0
  assert masked.sum() < 0.5 * real.sum()  # (full ELECTRA's gradient covers every real token)


def test_all_tokens_copy_mechanism_is_a_distribution_that_copies_when_told():
  rng = np.random.default_rng(0)
  mlm_logits = jnp.asarray(rng.normal(size=(4, 6, 11)) * 3, jnp.float32)
  inputs = jnp.asarray(rng.integers(0, 11, (4, 6)), jnp.int32)
  for replaced_logit in (-4.0, 0.0, 3.0):
    log_probs = all_tokens_mlm.copy_log_probs(mlm_logits, jnp.full((4, 6), replaced_logit),
                                             inputs)
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, rtol=1e-5)
    d = 1 / (1 + np.exp(replaced_logit))  # the copy probability
    softmax = np.asarray(jax.nn.softmax(mlm_logits))
    expected = (1 - d) * softmax + d * np.asarray(jax.nn.one_hot(inputs, 11))
    np.testing.assert_allclose(np.exp(log_probs), expected, rtol=1e-4, atol=1e-7)


def test_two_stage_freezes_each_network_outside_its_stage_and_starts_d_from_g():
  c, obj, state, step, mesh = tiny_trainer(learning_rate=1e-2, num_layers=1, **TWO_STAGE)
  n = c.two_stage_generator_steps
  batch = one_token_batch(c, mesh)
  gen_keys = lambda t: {k: v for k, v in t.items() if k.startswith("['generator")}
  disc_keys = lambda t: {k: v for k, v in t.items() if not k.startswith("['generator")}
  start = flat(state.params)
  state, losses = run_steps(state, step, batch, n, c)  # Stage 1: G trains, D does not move.
  stage_1 = flat(state.params)
  assert all(np.array_equal(stage_1[k], v) for k, v in disc_keys(start).items())
  assert not all(np.array_equal(stage_1[k], v) for k, v in gen_keys(start).items())
  copied = flat(obj.prepare_params(state.params, n))  # What step n starts from: D := G.
  for name in ('word_embeddings', 'position_embeddings', "['LayerNorm']['scale']"):
    d = next(v for k, v in copied.items() if k.startswith("['embeddings']") and name in k)
    g = next(v for k, v in copied.items() if k.startswith("['generator_emb") and name in k)
    np.testing.assert_array_equal(d, g)
  for k, v in copied.items():
    if k.startswith("['discriminator']['encoder']"):
      np.testing.assert_array_equal(v, copied[k.replace('discriminator', 'generator', 1)])
  # The switch step copies G into D inside the jitted step; D's own schedule starts at lr 0
  # (warmup), so after it and one more Adam step (|update| <= lr) D is within lr of G.
  state, more = run_steps(state, step, batch, 2, c)
  q = "['encoder']['layer_0']['attention']['query']['kernel']"
  moved = flat(state.params)["['discriminator']" + q] - stage_1["['generator']" + q]
  assert 0 < np.abs(moved).max() < 1.5 * c.learning_rate
  state, rest = run_steps(state, step, batch, 11, c)  # Stage 2: G stays bit-identical.
  stage_2 = flat(state.params)
  assert all(np.array_equal(stage_2[k], v) for k, v in gen_keys(stage_1).items())
  losses += more + rest
  assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses


def test_ablation_config_errors_name_the_key():
  for overrides, key in ((dict(tie='all'), 'config.tie'),
                         (dict(objective='bert'), 'config.objective'),
                         (dict(objective='two_stage', tie='none'), 'generator_hidden_size'),
                         (dict(TWO_STAGE, two_stage_generator_steps=0),
                          'two_stage_generator_steps'),
                         (dict(two_stage_generator_steps=5), 'two_stage_generator_steps')):
    with pytest.raises(UserError, match=key):
      config_lib.resolve(tiny_config(**overrides))
  for fraction in (0.1, 0.3, 0.7, 1 / 3):  # Any generator fraction in (0, 1] resolves.
    sizes = config_lib.generator_sizes(config_lib.resolve(tiny_config(
        hidden_size=256, num_heads=4, intermediate_size=1024, generator_hidden_size=fraction)))
    assert sizes['hidden_size'] % sizes['num_heads'] == 0


def test_every_ablation_config_is_small_with_only_its_ablation_changed():
  import importlib  # pylint: disable=import-outside-toplevel
  from configs import small  # pylint: disable=import-outside-toplevel
  base = small.get_config().to_dict()
  names = sorted(n[:-3] for n in os.listdir(os.path.join(REPO_ROOT, 'configs', 'ablations'))
                 if n.endswith('.py') and n != '__init__.py')
  assert {'electra', 'mlm', 'electra_15', 'replace_mlm', 'all_tokens_mlm', 'two_stage',
          'tie_none', 'tie_all'} <= set(names) and any(n.startswith('gen_size_') for n in names)
  found = set()
  for name in names:
    c = importlib.import_module(f'configs.ablations.{name}').get_config()
    changed = {k for k, v in c.to_dict().items() if base[k] != v}
    assert changed <= {'objective', 'tie', 'generator_hidden_size',
                       'two_stage_generator_steps'}, (name, changed)
    found.add(config_lib.resolve(c).objective)
    assert flops.model_flops_per_step(c) > 0
  assert found == set(objectives.OBJECTIVES)


def test_flops_match_a_hand_count_for_every_objective():
  # tiny: B 8, S 32, P int(0.155 * 32) = 4, E 16, V 64, D: H 32 FFN 64, G: H 16 FFN 32, 2 layers.
  B, S, P, E, V, L = 8, 32, 4, 16, 64, 2
  # An encoder: E->H projection (only when E != H), then per layer QKV + output + FFN, attention.
  enc = lambda h, f: (2 * B * S * (E * h * (h != E) + L * (4 * h * h + 2 * h * f))
                      + 4 * B * S * S * h * L)
  gen = enc(16, 32) + 2 * B * P * (16 * E + E * V)
  disc = enc(32, 64)
  rtd_head = 2 * B * S * (32 * 32 + 32)
  mlm_head = lambda slots: 2 * slots * (32 * E + E * V)
  expected = {
      'electra': 3 * (gen + disc + rtd_head),
      'adversarial': 3 * (gen + 2 * B * P * 16 + disc + rtd_head),  # + the baseline H_G -> 1.
      'electra_15': 3 * (gen + disc + rtd_head),
      'mlm': 3 * (disc + mlm_head(B * P)),
      'replace_mlm': 3 * (gen + disc + mlm_head(B * P)),
      'all_tokens_mlm': 3 * (gen + disc + rtd_head + mlm_head(B * S)),
      # Two towers, and dense(2 H_G -> E) + vocab at every position.
      'electric': 3 * (2 * enc(16, 32) + 2 * B * S * (2 * 16 * E + E * V) + disc + rtd_head),
  }
  for objective, want in expected.items():
    assert flops.model_flops_per_step(tiny_config(objective=objective)) == want, objective
  assert flops.model_flops_per_step(tiny_config(tie='none')) == expected['electra']
  # two_stage (G as wide as D): 30 of 100 steps G alone (fwd + bwd), then G fwd + D fwd + bwd.
  gen_full = enc(32, 64) + 2 * B * P * (32 * E + E * V)
  two = (30 * 3 * gen_full + 70 * (gen_full + 3 * (disc + rtd_head))) / 100
  got = flops.model_flops_per_step(tiny_config(**dict(TWO_STAGE, two_stage_generator_steps=30)))
  assert got == pytest.approx(two, rel=1e-12)


@pytest.mark.parametrize('overrides', [
    dict(objective='mlm'), dict(objective='replace_mlm'), dict(objective='all_tokens_mlm'),
    dict(objective='electra_15'), dict(TWO_STAGE), dict(tie='all', generator_hidden_size=1.0),
    dict(objective='electric'), dict(tie='gdes'), dict(objective='adversarial')])
def test_what_finetuning_keeps_matches_the_finetuning_model_for_every_objective(overrides):
  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import heads, pretrained
  c, _, params, _ = build(abstract=True, **overrides)
  model = heads.FinetuneModel(model_lib.ModelConfig.from_config(c),
                              heads.ClassificationHead(2, 0.0))
  ids = jnp.zeros((1, 16), jnp.int32)
  batch = dict(input_ids=ids, segment_ids=ids, input_mask=ids + 1)
  fresh = jax.eval_shape(lambda r: model.init({'params': r}, batch)['params'],
                         jax.random.key(0))['electra']
  kept = jax.eval_shape(pretrained._keep_discriminator, params)  # pylint: disable=protected-access
  assert jax.tree.map(lambda x: (x.shape, x.dtype), kept) == jax.tree.map(
      lambda x: (x.shape, x.dtype), fresh)


def test_an_mlm_workdir_trains_evaluates_and_fine_tunes(tmp_path):
  """The real train loop (in-process) on 2 steps of objective 'mlm', then fine-tuning's loader."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import train
  from electra_jax.finetune import heads, loop, pretrained
  src = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'train')
  name = sorted(os.listdir(src))[0]
  with open(os.path.join(src, name), encoding='utf-8') as f:
    (tmp_path / name).write_text(f.read(20_000).rsplit('\n', 1)[0] + '\n', encoding='utf-8')
  c = tiny_config(objective='mlm', vocab_size=8000, num_layers=1, num_train_steps=2,
                  num_warmup_steps=1, log_every_steps=1, eval_every_steps=2, num_eval_steps=1,
                  save_checkpoints_steps=2, progress_bar=False,
                  train_files=str(tmp_path / '*.txt'), eval_files=str(tmp_path / '*.txt'))
  workdir = str(tmp_path / 'mlm')
  summary = train.train_and_evaluate(c, workdir)
  assert summary['status'] == 'completed' and np.isfinite(summary['eval_full_mlm_loss'])
  assert 'eval_disc_auc' not in summary and 'mlm_accuracy' not in summary
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    assert all('full_mlm_accuracy' in json.loads(line) for line in f)
  params, model_config = pretrained.load_pretrained(workdir)
  assert model_config.layout == objectives.get('mlm').layout
  model = heads.FinetuneModel(model_config, heads.ClassificationHead(2, 0.0))
  ids = np.full((2, 16), 7, np.int32)
  sample = dict(input_ids=ids, segment_ids=np.zeros_like(ids), input_mask=np.ones_like(ids))
  loaded = loop.init_params(model, sample, jax.random.key(0), params)
  np.testing.assert_array_equal(
      loaded['electra']['discriminator']['encoder']['layer_0']['output']['kernel'],
      params['discriminator']['encoder']['layer_0']['output']['kernel'])


def test_two_stage_rows_count_the_flops_of_their_own_stage(tmp_path):
  """metrics.jsonl's model TFLOP/s (and MFU) of a two_stage run: each row's steps at their
  stage's cost (here the generator-only stage, its 8000-token MLM head trained, costs more),
  not the run's average."""
  # pylint: disable=import-outside-toplevel
  from electra_jax import flops, train
  src = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'train')
  name = sorted(os.listdir(src))[0]
  with open(os.path.join(src, name), encoding='utf-8') as f:
    (tmp_path / name).write_text(f.read(20_000).rsplit('\n', 1)[0] + '\n', encoding='utf-8')
  c = tiny_config(**TWO_STAGE, vocab_size=8000, num_layers=1, num_train_steps=9,
                  log_every_steps=3, eval_every_steps=0, save_checkpoints_steps=9,
                  progress_bar=False, train_files=str(tmp_path / '*.txt'))
  train.train_and_evaluate(c, str(tmp_path / 'run'))
  with open(tmp_path / 'run' / 'metrics.jsonl', encoding='utf-8') as f:
    rows = {row['step']: row for row in map(json.loads, f)}
  (_, generator_stage), (_, both_stage) = flops.model_flops_stages(c)
  assert generator_stage > 1.2 * both_stage
  per_step = lambda row: (row['model_tflops_per_sec_per_device'] * 1e12 * jax.device_count()
                          / row['steps_per_sec'])
  assert per_step(rows[3]) == pytest.approx(generator_stage, rel=1e-9)
  assert per_step(rows[9]) == pytest.approx(both_stage, rel=1e-9)


def test_workdir_written_before_the_ablation_keys_existed_still_matches(tmp_path):
  # pylint: disable=import-outside-toplevel
  from electra_jax import experiment, saved_config
  c = config_lib.resolve(tiny_config())
  saved_config.write(str(tmp_path), c)
  path = saved_config.path(str(tmp_path))
  with open(path, encoding='utf-8') as f:
    old = {k: v for k, v in json.load(f).items()
           if k not in ('objective', 'tie', 'two_stage_generator_steps')}
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(old, f)
  assert experiment.check_saved_config_matches(str(tmp_path), c) == []
  with pytest.raises(UserError, match='objective'):
    experiment.check_saved_config_matches(str(tmp_path),
                                          config_lib.resolve(tiny_config(objective='mlm')))


def test_hf_export_refuses_what_hf_electra_cannot_hold():
  # pylint: disable=import-outside-toplevel,protected-access
  from electra_jax import export
  resolve = lambda **o: config_lib.resolve(tiny_config(**o))
  with pytest.raises(UserError, match="objective 'mlm'"):
    export.check_exportable(resolve(objective='mlm'), {'discriminator': ''})
  with pytest.raises(UserError, match="config.tie='none'"):
    export.check_exportable(resolve(tie='none'), {'generator': ''})
  export.check_exportable(resolve(objective='electra_15'), {'discriminator': ''})


def test_readmes_ablation_table_gives_each_configs_flops():
  """README's "Ablations" table: its TFLOP/step column is flops.model_flops_per_step of the
  config each row names (rows such as gen_size_{1_8,1_4} name one config per value)."""
  import importlib  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel
  with open(os.path.join(REPO_ROOT, 'README.md'), encoding='utf-8') as f:
    rows = [line for line in f if line.startswith('| `configs/ablations/')]
  checked = set()
  for row in rows:
    cells = [cell.strip() for cell in row.strip().strip('|').split('|')]
    path = cells[0].strip('`')
    stem, braces = re.fullmatch(r'configs/ablations/([\w]*)(?:\{([\w,]+)\})?\w*\.py', path).groups()
    names = [stem + part for part in braces.split(',')] if braces else [stem]
    values = [float(v.split()[0]) for v in cells[-1].split('/')]
    assert len(values) == len(names), row
    for name, value in zip(names, values):
      c = importlib.import_module(f'configs.ablations.{name}').get_config()
      assert round(flops.model_flops_per_step(c) / 1e12, 2) == value, (name, value)
      checked.add(name)
  every = {n[:-3] for n in os.listdir(os.path.join(REPO_ROOT, 'configs', 'ablations'))
           if n.endswith('.py') and n != '__init__.py'}
  assert checked == every, every - checked


def test_electra_15_drawn_with_replacement_trains_on_the_mean_over_distinct_positions():
  """D's loss in electra_15 is a mean over the masked positions; drawn with replacement a
  position may fill two prediction slots, so the slot count (the MLM's denominator) would
  shrink the RTD term below the disc_loss reported. The whole batch's count for accumulation
  equals the one a step takes itself."""
  c = config_lib.resolve(tiny_config(objective='electra_15', mask_with_replacement=True,
                                     max_seq_length=128, max_position_embeddings=128,
                                     max_predictions_per_seq=20))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  objective = objectives.build(model, c, (0, 2, 3, 4), 4)
  params = model_lib.init_params(model, jax.random.key(0), c.max_seq_length,
                                 c.max_predictions_per_seq)
  ids = np.random.default_rng(0).integers(5, 64, (8, 128)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  batch = dict(input_ids=jnp.asarray(ids), input_mask=jnp.ones_like(ids),
               segment_ids=jnp.zeros_like(ids))
  step = objective.masked_step(params, batch, jax.random.key(1), True)
  counts = step.denominators
  assert counts['masked_positions'] < counts['mlm_count']  # Some position drawn twice.
  loss, sums = objective.loss(step)
  rtd = (loss - c.gen_weight * step.corrupt().mlm_loss) / c.disc_weight
  np.testing.assert_allclose(rtd, sums['disc_loss_sum'] / sums['disc_count'], rtol=1e-5)
  whole = objective.loss_denominators(batch, jax.random.key(1))
  assert {k: float(v) for k, v in whole.items()} == {k: float(v) for k, v in counts.items()}


def test_evaluation_adds_its_batches_sums_exactly(monkeypatch):
  """Tokens over the whole eval set are counted exactly: 3,000 batches of 16,385 tokens are
  49,155,000, past float32's exact integers (a device-side float32 sum misses some)."""
  from electra_jax import eval_loop  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(eval_loop, 'eval_batches', lambda *args: iter(range(3000)))
  step = jax.jit(lambda params, batch, rng: {'token_count': jnp.float32(16385)})
  metrics = eval_loop.evaluate_params(None, step, tiny_config(), None, None)
  assert (metrics['num_batches'], metrics['num_tokens']) == (3000, 49_155_000)


def test_the_two_stage_config_splits_the_run_it_is_given_and_warms_up_within_a_stage():
  """configs/ablations/two_stage.py: half of whatever num_train_steps the command line sets
  (it froze the file's 500,000, so a 20-step smoke run was refused and a 2M run spent a
  quarter on G); a warmup longer than a stage is shortened to it, with a note."""
  from electra_jax import cli  # pylint: disable=import-outside-toplevel
  for steps in (20, 2_000_000):
    c = cli.load_config('configs/ablations/two_stage.py', [f'num_train_steps={steps}'])
    resolved = config_lib.resolve(c, training=True)
    assert resolved.two_stage_generator_steps == steps // 2
  c = cli.load_config('configs/ablations/two_stage.py', ['num_train_steps=20'])
  assert config_lib.resolve(c).num_warmup_steps == 10
  assert config_lib.warmup_note(c) == (
      'config.num_warmup_steps=10000 exceeds a two_stage stage; warming up over 10 steps '
      'instead (fine for a smoke run; lower the warmup for a real one)')
  assert config_lib.warmup_note(cli.load_config('configs/small.py', ['num_train_steps=20']))
