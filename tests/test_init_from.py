"""Continued pretraining from transformers weights or an earlier run (config.init_from), apart
from resuming: exact weights and logits, training, kill -9 and resume, export, fine-tuning,
vocabulary extension, and the one-line errors. The transformers pair is built in the test
(tests/hf_pair.py): random weights, a WordPiece vocabulary trained on the bundled corpus."""
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

# pylint: disable=wrong-import-position
from configs import demo
from electra_jax import checkpoint
from electra_jax import experiment as experiment_lib
from electra_jax import init_from
from electra_jax import model as model_lib
from electra_jax import saved_config
from electra_jax.data import extend_vocab
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data import wordpiece
from electra_jax.errors import UserError
from electra_jax.finetune import pretrained as finetune_pretrained
from electra_jax.hf import configs as hf_configs
from electra_jax.hf import files as hf_files
from tests import hf_pair
from tests.conftest import REPO_ROOT
from tests.test_resilience import assert_same_metrics, assert_same_state, env_for
# small_corpus is a fixture used here by name.
from tests.test_train_cli import (  # pylint: disable=unused-import
    last_json, read_jsonl, small_corpus)

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

STEPS = 30
# No size keys: they come from the source. Checkpoints and evaluations at 10, 20, 30; a row
# every 5 steps.
RUN_FLAGS = ['--config=configs/demo.py', '--config.max_seq_length=32',
             '--config.train_batch_size=8', '--config.eval_batch_size=8',
             '--config.num_eval_steps=2', '--config.num_warmup_steps=3',
             '--config.learning_rate=2e-3', '--config.log_every_steps=5',
             '--config.eval_every_steps=10', '--config.save_checkpoints_steps=10',
             '--config.keep_checkpoint_max=3', f'--config.num_train_steps={STEPS}',
             '--config.progress_bar=false']
TEXTS = ['Catherine Morland had never been a heroine.', 'Mr. Knightley and Mr. Woodhouse!',
         'Short.']


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('jax_cache'))


@pytest.fixture(scope='module')
def pair(tmp_path_factory):
  root = tmp_path_factory.mktemp('hf')
  vocab = hf_pair.wordpiece_vocab(str(root / 'vocab'))
  disc, gen = hf_pair.save_pair(str(root / 'disc'), str(root / 'gen'), vocab)
  return dict(root=root, disc=str(root / 'disc'), gen=str(root / 'gen'), vocab=vocab,
              models=dict(discriminator=disc, generator=gen))


def command(corpus, pair_, workdir, *extra):
  return [sys.executable, '-m', 'electra_jax.train', *RUN_FLAGS,
          f'--config.train_files={corpus}', f'--config.eval_files={corpus}',
          f'--config.init_from={pair_["disc"]}',
          f'--config.init_generator_from={pair_["gen"]}', f'--workdir={workdir}', *extra]


def run(cache_dir_, args, module='electra_jax.train'):
  if args[:2] == [sys.executable, '-m']:
    args = args[3:]
  proc = subprocess.run([sys.executable, '-m', module, *args], cwd=REPO_ROOT,
                        env=env_for(cache_dir_), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, f'{module} failed:\n{proc.stdout}\n{proc.stderr}'
  return proc


@pytest.fixture(scope='module')
def step0(tmp_path_factory, cache_dir, small_corpus, pair):
  """init_from the pair, stopped at step 0: the starting state saved as checkpoint 0."""
  workdir = str(tmp_path_factory.mktemp('step0') / 'w')
  proc = run(cache_dir, command(small_corpus, pair, workdir, '--stop_after_steps=0'))
  return dict(workdir=workdir, proc=proc)


@pytest.fixture(scope='module')
def trained(tmp_path_factory, cache_dir, small_corpus, pair, step0):
  """The same command re-run on a copy of step0's workdir: resumes at 0, trains to STEPS."""
  workdir = str(tmp_path_factory.mktemp('trained') / 'w')
  shutil.copytree(step0['workdir'], workdir)
  proc = run(cache_dir, command(small_corpus, pair, workdir))
  return dict(workdir=workdir, proc=proc)


@pytest.fixture(scope='module')
def exported(tmp_path_factory, cache_dir, trained):
  output = str(tmp_path_factory.mktemp('export') / 'hf')
  run(cache_dir, [f'--workdir={trained["workdir"]}', f'--output={output}', '--what=both'],
      module='electra_jax.export')
  return output


def hf_logits(directory, kind, batch):
  model_class = (transformers.ElectraForPreTraining if kind == 'discriminator'
                 else transformers.ElectraForMaskedLM)
  model = model_class.from_pretrained(directory).eval()
  with torch.no_grad():
    return model(**{k: torch.tensor(v) for k, v in batch.items()}).logits.numpy()


def our_logits(workdir, batch, step=None):
  """(discriminator logits [B, S], generator logits at every position [B, S, V])."""
  c = saved_config.load(workdir)
  params, _ = checkpoint.read_params(workdir, step)
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  ids, segments, mask = batch['input_ids'], batch['token_type_ids'], batch['attention_mask']
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  gen, disc = jax.jit(lambda p: model.apply({'params': p}, ids, segments, mask, positions))(
      params)
  return np.asarray(disc), np.asarray(gen)


def fixed_batch(tokenizer_dir, texts=TEXTS):
  tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
  return {k: np.asarray(v) for k, v in tokenizer(texts, padding=True).items()}


def assert_logits_match(ours, theirs, mask, tolerance=1e-5, magnitude=1e-2):
  real = mask.astype(bool)
  assert ours.shape == theirs.shape
  assert np.abs(ours - theirs)[real].max() < tolerance
  assert np.abs(theirs[real]).max() > magnitude  # not trivially zero


# --- Exact: the pair's weights, bit for bit, and its logits ---------------------------------

def test_step_0_export_holds_the_transformers_tensors_bit_for_bit(step0, pair, cache_dir,
                                                                   tmp_path):
  notes = step0['proc'].stdout
  assert 'hidden_size 32, num_layers 2' in notes and '80 of 80 parameter arrays' in notes
  c = saved_config.load(step0['workdir'])
  assert (c.vocab_size, c.hidden_size, c.generator_hidden_size, c.max_position_embeddings) == (
      600, 32, 0.5, 64)
  # The vocabulary now lives in the workdir: the run does not depend on the download.
  assert c.vocab_file == os.path.join(step0['workdir'], 'vocab.txt')
  with open(pair['vocab'], encoding='utf-8') as a, open(c.vocab_file, encoding='utf-8') as b:
    assert a.read() == b.read()
  output = str(tmp_path / 'hf')
  run(cache_dir, [f'--workdir={step0["workdir"]}', f'--output={output}', '--what=both'],
      module='electra_jax.export')
  for source, exported in ((pair['disc'], output), (pair['gen'], os.path.join(output,
                                                                             'generator'))):
    _, theirs = hf_files.read_dir(source)
    _, ours = hf_files.read_dir(exported)
    assert set(ours) == set(theirs) - {'generator_lm_head.weight'}
    for key, value in ours.items():
      assert value.dtype == np.float32 and np.array_equal(value, theirs[key]), key


def test_discriminator_and_generator_logits_equal_transformers_to_1e_5(step0, pair):
  batch = fixed_batch(pair['disc'])
  ours = wordpiece.WordPieceTokenizer(pair['vocab'])
  assert [list(row[row != 0]) for row in batch['input_ids']] == [
      [ours.cls_id, *ours.encode(t), ours.sep_id] for t in TEXTS]
  assert (batch['input_ids'] > 4).sum() > 20  # real words, not [UNK]
  disc, gen = our_logits(step0['workdir'], batch)
  assert_logits_match(disc, hf_logits(pair['disc'], 'discriminator', batch),
                      batch['attention_mask'])
  assert_logits_match(gen, hf_logits(pair['gen'], 'generator', batch), batch['attention_mask'])


# --- A run: the loss falls, kill -9 resumes exactly, exports and fine-tunes -----------------

def test_training_from_the_pair_lowers_the_loss_and_a_rerun_resumes_ignoring_init_from(
    trained):
  stdout = trained['proc'].stdout
  assert 'config.init_from is ignored' in stdout and 'Resuming from step 0' in stdout
  assert last_json(stdout)['status'] == 'completed'
  rows = read_jsonl(os.path.join(trained['workdir'], 'metrics.jsonl'))
  assert [r['step'] for r in rows] == list(range(5, STEPS + 1, 5))
  assert rows[-1]['loss'] < 0.8 * rows[0]['loss'], [r['loss'] for r in rows]
  assert rows[-1]['learning_rate'] < rows[1]['learning_rate']  # a fresh schedule, decaying


def test_kill_9_then_resume_equals_the_uninterrupted_run(tmp_path, cache_dir, small_corpus,
                                                         pair, trained):
  """Killed after step 25 (checkpoints 10, 20) and re-run: identical to `trained`, which went
  through the saved step 0 instead, so starting from the source is exact and repeatable."""
  workdir = str(tmp_path / 'w')
  proc = subprocess.Popen(command(small_corpus, pair, workdir), cwd=REPO_ROOT,
                          env=env_for(cache_dir), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
  for line in proc.stdout:
    if line.startswith('train step      25'):
      proc.send_signal(signal.SIGKILL)
      break
  proc.wait(timeout=300)
  assert proc.returncode == -signal.SIGKILL
  assert not os.path.exists(os.path.join(workdir, 'checkpoints', str(STEPS)))
  resumed = run(cache_dir, command(small_corpus, pair, workdir))
  assert 'Resuming from step' in resumed.stdout
  assert_same_state(workdir, trained['workdir'], step=STEPS)
  assert_same_metrics(workdir, trained['workdir'])


def test_export_loads_in_transformers_with_our_logits_and_tokenizer(exported, trained):
  batch = fixed_batch(exported)
  ours = tokenizer_lib.for_config(saved_config.load(trained['workdir']))
  assert [list(row[row != 0]) for row in batch['input_ids']] == [
      [ours.cls_id, *ours.encode(t), ours.sep_id] for t in TEXTS]
  disc, gen = our_logits(trained['workdir'], batch)
  assert_logits_match(disc, hf_logits(exported, 'discriminator', batch),
                      batch['attention_mask'])
  assert_logits_match(gen, hf_logits(os.path.join(exported, 'generator'), 'generator', batch),
                      batch['attention_mask'])


def test_fine_tuning_from_the_run_and_from_its_export_gives_the_same_result(
    tmp_path, cache_dir, trained, exported):
  flags = ['--config=configs/finetune/files.py', '--config.max_seq_length=32',
           '--config.train_batch_size=16', '--config.eval_batch_size=16',
           '--config.num_epochs=1', '--config.max_train_examples=64',
           '--config.max_eval_examples=32', '--config.progress_bar=false']
  results = []
  for name, source in (('workdir', trained['workdir']), ('export', exported)):
    proc = run(cache_dir, [*flags, f'--config.init_checkpoint={source}',
                           f'--workdir={tmp_path / name}'], module='electra_jax.finetune')
    results.append(last_json(proc.stdout))
  assert not results[0]['random_init'] and np.isfinite(results[0]['median_best_accuracy'])
  assert results[0]['median_best_accuracy'] == results[1]['median_best_accuracy']


def test_a_refused_run_writes_no_vocabulary_into_its_workdir(tmp_path, cache_dir, small_corpus,
                                                             pair):
  """A transformers directory passed as --workdir by mistake keeps its own vocab.txt; a new
  workdir refused for a glob that matches nothing is removed (it held only the vocabulary)."""
  theirs = tmp_path / 'their_model'
  shutil.copytree(pair['disc'], theirs)
  (theirs / 'vocab.txt').write_text('[PAD]\ntheir own tokens\n', encoding='utf-8')
  before = {p.name: p.read_bytes() for p in theirs.iterdir()}
  new = tmp_path / 'new' / 'w'
  for workdir, extra, error in (
      (theirs, [], "did not write (a transformers model directory?"),
      (new, [f'--config.train_files={tmp_path}/nothing/*.txt'], 'no files match')):
    proc = subprocess.run(command(small_corpus, pair, workdir, *extra), cwd=REPO_ROOT,
                          env=env_for(cache_dir), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and error in proc.stderr, proc.stderr
  assert {p.name: p.read_bytes() for p in theirs.iterdir()} == before
  assert not (tmp_path / 'new').exists()


# --- Sources and their keys -----------------------------------------------------------------

def prepare(workdir, overridden=(), **keys):
  """init_from.prepare, then the vocabulary written as train writes it after its checks."""
  c = demo.get_config()
  c.update(dict(max_seq_length=32, train_batch_size=8, eval_batch_size=8, num_train_steps=4,
                num_warmup_steps=1, train_files=hf_pair.CORPUS), **keys)
  start = init_from.prepare(c, str(workdir), set(overridden) | set(keys) - {'init_from'})
  init_from.write_vocabulary(start)
  return start


def start_params(workdir, start):
  exp = experiment_lib.Experiment.create(start.config)
  state, notes = init_from.initial_state(exp, start)
  return jax.device_get(state.params), notes


def test_shape_keys_come_from_the_source_and_a_conflicting_override_is_one_line(tmp_path, pair):
  start = prepare(tmp_path / 'a', init_from=pair['disc'], hidden_size=32, vocab_size=600)
  assert (start.config.hidden_size, start.config.num_layers) == (32, 2)  # demo.py had 2 x 128
  assert start.config.relative_attention_span == 0  # transformers' positions are absolute
  for key, value, theirs in (('hidden_size', 64, 32), ('vocab_size', 8000, 600),
                             ('max_position_embeddings', 512, 64),
                             ('relative_attention_span', 8, 0)):
    with pytest.raises(UserError) as e:
      prepare(tmp_path / key, init_from=pair['disc'], **{key: value})
    message = str(e.value)
    assert f'--config.{key}={value}' in message and f'{key}={theirs}' in message
    assert '\n' not in message and not (tmp_path / key).exists()
  with pytest.raises(UserError, match=r"generator_hidden_size=0.25 .* generator_hidden_size=0.5"):
    prepare(tmp_path / 'g', init_from=pair['disc'], init_generator_from=pair['gen'],
            generator_hidden_size=0.25)
  with pytest.raises(UserError, match='max_seq_length=128 exceeds the 64 positions of init_from'):
    prepare(tmp_path / 'long', init_from=pair['disc'], max_seq_length=128)
  with pytest.raises(UserError, match='holds a generator'):
    prepare(tmp_path / 'swapped', init_from=pair['gen'])
  with pytest.raises(UserError, match='neither a transformers ELECTRA directory'):
    prepare(tmp_path / 'nowhere', init_from=str(tmp_path / 'nowhere'))
  with pytest.raises(UserError, match='needs config.init_from'):
    prepare(tmp_path / 'x', init_generator_from=pair['gen'])


def test_electrics_cloze_generator_is_never_started_from_a_masked_lm(tmp_path, pair):
  """objective='electric' from a transformers pair: init_generator_from is refused (one line;
  it was a KeyError), and the discriminator starts alone, the generator from random weights."""
  with pytest.raises(UserError, match=r"objective 'electric'\'s generator is a two-tower cloze "
                                      r'model, .* drop init_generator_from'):
    prepare(tmp_path / 'both', init_from=pair['disc'], init_generator_from=pair['gen'],
            objective='electric')
  assert not (tmp_path / 'both').exists()
  start = prepare(tmp_path / 'disc', init_from=pair['disc'], objective='electric')
  params, notes = start_params(tmp_path / 'disc', start)
  assert 'generator' in params and not any('holds no generator' in n for n in notes), notes
  # An official checkpoint brings its generator along: left out, with a note.
  official = os.path.join(REPO_ROOT, 'tests', 'data', 'official_checkpoint')
  start = prepare(tmp_path / 'official', init_from=official, objective='electric')
  params, notes = start_params(tmp_path / 'official', start)
  assert "the source's generator (a masked LM) cannot start objective 'electric'" in notes[0]
  assert not any('holds no generator' in n for n in notes), notes
  # Adversarial's baseline head no source holds: random, without blaming init_generator_from.
  start = prepare(tmp_path / 'adversarial', init_from=pair['disc'],
                  init_generator_from=pair['gen'], objective='adversarial')
  _, notes = start_params(tmp_path / 'adversarial', start)
  assert notes[-1].endswith('; randomly initialised: generator/baseline'), notes


def test_vocab_file_is_used_when_it_matches_and_refused_when_it_does_not(tmp_path, pair):
  start = prepare(tmp_path / 'same', init_from=pair['disc'], vocab_file=pair['vocab'])
  assert start.config.vocab_file == pair['vocab'] and not (tmp_path / 'same').exists()
  tokens = wordpiece.read_tokens(pair['vocab'])
  other = tmp_path / 'other.txt'
  other.write_text('\n'.join(tokens[:100] + ['zzz'] + tokens[101:]) + '\n', encoding='utf-8')
  with pytest.raises(UserError, match=r"first difference at id 100: 'zzz' vs"):
    prepare(tmp_path / 'other', init_from=pair['disc'], vocab_file=str(other))
  with pytest.raises(UserError, match='do_lower_case=False conflicts'):
    prepare(tmp_path / 'cased', init_from=pair['disc'], do_lower_case=False)
  # A typo, a directory or a file that is no vocabulary: the loader's one line, nothing written.
  for bad, state in ((tmp_path / 'missing.txt', 'not found'), (tmp_path, 'is a directory'),
                     (other.with_suffix('.model'), 'is not a sentencepiece model')):
    if bad.suffix == '.model':
      bad.write_text('not a model', encoding='utf-8')
    with pytest.raises(UserError, match=re.escape(f"vocab_file '{bad}' {state}")):
      prepare(tmp_path / 'typo', init_from=pair['disc'], vocab_file=str(bad))
    assert not (tmp_path / 'typo').exists()


@pytest.mark.parametrize('setting, message', [
    (dict(tokenize_chinese_chars=False), 'sets tokenize_chinese_chars=False; our WordPiece '
     'tokenizer splits off every CJK ideograph'),
    (dict(do_lower_case=True, strip_accents=False), 'sets strip_accents=False with '
     'do_lower_case=True')])
def test_a_tokenizer_setting_ours_cannot_follow_is_refused(tmp_path, pair, setting, message):
  """Its ids would differ from the source's on such text (CJK, accents): one line instead."""
  disc = tmp_path / 'disc'
  shutil.copytree(pair['disc'], disc)
  config_file = disc / 'tokenizer_config.json'
  config_file.write_text(json.dumps(dict(json.loads(config_file.read_text()), **setting)))
  with pytest.raises(UserError, match=re.escape(message)):
    prepare(tmp_path / 'w', init_from=str(disc))


def cased_tokenizer_json_only(tmp_path, pair):
  """A copy of the pair's discriminator as transformers 5 saves it (tokenizer.json, no
  vocab.txt), with a cased tokenizer."""
  disc = tmp_path / 'disc'
  shutil.copytree(pair['disc'], disc)
  os.remove(disc / 'vocab.txt')
  config_file = disc / 'tokenizer_config.json'
  config_file.write_text(json.dumps(dict(json.loads(config_file.read_text()),
                                         do_lower_case=False)))
  return disc


def test_a_transformers_5_directory_without_vocab_txt_and_a_cased_tokenizer(tmp_path, pair):
  """save_pretrained of transformers 5 writes tokenizer.json only; do_lower_case comes from
  tokenizer_config.json."""
  disc = cased_tokenizer_json_only(tmp_path, pair)
  start = prepare(tmp_path / 'w', init_from=str(disc))
  assert start.config.do_lower_case is False
  assert wordpiece.read_tokens(start.config.vocab_file) == wordpiece.read_tokens(pair['vocab'])
  tokenizer = tokenizer_lib.for_config(start.config)
  assert tokenizer.encode('The') != tokenizer.encode('the')  # cased


def test_fine_tuning_reads_the_vocabulary_of_a_directory_with_tokenizer_json_only(tmp_path,
                                                                                 pair):
  """As init_from does: the WordPiece vocabulary inside tokenizer.json, its casing kept."""
  from electra_jax.finetune import pretrained  # pylint: disable=import-outside-toplevel
  disc = cased_tokenizer_json_only(tmp_path, pair)
  c = ml_collections.ConfigDict(dict(init_checkpoint=str(disc), vocab_file='', random_init=False))
  source, tokenizer = pretrained.network_config(c)
  assert source.do_lower_case is False
  assert wordpiece.read_tokens(source.vocab_file) == wordpiece.read_tokens(pair['vocab'])
  assert tokenizer.encode('The') != tokenizer.encode('the')  # cased


def test_generator_embeddings_that_differ_are_noted_or_kept_with_tie_none(tmp_path, pair):
  disc, gen = str(tmp_path / 'disc'), str(tmp_path / 'gen')
  hf_pair.save_pair(disc, gen, pair['vocab'], seed=1, shared_embeddings=False)
  _, disc_state = hf_files.read_dir(disc)
  _, gen_state = hf_files.read_dir(gen)
  word = 'electra.embeddings.word_embeddings.weight'
  for tie in ('embeddings', 'none'):
    start = prepare(tmp_path / tie, init_from=disc, init_generator_from=gen, tie=tie)
    params, notes = start_params(tmp_path / tie, start)
    np.testing.assert_array_equal(params['embeddings']['word_embeddings'], disc_state[word])
    differ = [n for n in notes if 'embedding tables differ' in n]
    if tie == 'embeddings':
      assert len(differ) == 1 and 'took the discriminator' in differ[0]
    else:
      assert not differ
      np.testing.assert_array_equal(params['generator_embeddings']['word_embeddings'],
                                    gen_state[word])


def test_tie_gdes_keeps_both_networks_embeddings_so_its_export_reads_back_whole(tmp_path,
                                                                              pair):
  """An export of a tie='gdes' run holds the generator's tables (the shared ones) and the
  discriminator's (shared + delta): both start the new run (the generator's were dropped, the
  delta zeroed, and the note named tie='embeddings')."""
  from electra_jax.hf import weights as hf_weights  # pylint: disable=import-outside-toplevel
  disc, gen = str(tmp_path / 'disc'), str(tmp_path / 'gen')
  hf_pair.save_pair(disc, gen, pair['vocab'], seed=3, shared_embeddings=False)
  start = prepare(tmp_path / 'w', init_from=disc, init_generator_from=gen, tie='gdes')
  params, notes = start_params(tmp_path / 'w', start)
  assert not [n for n in notes if 'differ' in n], notes
  for network, directory in (('discriminator', disc), ('generator', gen)):
    _, want = hf_files.read_dir(directory)
    got = hf_weights.params_to_hf(params, start.config, network)
    assert got.keys() <= want.keys()
    for name, value in got.items():  # D = G + (D - G) in float32: within a rounding.
      np.testing.assert_allclose(value, want[name], rtol=0, atol=1e-7, err_msg=name)


def test_a_shallower_transformers_generator_starts_ours_with_its_depth(tmp_path, pair):
  """A 1-layer generator beside a 2-layer discriminator: generator_layers becomes 0.5 and the
  generator's logits equal transformers'; a deeper generator or a conflicting override is one
  line."""
  disc, gen = str(tmp_path / 'disc'), str(tmp_path / 'gen')
  hf_pair.save_pair(disc, gen, pair['vocab'], seed=2, generator_layers=1)
  start = prepare(tmp_path / 'w', init_from=disc, init_generator_from=gen)
  assert start.config.generator_layers == 0.5 and start.config.num_layers == 2
  params, _ = start_params(tmp_path / 'w', start)
  assert sorted(k for k in params['generator']['encoder'] if k.startswith('layer_')) == [
      'layer_0']
  batch = fixed_batch(gen)
  model = model_lib.Electra(model_lib.ModelConfig.from_config(start.config))
  ids, segments, mask = batch['input_ids'], batch['token_type_ids'], batch['attention_mask']
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  ours, _ = jax.jit(lambda p: model.apply({'params': p}, ids, segments, mask, positions))(params)
  assert_logits_match(np.asarray(ours), hf_logits(gen, 'generator', batch), mask)
  # The same depth written as another fraction is no conflict; another depth is.
  prepare(tmp_path / 'same', init_from=disc, init_generator_from=gen, generator_layers=0.6)
  with pytest.raises(UserError, match=r'--config.generator_layers=1.0 conflicts .* '
                                      r'generator_layers=0.5'):
    prepare(tmp_path / 'deep', init_from=disc, init_generator_from=gen, generator_layers=1.0)
  one_layer = dict(hf_files.read_config(disc), num_hidden_layers=1)
  with pytest.raises(UserError, match="the generator has 2 layers, more than the "
                                      "discriminator's 1"):
    hf_configs.shape_keys(one_layer, hf_files.read_config(pair['gen']))


def test_damaged_transformers_files_are_one_line_naming_the_file(tmp_path, pair):
  """A file cut short or hand-edited wrong: one UserError naming it, not a traceback (a
  SafetensorError, JSONDecodeError, AttributeError or TypeError)."""
  def damaged(name, content) -> str:
    """A copy of the discriminator with `name` rewritten as content(its path) says."""
    directory = tmp_path / f'copy{len(list(tmp_path.iterdir()))}'
    shutil.copytree(pair['disc'], directory)
    (directory / name).write_bytes(content(directory / name))
    return str(directory)

  for content in (lambda p: b'', lambda p: p.read_bytes()[:p.stat().st_size // 2]):
    source = damaged('model.safetensors', content)
    with pytest.raises(UserError, match=re.escape(f"'{source}/model.safetensors' is not a "
                                                  'readable safetensors file')):
      hf_files.read_dir(source)
  source = damaged('model.safetensors', lambda p: b'')
  os.remove(os.path.join(source, 'model.safetensors'))
  torch.save([torch.zeros(2)], os.path.join(source, 'pytorch_model.bin'))
  with pytest.raises(UserError, match=r"pytorch_model.bin' holds a list, not a state dict"):
    hf_files.read_dir(source)
  # A clone made without git-lfs: pointer files (the .bin one was "convert it to
  # model.safetensors with a tool you trust").
  pointer = (b'version https://git-lfs.github.com/spec/v1\noid sha256:' + b'0' * 64
             + b'\nsize 1234\n')
  for name in ('pytorch_model.bin', 'model.safetensors'):
    with open(os.path.join(source, name), 'wb') as f:
      f.write(pointer)
    with pytest.raises(UserError, match=re.escape(
        f"'{source}/{name}' is a Git LFS pointer, not the weights; fetch them")):
      hf_files.read_dir(source)
  for name in ('config.json', 'tokenizer_config.json', 'tokenizer.json'):
    source = damaged(name, lambda p: p.read_bytes()[:20])
    with pytest.raises(UserError, match=re.escape(f"'{source}/{name}' is not valid JSON (")):
      prepare(tmp_path / 'w', init_from=source)
    assert not (tmp_path / 'w').exists()
  # "architectures": null is transformers' own default (no class named): a discriminator.
  edit = lambda value: lambda p: json.dumps(
      dict(json.loads(p.read_text()), architectures=value)).encode()
  assert prepare(tmp_path / 'w_null', init_from=damaged('config.json', edit(None))).source
  source = damaged('config.json', edit(3))
  with pytest.raises(UserError, match=re.escape(f"'{source}/config.json' has architectures=3")):
    prepare(tmp_path / 'w', init_from=source)
  # A null number was a TypeError from numpy.
  source = damaged('config.json', lambda p: json.dumps(
      dict(json.loads(p.read_text()), layer_norm_eps=None)).encode())
  with pytest.raises(UserError, match=re.escape(f"'{source}/config.json' has "
                                                'layer_norm_eps=None, not a number')):
    prepare(tmp_path / 'w', init_from=source)
  assert not (tmp_path / 'w').exists()
  # A size as text, a fraction or null: a TypeError from ConfigDict or a comparison.
  for key, value in (('hidden_size', '32'), ('max_position_embeddings', 1.5),
                     ('vocab_size', None)):
    source = damaged('config.json', lambda p, key=key, value=value: json.dumps(
        dict(json.loads(p.read_text()), **{key: value})).encode())
    with pytest.raises(UserError, match=re.escape(f"'{source}/config.json' has {key}={value!r}, "
                                                  'not a whole number')):
      prepare(tmp_path / 'w', init_from=source)
    assert not (tmp_path / 'w').exists()


def test_a_transformers_directory_this_reader_cannot_take_says_why(tmp_path, pair):
  """Sharded weights, or another model type, were taken for a workdir "not written by train",
  with advice to pass --config.init_from=DIR, what the user had passed."""
  sharded = tmp_path / 'sharded'
  shutil.copytree(pair['disc'], sharded)
  os.rename(sharded / 'model.safetensors', sharded / 'model-00001-of-00001.safetensors')
  (sharded / 'model.safetensors.index.json').write_text('{"metadata": {}, "weight_map": {}}')
  bert = tmp_path / 'bert'
  shutil.copytree(pair['disc'], bert)
  (bert / 'config.json').write_text(json.dumps(
      dict(json.loads((bert / 'config.json').read_text()), model_type='bert')))
  for source, message in ((sharded, f"'{sharded}' has neither model.safetensors nor "
                                    'pytorch_model.bin (sharded checkpoints'),
                          (bert, f"'{bert}/config.json' has model_type='bert'; pass an ELECTRA")):
    with pytest.raises(UserError, match=re.escape(message)):
      prepare(tmp_path / 'w', init_from=str(source))
    with pytest.raises(UserError, match=re.escape(message)):  # Fine-tuning's reader too.
      finetune_pretrained.pretraining_config(str(source))
  assert not (tmp_path / 'w').exists()


def test_without_a_generator_directory_the_generator_is_random_and_the_run_says_so(tmp_path,
                                                                                   pair):
  start = prepare(tmp_path / 'w', init_from=pair['disc'], generator_hidden_size=0.25)
  params, notes = start_params(tmp_path / 'w', start)
  assert notes[-1].endswith('randomly initialised: generator/encoder, generator/head, '
                            'generator/output_bias (no init_generator_from)')
  assert params['generator']['encoder']['layer_0']['intermediate']['kernel'].shape == (8, 16)
  _, disc_state = hf_files.read_dir(pair['disc'])
  np.testing.assert_array_equal(params['discriminator']['head']['dense']['bias'],
                                disc_state['discriminator_predictions.dense.bias'])


def test_a_workdir_or_one_of_its_checkpoints_is_a_source(tmp_path, trained):
  with pytest.raises(UserError, match='generator comes along'):
    prepare(tmp_path / 'x', init_from=trained['workdir'], init_generator_from=trained['workdir'])
  checkpoints = os.path.join(trained['workdir'], 'checkpoints')
  for source, step in ((trained['workdir'], STEPS), (os.path.join(checkpoints, '20'), 20)):
    start = prepare(tmp_path / str(step), init_from=source)
    assert start.config.vocab_file == saved_config.load(trained['workdir']).vocab_file
    params, notes = start_params(tmp_path / str(step), start)
    saved, _ = checkpoint.read_params(trained['workdir'], step)
    jax.tree.map(np.testing.assert_array_equal, params, saved)
    assert f'(step {step})' in notes[-1]
  # With uniform_generator the run has no generator: the source's is left out, as the other
  # sources do (it was refused as "parameters this config has no place for").
  start = prepare(tmp_path / 'uniform', init_from=trained['workdir'], uniform_generator=True)
  params, notes = start_params(tmp_path / 'uniform', start)
  assert "the source's generator is left out: objective 'electra' with uniform_generator" in (
      ' '.join(notes))
  saved, _ = checkpoint.read_params(trained['workdir'], STEPS)
  assert 'generator' in saved and set(params) == set(saved) - {'generator'}
  jax.tree.map(np.testing.assert_array_equal, params,
               {k: v for k, v in saved.items() if k != 'generator'})


def test_a_model_saved_in_bfloat16_or_float16_reads_as_its_values_in_float32(tmp_path, pair):
  """model.to(torch.bfloat16).save_pretrained(DIR): safetensors.numpy has no bfloat16, and
  init_from and fine-tuning failed with KeyError 'BF16'."""
  _, reference = hf_files.read_dir(pair['disc'])
  for dtype in (torch.bfloat16, torch.float16):
    directory = tmp_path / str(dtype)
    model = copy.deepcopy(pair['models']['discriminator']).to(dtype)
    model.save_pretrained(str(directory))
    _, state = hf_files.read_dir(str(directory))
    assert state.keys() == reference.keys()
    for name, value in model.state_dict().items():
      assert state[name].dtype == np.float32
      np.testing.assert_array_equal(state[name], value.float().numpy())


def test_sizes_a_config_json_leaves_out_are_the_ones_transformers_builds():
  """A hand-written config.json without embedding_size got hidden_size (transformers: 128)
  and a valid directory was refused; without num_hidden_layers, a KeyError."""
  from electra_jax.hf import configs as hf_configs  # pylint: disable=import-outside-toplevel
  built = transformers.ElectraConfig()
  keys = hf_configs.shape_keys({'model_type': 'electra'})
  assert keys == dict(
      embedding_size=built.embedding_size, hidden_size=built.hidden_size,
      num_layers=built.num_hidden_layers, num_heads=built.num_attention_heads,
      intermediate_size=built.intermediate_size, vocab_size=built.vocab_size,
      max_position_embeddings=built.max_position_embeddings,
      type_vocab_size=built.type_vocab_size, relative_attention_span=0)


def test_pytorch_model_bin_is_read_with_weights_only_and_a_code_pickle_is_refused(tmp_path,
                                                                                   pair):
  directory = tmp_path / 'bin'
  shutil.copytree(pair['disc'], directory)
  os.remove(directory / 'model.safetensors')
  model = pair['models']['discriminator']
  torch.save(model.state_dict(), directory / 'pytorch_model.bin')
  _, state = hf_files.read_dir(str(directory))
  _, reference = hf_files.read_dir(pair['disc'])
  assert all(np.array_equal(state[k], v) for k, v in reference.items())

  marker = tmp_path / 'code_ran'

  class Payload:  # pylint: disable=too-few-public-methods
    def __reduce__(self):
      return (os.system, (f'touch {marker}',))

  torch.save({'electra.embeddings.word_embeddings.weight': Payload()},
             directory / 'pytorch_model.bin')
  with pytest.raises(UserError, match='only weights are read from pickles'):
    hf_files.read_dir(str(directory))
  assert not marker.exists()


def test_an_unreadable_step_is_one_line_naming_it_and_the_steps_to_read_instead(
    tmp_path, cache_dir, trained):
  """A step directory missing its state (a copy cut short), or an empty stray one, fails
  evaluate, export and init_from with one line naming it and the other steps, not a traceback;
  export refuses an --output among the run's checkpoints (it would pass for one)."""
  workdir = tmp_path / 'w'
  shutil.copytree(trained['workdir'], workdir)
  checkpoints = workdir / 'checkpoints'
  shutil.rmtree(checkpoints / str(STEPS) / 'state')
  unreadable = f'checkpoint step {STEPS} in {checkpoints} cannot be read ('
  cli = lambda module, *flags: subprocess.run(
      [sys.executable, '-m', module, f'--workdir={workdir}', *flags], cwd=REPO_ROOT,
      env=env_for(cache_dir), capture_output=True, text=True, timeout=600)
  for module, flags in (('electra_jax.evaluate', ['--num_batches=1']),
                        ('electra_jax.export', [f'--output={tmp_path / "hf"}'])):
    proc = cli(module, *flags)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f'error: {unreadable}'), lines
    assert lines[0].endswith('); read one of its other steps, [10, 20] (--step=N)'), lines
  with pytest.raises(UserError, match=re.escape(unreadable) + r'.*; read one of its other '
                                      r'steps, \[10, 20\]$'):
    start_params(tmp_path / 'new', prepare(tmp_path / 'new', init_from=str(workdir)))
  shutil.rmtree(checkpoints / str(STEPS))
  (checkpoints / '40').mkdir()
  with pytest.raises(UserError, match=re.escape(f'checkpoint step 40 in {checkpoints} cannot '
                                                'be read (')):
    checkpoint.read_params(str(workdir))
  proc = cli('electra_jax.export', f'--output={checkpoints / "50"}', '--step=20')
  assert proc.returncode == 2 and proc.stderr.strip() == (
      f"error: --output '{checkpoints / '50'}' lies in checkpoints/ of the run in "
      f"'{workdir}', among its own files; choose a directory outside it, e.g. WORKDIR/hf")
  assert not (checkpoints / '50').exists()


def test_nan_weights_or_a_lost_vocabulary_of_a_source_are_one_line_before_anything_is_written(
    tmp_path, cache_dir, small_corpus, pair, trained):
  # pylint: disable=import-outside-toplevel
  from safetensors.numpy import load_file, save_file
  broken = tmp_path / 'nan'
  shutil.copytree(pair['disc'], broken)
  tensors = load_file(broken / 'model.safetensors')
  tensors[sorted(k for k in tensors if k.endswith('LayerNorm.weight'))[0]][0] = np.nan
  save_file(tensors, broken / 'model.safetensors', metadata={'format': 'pt'})
  new = tmp_path / 'new'
  flags = command(small_corpus, dict(pair, disc=str(broken)), new, '--stop_after_steps=0')
  proc = subprocess.run(flags, cwd=REPO_ROOT, env=env_for(cache_dir), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert re.search(rf"^error: init_from '{re.escape(str(broken))}': parameter \S+ holds "
                   r'NaN/inf \(1 parameter\(s\) do\); start from weights that are finite$',
                   proc.stderr.strip()), proc.stderr
  assert not new.exists()
  # A workdir from before runs kept their vocabulary, whose vocab_file has since gone.
  old = tmp_path / 'old'
  shutil.copytree(trained['workdir'], old)
  os.remove(old / 'vocab.txt')
  saved = json.loads((old / 'config.json').read_text())
  saved['vocab_file'] = str(tmp_path / 'gone' / 'vocab.txt')
  (old / 'config.json').write_text(json.dumps(saved))
  with pytest.raises(UserError, match=re.escape(
      f"'{old}' has no spm.model, vocab.txt or WordPiece tokenizer.json; pass its vocabulary as "
      '--config.vocab_file=FILE')):
    prepare(tmp_path / 'v', init_from=str(old))
  assert not (tmp_path / 'v').exists()
  start = prepare(tmp_path / 'given', init_from=str(old), vocab_file=pair['vocab'])
  assert start.config.vocab_size == 600


# --- Vocabulary extension -------------------------------------------------------------------

def extend_and_export(tmp_path, cache_dir, init_flags, words, corpus):
  words_file = tmp_path / 'words.txt'
  words_file.write_text('\n'.join(words) + '\n', encoding='utf-8')
  workdir, output = str(tmp_path / 'w'), str(tmp_path / 'hf')
  proc = run(cache_dir, [*RUN_FLAGS, f'--config.train_files={corpus}',
                         f'--config.eval_files={corpus}', *init_flags,
                         f'--config.extend_vocab_file={words_file}', f'--workdir={workdir}',
                         '--stop_after_steps=0'])
  run(cache_dir, [f'--workdir={workdir}', f'--output={output}', '--what=both'],
      module='electra_jax.export')
  return workdir, output, proc


def assert_new_rows(params, source, old_tokenizer, words, old_size):
  for i, word in enumerate(words):
    pieces = old_tokenizer.encode(word)
    assert len(pieces) > 1, word  # a word the old vocabulary split
    for table in ('embeddings', 'generator_embeddings'):
      if table in params:
        np.testing.assert_allclose(params[table]['word_embeddings'][old_size + i],
                                   source[table]['word_embeddings'][pieces].mean(0), rtol=1e-6)
    bias = params['generator']['output_bias']
    assert bias[old_size + i] == source['generator']['output_bias'][pieces].min()
  for table in ('embeddings', 'generator'):
    old = jax.tree.map(lambda x: x[:old_size] if x.shape[:1] == (old_size + len(words),) else x,
                       params[table])
    jax.tree.map(np.testing.assert_array_equal, old, source[table])


def test_extended_wordpiece_vocabulary_starts_from_piece_means_and_round_trips_transformers(
    tmp_path, cache_dir, small_corpus, pair, step0):
  words = ['knightley', 'woodhouse', 'Hartfield']  # Emma's, unknown to a Northanger vocabulary
  workdir, output, proc = extend_and_export(
      tmp_path, cache_dir, [f'--config.init_from={pair["disc"]}',
                            f'--config.init_generator_from={pair["gen"]}'], words, small_corpus)
  assert 'added 3 token(s)' in proc.stdout and 'ids 600-602' in proc.stdout
  c = saved_config.load(workdir)
  assert c.vocab_size == 603
  assert wordpiece.read_tokens(c.vocab_file)[600:] == ['knightley', 'woodhouse', 'hartfield']
  old = wordpiece.WordPieceTokenizer(pair['vocab'])
  params, _ = checkpoint.read_params(workdir)
  source, _ = checkpoint.read_params(step0['workdir'], 0)
  assert_new_rows(params, source, old, [w.lower() for w in words], 600)
  # transformers reads the extended tokenizer and model: the new words are one token each.
  batch = fixed_batch(output)
  assert 600 in batch['input_ids'][1] and 601 in batch['input_ids'][1]
  disc, gen = our_logits(workdir, batch)
  assert_logits_match(disc, hf_logits(output, 'discriminator', batch), batch['attention_mask'])
  assert_logits_match(gen, hf_logits(os.path.join(output, 'generator'), 'generator', batch),
                      batch['attention_mask'])


def test_extended_sentencepiece_vocabulary_round_trips_transformers(tmp_path, cache_dir,
                                                                    small_corpus):
  """From a workdir with the bundled sentencepiece vocabulary (a tiny demo run at step 0)."""
  source = str(tmp_path / 'source')
  run(cache_dir, ['--config=configs/demo.py', '--config.num_layers=1',
                  '--config.hidden_size=32', '--config.embedding_size=16',
                  '--config.intermediate_size=64', '--config.num_heads=2',
                  '--config.max_seq_length=32', '--config.train_batch_size=8',
                  '--config.relative_attention_span=0',  # the paper's network: it exports
                  f'--config.train_files={small_corpus}', '--config.progress_bar=false',
                  f'--workdir={source}', '--stop_after_steps=0'])
  words = ['electrophoresis', 'Immunoglobulin', 'Knightley']  # the last one is known already
  workdir, output, proc = extend_and_export(
      tmp_path, cache_dir, [f'--config.init_from={source}'], words, small_corpus)
  assert 'added 2 token(s)' in proc.stdout and 'ids 8000-8001' in proc.stdout
  assert "skipped 1 already in the vocabulary (e.g. 'Knightley')" in proc.stdout
  c = saved_config.load(workdir)
  assert c.vocab_size == 8002 and c.vocab_file == os.path.join(workdir, 'spm.model')
  ours = tokenizer_lib.for_config(c)
  assert ours.encode('Mr. Immunoglobulin')[-1] == 8001
  old = tokenizer_lib.load_tokenizer('data/demo_spm.model')
  params, _ = checkpoint.read_params(workdir)
  source_params, _ = checkpoint.read_params(source)
  assert_new_rows(params, source_params, old, words[:2], 8000)
  texts = TEXTS + ['Electrophoresis of immunoglobulin, said Immunoglobulin electrophoresis.']
  batch = fixed_batch(output, texts)
  assert {8000, 8001} <= set(batch['input_ids'][-1].tolist())
  assert [list(row[row != 0]) for row in batch['input_ids']] == [
      [ours.cls_id, *ours.encode(t), ours.sep_id] for t in texts]
  disc, _ = our_logits(workdir, batch)  # A fresh init's logits are small: 0.02-scale weights.
  assert_logits_match(disc, hf_logits(output, 'discriminator', batch), batch['attention_mask'],
                      magnitude=1e-3)


def test_extend_vocab_file_refuses_tokens_wordpiece_can_never_produce(tmp_path, pair):
  words = tmp_path / 'words.txt'
  words.write_text('covid-19\n', encoding='utf-8')
  with pytest.raises(UserError, match="'covid-19' can never be a WordPiece token"):
    prepare(tmp_path / 'w', init_from=pair['disc'], extend_vocab_file=str(words))
  words.write_text('two words\n', encoding='utf-8')
  with pytest.raises(UserError, match='line 1'):
    prepare(tmp_path / 'w', init_from=pair['disc'], extend_vocab_file=str(words))


@pytest.mark.parametrize('token', ['a\u200bb', 'a▁b'])
def test_extend_vocab_file_refuses_tokens_a_sentencepiece_model_reads_as_two_words(token):
  """nmt_nfkc maps U+200B (and '▁' is the boundary itself) to a space: '▁a▁b' spans two
  words, so no text would ever produce it."""
  with pytest.raises(UserError, match=re.escape(
      f"{token!r} can never be a sentencepiece token (the model reads it as '▁a▁b'")):
    extend_vocab.extend_sentencepiece(os.path.join(REPO_ROOT, 'data', 'demo_spm.model'),
                                      ['Immunoglobulin', token], 'words.txt')


@pytest.mark.parametrize('token', ['##\u200b', '##\u0301', '\u200b'])
def test_extend_vocab_file_refuses_a_token_that_normalises_to_no_text(token):
  """A zero-width space or a lone accent (uncased) is no text: no old pieces to average."""
  vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'a', '##b']
  with pytest.raises(UserError, match=re.escape(f'{token!r} normalises to no text')):
    extend_vocab.extend_wordpiece(vocab, True, ['a', token], 'words.txt')
  if not token.startswith('##'):
    with pytest.raises(UserError, match=re.escape(f'{token!r} normalises to no text')):
      extend_vocab.extend_sentencepiece(os.path.join(REPO_ROOT, 'data', 'demo_spm.model'),
                                        [token], 'words.txt')


def test_extend_vocab_file_adds_multi_word_pieces_to_a_model_trained_across_words(tmp_path):
  """A model trained with split_by_whitespace=false has pieces spanning words: one more is
  added, and the extended model encodes the two words' text as it."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('the cat sat on the mat and the dog sat on the log\n' * 50, encoding='utf-8')
  spm.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(tmp_path / 'x'), vocab_size=40, pad_id=0,
      pad_piece='[PAD]', unk_id=1, unk_piece='[UNK]', bos_id=-1, eos_id=-1,
      control_symbols=['[CLS]', '[SEP]', '[MASK]'], split_by_whitespace=False,
      hard_vocab_limit=False, minloglevel=2)
  extension = extend_vocab.extend_sentencepiece(str(tmp_path / 'x.model'), ['cat dog'],
                                                'words.txt')
  assert extension.tokens == ['▁cat▁dog']
  (tmp_path / 'y.model').write_bytes(extension.content())
  extended = spm.SentencePieceProcessor(model_file=str(tmp_path / 'y.model'))
  assert extended.encode('the cat dog', out_type=str)[-1] == '▁cat▁dog'


def test_dry_run_from_a_workdir_sets_up_the_devices_before_reading_its_checkpoint(cache_dir,
                                                                                step0):
  """Reading a workdir's checkpoint starts JAX: --cpu_devices (and the process group) come
  first, as in the run the plan describes."""
  proc = run(cache_dir, ['--config=configs/demo.py', f'--config.init_from={step0["workdir"]}',
                         '--config.max_seq_length=32', '--cpu_devices=2', '--dry_run'])
  assert last_json(proc.stdout)['num_devices'] == 2


def test_dry_run_plans_the_source_shapes_and_writes_nothing(tmp_path, cache_dir, pair):
  """demo.py is 2 x 128 wide; the pair is 2 x 32 with 600 tokens: the plan counts the pair's."""
  workdir = tmp_path / 'never_written'
  proc = run(cache_dir, ['--config=configs/demo.py', f'--config.init_from={pair["disc"]}',
                         f'--config.init_generator_from={pair["gen"]}', f'--workdir={workdir}',
                         '--config.max_seq_length=32', '--dry_run'])
  plan = last_json(proc.stdout)
  exp = experiment_lib.Experiment.create(
      prepare(tmp_path / 'x', init_from=pair['disc'], init_generator_from=pair['gen']).config)
  expected = sum(x.size for x in jax.tree.leaves(exp.abstract_state().params))
  assert plan['num_params'] == expected
  demo_params = sum(x.size for x in jax.tree.leaves(experiment_lib.Experiment.create(
      demo.get_config(), read_vocab=False).abstract_state().params))
  assert plan['num_params'] < demo_params / 4
  assert not workdir.exists()
