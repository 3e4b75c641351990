"""Export to (and the weight conversion from) HF transformers ELECTRA: same numbers, exact
round trips, the CLI. Starting a run from transformers weights: tests/test_init_from.py."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
import transformers

from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import export
from electra_jax import model as model_lib
from electra_jax import saved_config
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError
from electra_jax.hf import configs as hf_configs
from electra_jax.hf import files as hf_files
from electra_jax.hf import tokenizer_files
from electra_jax.hf import weights as hf_weights
from tests.conftest import REPO_ROOT, tiny_config
from tests.test_train_cli import TINY_FLAGS, last_json, run_cli

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

# E != H (embeddings_project in the discriminator), a 3-head 24-wide model whose generator has
# one head and an odd FFN width, and E > H with a full-width generator (projection in both).
CONFIGS = {
    'E16_H32_gen_half': dict(),
    'H24_3heads_gen_third': dict(embedding_size=24, hidden_size=24, num_heads=3,
                                 intermediate_size=40, generator_hidden_size=1 / 3),
    'E32_H16_gen_full': dict(embedding_size=32, hidden_size=16, num_heads=4,
                             generator_hidden_size=1.0),
    # A generator with adversarial's baseline head, which transformers' class has no slot for.
    'adversarial': dict(objective='adversarial'),
}


def random_params(c, seed=0):
  """Random params of our model's shapes (numpy, no compilation). Biases and LayerNorm offsets
  are non-zero and scales away from one, so a misplaced bias or LayerNorm cannot hide."""
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  shapes = jax.eval_shape(lambda r: model_lib.init_params(model, r, c.max_seq_length, 1),
                          jax.random.key(0))
  rng = np.random.default_rng(seed)

  def draw(path, shape):
    value = rng.normal(0.0, 0.1, shape.shape).astype(np.float32)
    return value + 1.0 if jax.tree_util.keystr(path).endswith("['scale']") else value

  return model, jax.tree_util.tree_map_with_path(draw, shapes)


def padded_inputs(c, batch=3, seq=20, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, c.vocab_size, (batch, seq))
  segments = np.broadcast_to((np.arange(seq) >= seq // 2).astype(np.int64), (batch, seq))
  mask = np.ones((batch, seq), np.int64)
  mask[1, 13:] = 0  # padding at the end of two rows
  mask[2, 5:] = 0
  return ids, np.ascontiguousarray(segments), mask


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_exported_models_give_our_logits_on_padded_inputs(name, tmp_path):
  c = config_lib.resolve(tiny_config(**CONFIGS[name]))
  model, params = random_params(c)
  hf_files.write_model(params, c, 'discriminator', str(tmp_path / 'd'))
  hf_files.write_model(params, c, 'generator', str(tmp_path / 'g'))
  hf_disc = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / 'd')).eval()
  hf_gen = transformers.ElectraForMaskedLM.from_pretrained(str(tmp_path / 'g')).eval()
  assert hf_gen.config.hidden_size == model_lib.ModelConfig.from_config(c).generator_hidden_size

  ids, segments, mask = padded_inputs(c)
  every_position = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  # Electra.__call__ runs both networks: (generator logits at the positions, discriminator).
  ours_gen, ours_disc = jax.device_get(jax.jit(lambda p, *a: model.apply({'params': p}, *a))(
      params, ids, segments, mask, every_position))
  with torch.no_grad():
    inputs = dict(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(segments),
                  attention_mask=torch.tensor(mask))
    theirs_disc = hf_disc(**inputs).logits.numpy()
    theirs_gen = hf_gen(**inputs).logits.numpy()
  real = mask.astype(bool)
  assert ours_disc.shape == theirs_disc.shape and ours_gen.shape == theirs_gen.shape
  assert np.abs(ours_disc - theirs_disc)[real].max() < 1e-4
  assert np.abs(ours_gen - theirs_gen)[real].max() < 1e-4
  assert np.abs(ours_disc).max() > 1e-2  # the logits are not trivially zero


def hf_state(model):
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize('name', ['E16_H32_gen_half', 'H24_3heads_gen_third'])
def test_hf_to_ours_to_hf_round_trip_is_exact(name, tmp_path):
  c = config_lib.resolve(tiny_config(**CONFIGS[name]))
  torch.manual_seed(0)
  models = {
      'discriminator': transformers.ElectraForPreTraining(
          transformers.ElectraConfig(**hf_configs.hf_config_dict(c, 'discriminator'))),
      'generator': transformers.ElectraForMaskedLM(
          transformers.ElectraConfig(**hf_configs.hf_config_dict(c, 'generator'))),
  }
  for network, hf_model in models.items():
    with torch.no_grad():  # HF initialises biases to zero and LayerNorms to one: perturb all.
      for p in hf_model.parameters():
        p.add_(0.05 * torch.randn_like(p))
    original = hf_state(hf_model)
    # Read back what transformers itself writes: safetensors (tied matrix left out) and .bin.
    hf_model.save_pretrained(str(tmp_path / network))
    _, saved = hf_files.read_dir(str(tmp_path / network))
    torch.save(hf_model.state_dict(), str(tmp_path / 'pytorch_model.bin'))
    (tmp_path / 'config.json').write_text('{}')
    _, saved_bin = hf_files.read_dir(str(tmp_path))
    for key, value in saved.items():
      np.testing.assert_array_equal(value, original[key], err_msg=key)
      np.testing.assert_array_equal(saved_bin[key], original[key], err_msg=key)
    ours = hf_weights.hf_to_params(saved, c, network)
    encoder_only = hf_weights.hf_to_params(saved, c, network, with_head=False)
    assert 'head' not in encoder_only[network] and 'head' in ours[network]
    assert set(ours) == {'embeddings', network}
    back = hf_weights.params_to_hf(ours, c, network)
    # Every tensor comes back bit for bit; only the tied output matrix is left implicit.
    assert set(original) - set(back) <= {'generator_lm_head.weight'}
    assert set(back) <= set(original)
    for key, value in original.items():
      if key in back:
        np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_import_refuses_wrong_shapes_and_untied_generator_output():
  c = config_lib.resolve(tiny_config())
  _, params = random_params(c)
  state = hf_weights.params_to_hf(params, c, 'generator')
  wrong = dict(state)
  wrong['electra.encoder.layer.0.intermediate.dense.weight'] = np.zeros((3, 3), np.float32)
  with pytest.raises(UserError, match='intermediate.dense.weight has shape'):
    hf_weights.hf_to_params(wrong, c, 'generator')
  untied = dict(state, **{'generator_lm_head.weight': state[
      'electra.embeddings.word_embeddings.weight'] + 1})
  with pytest.raises(UserError, match='generator_lm_head.weight differs'):
    hf_weights.hf_to_params(untied, c, 'generator')
  missing = {k: v for k, v in state.items() if 'layer.1.' not in k}
  with pytest.raises(UserError, match='lacks'):
    hf_weights.hf_to_params(missing, c, 'generator')
  # A bare ElectraModel (or a fine-tuned model): no pretraining head, said as such.
  disc = hf_weights.params_to_hf(params, c, 'discriminator')
  bare = {k: v for k, v in disc.items() if k.startswith('electra.')}
  with pytest.raises(UserError, match=r'has no discriminator pretraining head '
                     r'\(discriminator_predictions\.\*: a bare ElectraModel'):
    hf_weights.hf_to_params(bare, c, 'discriminator')
  assert hf_weights.hf_to_params(bare, c, 'discriminator', with_head=False)


def test_exported_tokenizer_matches_ours_on_held_out_text(tmp_path):
  tokenizer_files.write_tokenizer('data/demo_spm.model', str(tmp_path), 512)
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  ours = tokenizer_lib.load_tokenizer('data/demo_spm.model')
  with open(os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'eval', 'persuasion.txt'),
            encoding='utf-8') as f:
    lines = [line for line in f.read().split('\n') if line.strip()]
  lines += ['  extra   spaces\tand a tab ', 'ﬁne ＦＵＬＬ width 1760, émigré 日本']
  lines += ['the end\x85', '\x85the end']  # sentencepiece trims spaces only, not U+0085
  assert len(lines) > 500
  theirs = hf_tok(lines, add_special_tokens=False)['input_ids']
  assert theirs == ours.encode_batch(lines)
  pair = hf_tok('First part.', 'Second one.')
  a, b = ours.encode('First part.'), ours.encode('Second one.')
  cls, sep = tokenizer_lib.CLS_ID, tokenizer_lib.SEP_ID
  assert pair['input_ids'] == [cls, *a, sep, *b, sep]
  assert pair['token_type_ids'] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  assert (hf_tok.pad_token_id, hf_tok.mask_token_id) == (tokenizer_lib.PAD_ID,
                                                          tokenizer_lib.MASK_ID)


def test_exported_bpe_sentencepiece_tokenizer_matches_ours(tmp_path):
  """A BPE vocabulary (build_vocab --model_type=bpe) exports too, with our ids."""
  def lines_of(split):
    folder = os.path.join(REPO_ROOT, 'data', 'demo_corpus', split)
    with open(os.path.join(folder, sorted(os.listdir(folder))[0]), encoding='utf-8') as f:
      return [line for line in f.read().split('\n') if line.strip()]

  model = tokenizer_lib.train_sentencepiece(lines_of('train')[:3000], 600,
                                            str(tmp_path / 'bpe'), model_type='bpe',
                                            num_threads=1)
  out = tmp_path / 'hf'
  out.mkdir()
  tokenizer_files.write_tokenizer(model, str(out), 128)
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
  ours = tokenizer_lib.load_tokenizer(model)
  lines = lines_of('eval')[:300] + ['  extra   spaces\tand a tab ', 'zzzqqq xylophone',
                                    'ﬁne ＦＵＬＬ width 1760, émigré 日本']
  assert hf_tok(lines, add_special_tokens=False)['input_ids'] == ours.encode_batch(lines)


def test_exported_tokenizer_keeps_pieces_across_words_and_refuses_suffix_spaces(tmp_path):
  """split_by_whitespace=false: the export split at spaces anyway, so the model read ids it
  never trained on; treat_whitespace_as_suffix it cannot express at all."""
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('of the house of the\nthe cat sat on the mat of the house\n' * 50,
                    encoding='utf-8')
  for name, setting in (('across', 'split_by_whitespace'),
                        ('suffix', 'treat_whitespace_as_suffix')):
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / name), vocab_size=40, pad_id=0,
        pad_piece='[PAD]', unk_id=1, unk_piece='[UNK]', bos_id=-1, eos_id=-1,
        control_symbols=['[CLS]', '[SEP]', '[MASK]'], hard_vocab_limit=False, minloglevel=2,
        **{setting: setting == 'treat_whitespace_as_suffix'})
    (tmp_path / name / 'hf').mkdir(parents=True)
  model, out = str(tmp_path / 'across.model'), tmp_path / 'across' / 'hf'
  tokenizer_files.write_tokenizer(model, str(out), 128)
  ours = tokenizer_lib.load_tokenizer(model)
  lines = ['of the house of the', 'the cat sat on the mat', 'a house, of the cat']
  assert any('▁' in ours.id_to_piece(i)[1:] for i in ours.encode(lines[0]))  # spans words
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
  assert hf_tok(lines, add_special_tokens=False)['input_ids'] == ours.encode_batch(lines)
  with pytest.raises(UserError, match=re.escape(
      f"vocab_file '{tmp_path / 'suffix.model'}' was trained with treat_whitespace_as_suffix")):
    tokenizer_files.write_tokenizer(str(tmp_path / 'suffix.model'),
                                    str(tmp_path / 'suffix' / 'hf'), 128)


def test_wordpiece_vocab_exports_as_an_electra_tokenizer(tmp_path):
  words = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'cat', 'sat', '##s', '.']
  (tmp_path / 'vocab.txt').write_text('\n'.join(words) + '\n', encoding='utf-8')
  out = tmp_path / 'out'
  out.mkdir()
  tokenizer_files.write_tokenizer(str(tmp_path / 'vocab.txt'), str(out), 128)
  tok = transformers.AutoTokenizer.from_pretrained(str(out))
  assert (out / 'vocab.txt').read_text(encoding='utf-8').split() == words
  assert tok('The cats sat.')['input_ids'] == [2, 5, 6, 8, 7, 9, 3]
  assert tok('dog', add_special_tokens=False)['input_ids'] == [1]
  ours = tokenizer_lib.load_tokenizer(str(tmp_path / 'vocab.txt'))
  for text in ('The cats sat.', 'THE CÄT SATS', 'the dog sat'):
    assert tok(text, add_special_tokens=False)['input_ids'] == ours.encode(text)


def test_a_vocab_txt_with_spaces_at_line_ends_exports_the_tokens_we_read(tmp_path):
  """BERT reads 'cat ' as the token cat (and drops blank lines at the end); transformers' vocab
  readers kept the space, so the exported tokenizer gave [UNK] for cat."""
  words = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the ', 'cat\t', 'sat', '##s', '.']
  (tmp_path / 'vocab.txt').write_text('\n'.join(words) + '\n\n\n', encoding='utf-8')
  out = tmp_path / 'out'
  out.mkdir()
  tokenizer_files.write_tokenizer(str(tmp_path / 'vocab.txt'), str(out), 128)
  ours = tokenizer_lib.load_tokenizer(str(tmp_path / 'vocab.txt'))
  assert ours.encode('the cats') == [5, 6, 8]
  for fast in (True, False):
    tok = transformers.AutoTokenizer.from_pretrained(str(out), use_fast=fast)
    assert len(tok) == ours.vocab_size
    assert tok('the cats', add_special_tokens=False)['input_ids'] == [5, 6, 8]


def test_export_refuses_missing_workdir_checkpoint_and_non_empty_output(tmp_path):
  with pytest.raises(UserError, match='does not exist'):
    export.export_workdir(str(tmp_path / 'nowhere'), str(tmp_path / 'out'))
  (tmp_path / 'a_file').write_text('x')
  with pytest.raises(UserError, match="a_file' is a file; pass a training workdir"):
    export.export_workdir(str(tmp_path / 'a_file'), str(tmp_path / 'out'))
  (tmp_path / 'empty').mkdir()
  with pytest.raises(UserError, match='config.json'):
    export.export_workdir(str(tmp_path / 'empty'), str(tmp_path / 'out'))
  workdir = tmp_path / 'no_ckpt'
  workdir.mkdir()
  c = config_lib.resolve(tiny_config())
  (workdir / 'config.json').write_text(config_lib.to_json(c), encoding='utf-8')
  with pytest.raises(UserError, match='no checkpoints'):
    export.export_workdir(str(workdir), str(tmp_path / 'out'))
  (tmp_path / 'full').mkdir()
  (tmp_path / 'full' / 'keep.txt').write_text('x')
  with pytest.raises(UserError, match='not empty; pass --overwrite'):
    export.export_workdir(str(workdir), str(tmp_path / 'full'))
  assert (tmp_path / 'full' / 'keep.txt').read_text() == 'x'
  assert not (tmp_path / 'out').exists()


def test_an_output_that_is_a_mount_point_is_refused_naming_a_folder_inside(tmp_path,
                                                                          monkeypatch):
  """A mount point (a container's volume) cannot be renamed away, as replacing it takes."""
  volume = tmp_path / 'volume'
  volume.mkdir()
  mounted = os.path.ismount
  monkeypatch.setattr(os.path, 'ismount', lambda p: p == str(volume) or mounted(p))
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text(config_lib.to_json(config_lib.resolve(tiny_config())),
                                       encoding='utf-8')
  with pytest.raises(UserError, match=re.escape(
      f"--output '{volume}' is a mount point, which an export cannot replace (it writes a new "
      f'directory beside it and renames that into place); pass a directory inside it, e.g. '
      f'{volume}/hf')):
    export.export_workdir(str(workdir), str(volume))
  assert not os.listdir(volume)


def test_exported_config_names_the_vocabularys_own_pad_id(tmp_path):
  """A vocab.txt may hold [PAD] anywhere; transformers' embedding keeps that row's gradient
  at zero (padding_idx), so config.json must name the real one."""
  from electra_jax import optim, parallel  # pylint: disable=import-outside-toplevel
  from electra_jax import train_state as ts  # pylint: disable=import-outside-toplevel
  words = ['[UNK]', '[CLS]', '[SEP]', '[MASK]', 'the', 'cat', 'sat', '[PAD]', '##s', '.']
  (tmp_path / 'vocab.txt').write_text('\n'.join(words) + '\n', encoding='utf-8')
  workdir = tmp_path / 'run'
  c = config_lib.resolve(tiny_config(vocab_file=str(tmp_path / 'vocab.txt'),
                                     vocab_size=len(words)))
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  state = ts.init_state(parallel.make_mesh(), jax.random.key(0), model,
                        optim.make_optimizer(c)[0], c.max_seq_length, c.max_predictions_per_seq)
  ckpt = checkpoint.Checkpointer(str(workdir / 'checkpoints'))
  ckpt.save(1, state, force=True)
  ckpt.close()
  saved_config.write(str(workdir), c)
  export.export_workdir(str(workdir), str(tmp_path / 'hf'))
  hf_model = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / 'hf'))
  tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
  assert hf_model.config.pad_token_id == tok.pad_token_id == 7


def test_exported_config_keeps_the_runs_initializer_range():
  """transformers initialises what a fine-tuning head adds with it: the run's, not BERT's."""
  c = config_lib.resolve(tiny_config(initializer_range=0.05))
  for network in ('discriminator', 'generator'):
    assert hf_configs.hf_config_dict(c, network)['initializer_range'] == 0.05


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """A 2-step CLI training run, exported (generator too) by the export CLI."""
  base = tmp_path_factory.mktemp('export')
  corpus = base / 'corpus.txt'
  with open(os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'train', 'emma.txt'),
            encoding='utf-8') as f:
    corpus.write_text(f.read(20_000).rsplit('\n', 1)[0] + '\n', encoding='utf-8')
  workdir, output = str(base / 'run'), str(base / 'hf')
  run_cli('electra_jax.train', '--config=configs/demo.py', f'--workdir={workdir}',
          f'--config.train_files={corpus}', f'--config.eval_files={corpus}', *TINY_FLAGS,
          '--config.relative_attention_span=0', '--config.num_train_steps=2',
          '--config.eval_every_steps=0')
  proc = run_cli('electra_jax.export', f'--workdir={workdir}', f'--output={output}',
                 '--what=both')
  return dict(workdir=workdir, output=output, result=last_json(proc.stdout), base=base)


def test_export_cli_writes_directories_transformers_loads(exported):
  output, result = exported['output'], exported['result']
  assert result['step'] == 2 and result['directories']['generator'] == os.path.join(
      output, 'generator')
  assert not [n for n in os.listdir(os.path.dirname(output)) if '.tmp-' in n]
  tok = transformers.AutoTokenizer.from_pretrained(output)
  disc = transformers.ElectraForPreTraining.from_pretrained(output).eval()
  gen = transformers.ElectraForMaskedLM.from_pretrained(os.path.join(output, 'generator')).eval()
  batch = tok(['Emma Woodhouse, handsome, clever, and rich.', 'Short.'], padding=True,
              return_tensors='pt')
  c = saved_config.load(exported['workdir'])
  params, _ = checkpoint.read_params(exported['workdir'])
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  ids, segments, mask = (batch[k].numpy() for k in ('input_ids', 'token_type_ids',
                                                    'attention_mask'))
  ours = jax.jit(lambda p, *a: model.apply({'params': p}, *a, method=model_lib.Electra
                                           .discriminator_logits))(params, ids, segments, mask)
  with torch.no_grad():
    theirs = disc(**batch).logits.numpy()
    mlm = gen(**batch).logits
  real = mask.astype(bool)
  assert np.abs(np.asarray(ours) - theirs)[real].max() < 1e-4
  assert mlm.shape == (*ids.shape, c.vocab_size)
  # The generator directory shares the discriminator's embeddings.
  np.testing.assert_array_equal(gen.electra.embeddings.word_embeddings.weight.detach().numpy(),
                                disc.electra.embeddings.word_embeddings.weight.detach().numpy())


def test_a_refused_export_leaves_no_folder_it_made_for_output(exported):
  new = pathlib.Path(exported['base']) / 'new'
  proc = run_cli('electra_jax.export', f'--workdir={exported["workdir"]}',
                 f'--output={new}/a/hf', '--step=7', check=False)
  assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
      f"error: --step=7 is not a checkpoint in {exported['workdir']}/checkpoints; available: "
      '[2]'], proc.stderr
  assert not new.exists()
  # A disk that fills up (no file may pass 100 KB; the embeddings are 500 KB): one line.
  full = subprocess.run(['bash', '-c', 'ulimit -f 100 && exec "$@"', '--', sys.executable, '-m',
                         'electra_jax.export', f'--workdir={exported["workdir"]}',
                         f'--output={new}/a/hf'], cwd=REPO_ROOT, capture_output=True, text=True,
                        timeout=600, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  assert full.returncode == 2 and full.stderr.strip().splitlines() == [
      f"error: writing --output '{new}/a/hf' failed (File too large); free disk space (or raise "
      'the quota or file size limit), then re-run the same command'], full.stderr
  assert not new.exists()


def test_overwrite_replaces_an_earlier_export_but_never_the_run_or_other_files(exported):
  """--overwrite with --output at the workdir, above it (a symlink too), among its checkpoints
  or at a directory that is not an export (a folder of notes) would have deleted them: refused,
  nothing touched."""
  workdir, base = exported['workdir'], exported['base']
  os.symlink(workdir, base / 'link_to_run')
  before = sorted(str(p) for p in pathlib.Path(workdir).rglob('*'))
  for output in (workdir, str(base), str(base / 'link_to_run')):
    with pytest.raises(UserError, match='is the workdir or a directory holding it'):
      export.export_workdir(workdir, output, overwrite=True)
  with pytest.raises(UserError, match=re.escape(
      f"lies in checkpoints/ of the run in '{workdir}', among its own files")):
    export.export_workdir(workdir, os.path.join(workdir, 'checkpoints'), overwrite=True)
  (pathlib.Path(base) / 'notes').mkdir()
  (pathlib.Path(base) / 'notes' / 'todo.txt').write_text('mine')
  with pytest.raises(UserError, match='is not an earlier export .* replaces only those'):
    export.export_workdir(workdir, str(base / 'notes'), overwrite=True)
  assert (pathlib.Path(base) / 'notes' / 'todo.txt').read_text() == 'mine'
  assert sorted(str(p) for p in pathlib.Path(workdir).rglob('*')) == before
  # Inside the workdir is fine, and a second export replaces the first.
  inside = os.path.join(workdir, 'hf')
  export.export_workdir(workdir, inside)
  (pathlib.Path(inside) / 'config.json').write_text('from before')
  assert export.export_workdir(workdir, inside, overwrite=True)['output'] == inside
  assert sorted(os.listdir(inside)) == sorted(
      n for n in os.listdir(exported['output']) if n != 'generator')
  assert (pathlib.Path(inside) / 'config.json').read_text() != 'from before'
  shutil.rmtree(inside)


def test_overwrite_refuses_an_export_directory_holding_files_an_export_never_writes(exported):
  """--overwrite replaces the directory whole: a README, notes or a run kept beside an earlier
  export (here in its generator/ too) would be deleted with it, so it is refused, nothing
  touched."""
  output = pathlib.Path(exported['base']) / 'hf_with_notes'
  shutil.copytree(exported['output'], output)
  assert not {n for p in (output, output / 'generator') for n in os.listdir(p)} - (
      export.EXPORT_NAMES | {export.GENERATOR_DIR})  # The names cover what an export writes.
  for extra in ('README.md', 'my_experiments/notes.txt', 'checkpoints/2/state', 'metrics.jsonl',
                'generator/notes.txt'):
    (output / extra).parent.mkdir(parents=True, exist_ok=True)
    (output / extra).write_text('mine')
  before = sorted(str(p) for p in output.rglob('*'))
  with pytest.raises(UserError) as e:
    export.export_workdir(exported['workdir'], str(output), what='both', overwrite=True)
  assert str(e.value) == (
      f"--output '{output}' holds README.md, checkpoints/ and 3 more, which an export never "
      'writes, and --overwrite replaces the whole directory; move them out or choose another '
      'directory')
  assert sorted(str(p) for p in output.rglob('*')) == before
  assert not [n for n in os.listdir(output.parent) if '.tmp-' in n or '.old-' in n]


def test_overwrite_through_a_symlinked_output_replaces_its_target_and_keeps_the_link(exported):
  """It replaced the link with a directory, then failed removing the old one (rmtree on a
  link): a traceback, a stray link.old-*, the target still the old export."""
  base = pathlib.Path(exported['base'])
  target, link = base / 'link_target', base / 'hf_link'
  shutil.copytree(exported['output'], target)
  (target / 'config.json').write_text('from before')
  os.symlink(target, link)
  result = export.export_workdir(exported['workdir'], str(link), what='both', overwrite=True)
  assert result['output'] == str(link)
  assert link.is_symlink() and os.readlink(link) == str(target)
  assert (target / 'config.json').read_text() != 'from before'
  assert sorted(os.listdir(target)) == sorted(os.listdir(exported['output']))
  assert not [n for n in os.listdir(base) if '.tmp-' in n or '.old-' in n]


def test_an_overwrite_that_fails_half_way_leaves_the_earlier_export(exported, monkeypatch):
  output = pathlib.Path(exported['base']) / 'hf_half'
  shutil.copytree(exported['output'], output)
  before = {str(p): p.read_bytes() for p in output.rglob('*') if p.is_file()}

  def broken(*args):
    raise OSError('disk full')

  monkeypatch.setattr(tokenizer_files, 'write_tokenizer', broken)  # After the weights.
  with pytest.raises(OSError, match='disk full'):
    export.export_workdir(exported['workdir'], str(output), what='both', overwrite=True)
  assert {str(p): p.read_bytes() for p in output.rglob('*') if p.is_file()} == before
  assert not [n for n in os.listdir(output.parent) if '.tmp-' in n or '.old-' in n]


# --- Fine-tuned classifiers ----------------------------------------------------------------------

@pytest.mark.parametrize('kind', ['three_classes', 'stsb_regression'])
def test_a_finetuned_head_exports_as_transformers_sequence_classifier(kind, tmp_path):
  """transformers' head out_proj(gelu(dense(x))) holds our linear head exactly; a regression
  comes out on the task's scale (STS-B: ours x 5). E != H, so the projection is covered."""
  from electra_jax.finetune import loop, tasks  # pylint: disable=import-outside-toplevel
  from electra_jax.hf import classifier  # pylint: disable=import-outside-toplevel
  task = (tasks.named_files_task(('anne', 'emma', 'fanny')) if kind == 'three_classes'
          else tasks.get_task('stsb'))
  c = config_lib.resolve(tiny_config())
  model_config = model_lib.ModelConfig.from_config(c)
  model = loop.make_model(task, model_config)
  ids, segments, mask = padded_inputs(c)
  batch = dict(input_ids=ids, segment_ids=segments, input_mask=mask)
  params = jax.device_get(model.init({'params': jax.random.key(0)}, batch)['params'])
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: x + rng.normal(0, 0.1, x.shape).astype(np.float32), params)
  # A head of logits well away from zero, both signs: each GELU pair works far from its kink.
  params['head']['output'] = {k: rng.normal(0, 1.0, v.shape).astype(np.float32)
                              for k, v in params['head']['output'].items()}
  ours = np.asarray(model.apply({'params': params}, batch))
  hf_files.write_dir(str(tmp_path), classifier.config_dict(model_config, task, 0.1, 0),
                     classifier.state_dict(params, model_config, task))
  hf_model = transformers.ElectraForSequenceClassification.from_pretrained(str(tmp_path)).eval()
  with torch.no_grad():
    theirs = hf_model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(segments),
                      attention_mask=torch.tensor(mask)).logits.numpy()
  assert theirs.shape == ours.shape == (3, task.num_outputs)
  np.testing.assert_allclose(theirs, ours * task.label_scale, atol=1e-4)
  assert np.abs(ours).max() > 1.0
  if kind == 'three_classes':
    assert hf_model.config.id2label == {0: 'anne', 1: 'emma', 2: 'fanny'}
    assert hf_model.config.problem_type == 'single_label_classification'
  else:
    assert hf_model.config.problem_type == 'regression' and hf_model.config.num_labels == 1


@pytest.mark.parametrize('tie, reason', [
    ('none', "config.tie='none': the generator has its own embeddings (generator_embeddings)"),
    ('all', "config.tie='all': the generator has no encoder of its own (it runs the "
     "discriminator's, and shares its embeddings)")])
def test_a_generator_the_export_cannot_write_is_refused_with_the_reason(tie, reason):
  c = config_lib.resolve(tiny_config(tie=tie, generator_hidden_size=1.0))
  export.check_exportable(c, {'discriminator': ''})
  for networks in ({'generator': ''}, {'discriminator': '', 'generator': 'generator'}):
    with pytest.raises(UserError) as e:
      export.check_exportable(c, networks)
    assert str(e.value).startswith(reason) and str(e.value).endswith(
        'export only --what=discriminator'), str(e.value)


def test_heads_transformers_cannot_hold_are_refused_with_the_reason():
  from configs.finetune import glue  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import tasks  # pylint: disable=import-outside-toplevel
  from electra_jax.hf import classifier  # pylint: disable=import-outside-toplevel
  cfg = model_lib.ModelConfig.from_config(config_lib.resolve(tiny_config()))
  def run(**keys):
    c = glue.get_config()
    c.update(keys)
    return c
  sst2 = tasks.get_task('sst2')
  classifier.check_exportable(sst2, cfg, run())
  with pytest.raises(UserError, match=r"config.span_head='xlnet': this SQuAD head .* has no "
                                      r'transformers class; fine-tune with --config.span_head='
                                      r'bert'):
    classifier.check_exportable(tasks.get_task('squad_v2'), cfg, run(span_head='xlnet'))
  classifier.check_exportable(tasks.get_task('squad_v2'), cfg, run(span_head='bert'))
  with pytest.raises(UserError, match="classifier_pooling='mean'"):
    classifier.check_exportable(sst2, cfg, run(classifier_pooling='mean'))
  tagger = tasks.named_tagging_task(('B-X', 'O'))
  classifier.check_exportable(tagger, cfg, run())
  with pytest.raises(UserError, match=r"config.tag_head='official': this tagger read every "
                                      r'token as segment 1.* --config.tag_head=transformers'):
    classifier.check_exportable(tagger, cfg, run(tag_head='official'))
  with pytest.raises(UserError, match='relative_attention_span=8'):
    classifier.check_exportable(sst2, model_lib.ModelConfig.from_config(
        config_lib.resolve(tiny_config(relative_attention_span=8))), run())
  many = tasks.named_files_task(tuple(f'c{i}' for i in range(17)))  # 2 x 17 > hidden 32
  with pytest.raises(UserError, match='17 classes need a hidden size of at least 34'):
    classifier.check_exportable(many, cfg, run())
