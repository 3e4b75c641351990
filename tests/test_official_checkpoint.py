"""Starting a run from an official (TF1) ELECTRA checkpoint, read without TensorFlow.

tests/data/official_checkpoint was written by TensorFlow's own Saver
(tests/data/make_official_checkpoint.py) with the official code's variable names; the reader
must return exactly what was saved, and the imported model must compute what the official
model computes, transcribed here in NumPy from google-research/electra (model/modeling.py,
run_pretraining.py)."""
import os
import re
import shutil

import jax
import numpy as np
import pytest
from scipy import special

from electra_jax import checkpoint
from electra_jax import model as model_lib
from electra_jax import official_checkpoint
from electra_jax import paths
from electra_jax import saved_config
from electra_jax import tf_checkpoint
from electra_jax import train
from electra_jax.errors import UserError
from tests.conftest import REPO_ROOT, tiny_config
from tests.data import make_official_checkpoint as official
# gcs and small_corpus are fixtures used here by name.
from tests.test_gcs import BUCKET, gcs  # pylint: disable=unused-import
from tests.test_train_cli import small_corpus  # pylint: disable=unused-import

FIXTURE = os.path.join(REPO_ROOT, 'tests', 'data', 'official_checkpoint')


def test_the_reader_returns_every_variable_tensorflow_saved():
  prefix = tf_checkpoint.find_prefix(FIXTURE)
  assert prefix == os.path.join(FIXTURE, 'model.ckpt-7')
  reader = tf_checkpoint.Reader(prefix)
  want = official.values()
  assert reader.names() == sorted(want)
  for name, value in want.items():
    got = reader.read(name)
    assert got.dtype == np.asarray(value).dtype and reader.shape(name) == np.shape(value), name
    np.testing.assert_array_equal(got, value, err_msg=name)


def test_a_prefix_is_found_however_it_is_named(tmp_path):
  prefix = os.path.join(FIXTURE, 'model.ckpt-7')
  assert tf_checkpoint.find_prefix(prefix) == prefix
  # The `checkpoint` file names the directory the run wrote to, not this one: found by name.
  with open(os.path.join(FIXTURE, 'checkpoint'), encoding='utf-8') as f:
    assert FIXTURE not in f.read()
  # Without the `checkpoint` file: the directory's one *.index.
  copy = shutil.copytree(FIXTURE, tmp_path / 'copy', ignore=shutil.ignore_patterns('checkpoint'))
  assert tf_checkpoint.find_prefix(str(copy)) == str(copy / 'model.ckpt-7')
  assert tf_checkpoint.find_prefix(str(tmp_path / 'missing')) is None
  assert tf_checkpoint.find_prefix(str(tmp_path)) is None
  # One of the prefix's own files (a common slip) names it.
  for name in os.listdir(copy):
    if name.startswith('model.ckpt-7.'):
      assert tf_checkpoint.find_prefix(str(copy / name)) == str(copy / 'model.ckpt-7'), name
  # Several steps without a `checkpoint` file (gsutil cp 'model.ckpt-*'): no guess, the steps
  # named (it was "not a checkpoint").
  for name in os.listdir(FIXTURE):
    if name.startswith('model.ckpt-7.'):
      for step in (9, 10):
        shutil.copy(os.path.join(FIXTURE, name), copy / name.replace('-7.', f'-{step}.'))
  with pytest.raises(UserError, match=re.escape(
      f"'{copy}' holds 3 checkpoints (model.ckpt-7, model.ckpt-9, model.ckpt-10) and no "
      f"'checkpoint' file naming one; pass the prefix of the step to read, e.g. "
      f"'{copy / 'model.ckpt-10'}'")):
    tf_checkpoint.find_prefix(str(copy))
  shutil.copy(os.path.join(FIXTURE, 'checkpoint'), copy / 'checkpoint')
  assert tf_checkpoint.find_prefix(str(copy)) == str(copy / 'model.ckpt-7')


def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path):
  copy = shutil.copytree(FIXTURE, tmp_path / 'copy')
  data = copy / 'model.ckpt-7.data-00000-of-00001'
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2] ^= 0xff
  data.write_bytes(bytes(raw))
  reader = tf_checkpoint.Reader(str(copy / 'model.ckpt-7'))
  bad = [n for n in reader.names() if _fails(reader, n)]
  assert len(bad) == 1  # The one variable holding the flipped byte; the others read.
  with pytest.raises(UserError, match=r"data-00000-of-00001' is truncated or corrupt at "
                                      r"variable '.*'.*copy the checkpoint again"):
    reader.read(bad[0])
  index = copy / 'model.ckpt-7.index'
  index.write_bytes(index.read_bytes()[:-10])
  with pytest.raises(UserError, match=r'is not a TensorFlow checkpoint index'):
    tf_checkpoint.Reader(str(copy / 'model.ckpt-7'))


def test_a_copied_checkpoint_reads_its_own_files_not_the_bucket_its_checkpoint_file_names(
    tmp_path, monkeypatch):
  """A run trained on a bucket, copied here: its `checkpoint` file names gs://. The copy's own
  files are read (the bucket was tried first: no credentials, or the bucket's files read).
  Where the step it names is not here, the bucket's error says which step that is."""
  copy = shutil.copytree(FIXTURE, tmp_path / 'copy')
  (copy / 'checkpoint').write_text('model_checkpoint_path: "gs://no-such-bucket/models/tiny/'
                                   'model.ckpt-7"\n', encoding='utf-8')
  asked = []
  is_file = paths.is_file

  def local_only(path):
    if paths.is_remote(path):
      asked.append(path)
      raise UserError(f"'{path}': no Google Cloud credentials")
    return is_file(path)

  monkeypatch.setattr(paths, 'is_file', local_only)
  assert tf_checkpoint.find_prefix(str(copy)) == str(copy / 'model.ckpt-7') and not asked
  for name in os.listdir(copy):  # The step it names is not here: the one *.index is.
    if name.startswith('model.ckpt-7'):
      os.rename(copy / name, copy / name.replace('-7', '-9'))
  with pytest.raises(UserError, match=re.escape(
      f"'{copy / 'checkpoint'}' names gs://no-such-bucket/models/tiny/model.ckpt-7, which is not "
      f"in {copy} and cannot be read there ('gs://no-such-bucket/models/tiny/model.ckpt-7.index"
      "': no Google Cloud credentials); copy that step here, or pass the prefix")):
    tf_checkpoint.find_prefix(str(copy))
  assert asked == ['gs://no-such-bucket/models/tiny/model.ckpt-7.index']


def test_every_flipped_byte_of_the_index_is_one_line_or_reads_the_same(tmp_path):
  """Each block's CRC32C is checked, so a damaged index is one UserError naming it (it was a
  UnicodeDecodeError, IndexError or struct.error, or other names and values read silently)."""
  copy = shutil.copytree(FIXTURE, tmp_path / 'copy')
  index, prefix = copy / 'model.ckpt-7.index', str(copy / 'model.ckpt-7')
  original = index.read_bytes()
  want = official.values()
  # Every 11th byte (the whole file takes half a minute) and all of the footer.
  for i in sorted(set(range(0, len(original), 11)) | set(range(len(original) - 64,
                                                             len(original)))):
    flipped = bytearray(original)
    flipped[i] ^= 0xff
    index.write_bytes(bytes(flipped))
    try:
      reader = tf_checkpoint.Reader(prefix)
    except UserError as e:
      assert str(index) in str(e) and '\n' not in str(e), (i, e)
      continue
    assert reader.names() == sorted(want), i
    for name, value in want.items():
      np.testing.assert_array_equal(reader.read(name), value, err_msg=f'byte {i}: {name}')


def test_a_missing_data_file_is_one_line_naming_it(tmp_path):
  copy = shutil.copytree(FIXTURE, tmp_path / 'copy')
  os.remove(copy / 'model.ckpt-7.data-00000-of-00001')
  reader = tf_checkpoint.Reader(str(copy / 'model.ckpt-7'))
  with pytest.raises(UserError, match=r"model.ckpt-7.data-00000-of-00001' not found: the data "
                                      r'file its .index names must lie beside it'):
    reader.read(reader.names()[0])


def _fails(reader, name) -> bool:
  try:
    reader.read(name)
  except UserError:
    return True
  return False


# The official model in NumPy (modeling.BertModel, run_pretraining's heads), float64.
def _layer_norm(x, v, name):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-12) * v[f'{name}/gamma'] + v[f'{name}/beta']


def _dense(x, v, name):
  return x @ v[f'{name}/kernel'] + v[f'{name}/bias']


def _gelu(x):
  return 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0)))


def _encoder(v, scope, x, mask, heads):
  if f'{scope}/embeddings_project/kernel' in v:
    x = _dense(x, v, f'{scope}/embeddings_project')
  batch, length, width = x.shape
  i = 0
  while f'{scope}/encoder/layer_{i}/attention/self/query/kernel' in v:
    layer = f'{scope}/encoder/layer_{i}'
    split = lambda t: t.reshape(batch, length, heads, width // heads).transpose(0, 2, 1, 3)
    q, k, val = (split(_dense(x, v, f'{layer}/attention/self/{n}'))
                 for n in ('query', 'key', 'value'))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(width // heads)
    scores += (1.0 - mask[:, None, None, :]) * -10000.0
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ val).transpose(0, 2, 1, 3).reshape(batch, length, width)
    attention = _layer_norm(_dense(context, v, f'{layer}/attention/output/dense') + x, v,
                            f'{layer}/attention/output/LayerNorm')
    hidden = _gelu(_dense(attention, v, f'{layer}/intermediate/dense'))
    x = _layer_norm(_dense(hidden, v, f'{layer}/output/dense') + attention, v,
                    f'{layer}/output/LayerNorm')
    i += 1
  return x


def official_logits(v, ids, segments, mask, heads):
  """(discriminator logits [B, S], generator logits at every position [B, S, V])."""
  v = {k: np.asarray(x, np.float64) for k, x in v.items()}
  table = v['electra/embeddings/word_embeddings']
  embedded = (table[ids] + v['electra/embeddings/token_type_embeddings'][segments]
              + v['electra/embeddings/position_embeddings'][:ids.shape[1]])
  embedded = _layer_norm(embedded, v, 'electra/embeddings/LayerNorm')
  mask = mask.astype(np.float64)
  disc = _encoder(v, 'electra', embedded, mask, heads)
  disc = _dense(_gelu(_dense(disc, v, 'discriminator_predictions/dense')), v,
                'discriminator_predictions/dense_1')[..., 0]
  gen = _encoder(v, 'generator', embedded, mask, official_checkpoint.official_heads(official.G))
  gen = _layer_norm(_gelu(_dense(gen, v, 'generator_predictions/dense')), v,
                    'generator_predictions/LayerNorm')
  return disc, gen @ table.T + v['generator_predictions/output_bias']


@pytest.mark.parametrize('heads', [None, 2])
def test_the_imported_model_computes_the_official_models_logits(heads, tmp_path, small_corpus):
  """Default: the official code's hidden_size // 64 heads (1 here); --config.num_heads=2 for
  the run that set it (the checkpoint's own) — each must match the official model with that
  many heads, the generator keeping the official width // 64."""
  workdir = str(tmp_path / 'run')
  # The sizes of tiny_config (E 16, H 32, 2 heads, generator 0.5 ...) are replaced by the
  # checkpoint's, except num_heads where the command line gives it.
  config = tiny_config(init_from=FIXTURE, train_files=small_corpus, eval_every_steps=0,
                       progress_bar=False, num_heads=heads or 2)
  overridden = ('num_heads',) if heads else ()
  summary = train.train_and_evaluate(config, workdir, stop_after_steps=0, overridden=overridden)
  assert summary['step'] == 0
  c = saved_config.load(workdir)
  assert (c.hidden_size, c.num_heads, c.generator_hidden_size, c.vocab_size, c.tie) == (
      official.H, heads or 1, 0.5, len(official.VOCAB), 'embeddings')
  with open(os.path.join(workdir, 'vocab.txt'), encoding='utf-8') as f:
    assert f.read().split('\n')[:-1] == official.VOCAB  # Copied in: the source may move.
  params, _ = checkpoint.read_params(workdir)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, len(official.VOCAB), (3, 20))
  segments = np.zeros_like(ids)
  segments[:, 10:] = 1
  mask = np.ones_like(ids)
  mask[1, 14:] = mask[2, 7:] = 0
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  gen, disc = jax.jit(lambda p: model.apply({'params': p}, ids, segments, mask, positions))(
      params)
  want_disc, want_gen = official_logits(official.values(), ids, segments, mask, heads or 1)
  real = mask.astype(bool)
  assert np.abs(np.asarray(disc) - want_disc)[real].max() < 1e-4
  assert np.abs(np.asarray(gen) - want_gen)[real].max() < 1e-4
  assert np.abs(want_disc[real]).max() > 1e-1  # Not trivially zero.
  # The other head count is another model: the check above can tell them apart.
  other, _ = official_logits(official.values(), ids, segments, mask, 1 if heads else 2)
  assert np.abs(other - want_disc)[real].max() > 1e-3


@pytest.mark.parametrize('keys', [dict(uniform_generator=True), dict(objective='mlm')])
def test_a_run_without_a_generator_starts_from_the_discriminator_alone(keys, tmp_path,
                                                                       small_corpus, capsys):
  """The checkpoint's generator has no place in a run with no generator network: it is left
  out with a note (it was a KeyError), the discriminator imported."""
  config = tiny_config(init_from=FIXTURE, train_files=small_corpus, eval_every_steps=0,
                       progress_bar=False, **keys)
  workdir = str(tmp_path / 'run')
  assert train.train_and_evaluate(config, workdir, stop_after_steps=0,
                                  overridden=tuple(keys))['step'] == 0
  assert "note: the source's generator is left out: objective" in capsys.readouterr().out
  params, _ = checkpoint.read_params(workdir)
  assert 'generator' not in params
  np.testing.assert_array_equal(params['embeddings']['word_embeddings'],
                                official.values()['electra/embeddings/word_embeddings'])


def test_official_checkpoint_errors_are_one_line(tmp_path, small_corpus):
  config = lambda **keys: tiny_config(train_files=small_corpus, eval_every_steps=0,
                                      progress_bar=False, **keys)
  with pytest.raises(UserError, match=r'init_generator_from is for a transformers init_from; '
                                      r".*official checkpoint"):
    train.train_and_evaluate(config(init_from=FIXTURE, init_generator_from=FIXTURE),
                             str(tmp_path / 'a'), stop_after_steps=0)
  no_vocab = shutil.copytree(FIXTURE, tmp_path / 'no_vocab',
                             ignore=shutil.ignore_patterns('vocab.txt'))
  with pytest.raises(UserError, match=r'--config.vocab_file=FILE'):
    train.train_and_evaluate(config(init_from=str(no_vocab)), str(tmp_path / 'b'),
                             stop_after_steps=0)
  with pytest.raises(UserError, match=r'--config.hidden_size=32 conflicts with init_from '
                                      r".*official checkpoint\), which has hidden_size=16"):
    train.train_and_evaluate(config(init_from=FIXTURE), str(tmp_path / 'c'), stop_after_steps=0,
                             overridden=('hidden_size',))
  assert not os.path.exists(tmp_path / 'a') and not os.path.exists(tmp_path / 'b')
  # The official code's layout: checkpoints in DATA_DIR/models/NAME, DATA_DIR/vocab.txt.
  layout = shutil.copytree(no_vocab, tmp_path / 'data_dir' / 'models' / 'tiny')
  shutil.copy(os.path.join(FIXTURE, 'vocab.txt'), tmp_path / 'data_dir' / 'vocab.txt')
  assert train.train_and_evaluate(config(init_from=str(layout)), str(tmp_path / 'e'),
                                  stop_after_steps=0)['step'] == 0
  # With the vocabulary named on the command line, the copy without one starts.
  summary = train.train_and_evaluate(
      config(init_from=str(no_vocab), vocab_file=os.path.join(FIXTURE, 'vocab.txt')),
      str(tmp_path / 'd'), stop_after_steps=0, overridden=('vocab_file',))
  assert summary['step'] == 0


def test_a_checkpoint_on_a_bucket_starts_a_run(gcs, tmp_path, small_corpus):
  """The official runs wrote to gs://: the reader goes through the one path layer."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  del gcs
  remote = f'{BUCKET}/official/models/tiny'
  for name in os.listdir(FIXTURE):
    with open(os.path.join(FIXTURE, name), 'rb') as f:
      epath.Path(f'{remote}/{name}').write_bytes(f.read())
  prefix = tf_checkpoint.find_prefix(remote)
  assert prefix == f'{remote}/model.ckpt-7'
  name = 'electra/encoder/layer_1/output/dense/kernel'
  np.testing.assert_array_equal(tf_checkpoint.Reader(prefix).read(name), official.values()[name])
  workdir = str(tmp_path / 'run')
  summary = train.train_and_evaluate(
      tiny_config(init_from=remote, train_files=small_corpus, eval_every_steps=0,
                  progress_bar=False), workdir, stop_after_steps=0)
  assert summary['step'] == 0 and os.path.isfile(os.path.join(workdir, 'vocab.txt'))


def test_fine_tuning_starts_from_an_official_checkpoint_as_from_its_converted_run(
    tmp_path, small_corpus):
  """finetune --config.init_checkpoint=DIR (an unzipped release) keeps the discriminator a run
  converted with init_from starts from, and reads the vocab.txt beside it."""
  from configs.finetune import files  # pylint: disable=import-outside-toplevel
  from electra_jax.finetune import loop, pretrained  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / 'converted')
  train.train_and_evaluate(tiny_config(init_from=FIXTURE, train_files=small_corpus,
                                       eval_every_steps=0, progress_bar=False),
                           workdir, stop_after_steps=0)
  direct, direct_config = pretrained.load_pretrained(FIXTURE)
  converted, converted_config = pretrained.load_pretrained(workdir)
  assert direct_config.num_heads == converted_config.num_heads == 1
  assert jax.tree.structure(direct) == jax.tree.structure(converted)
  jax.tree.map(np.testing.assert_array_equal, direct, converted)
  c = files.get_config()
  c.update(dict(init_checkpoint=os.path.join(FIXTURE, 'model.ckpt-7'), max_seq_length=32,
                num_epochs=1, num_seeds=1, max_train_examples=32, max_eval_examples=16,
                train_batch_size=8, eval_batch_size=8, progress_bar=False))
  summary = loop.finetune(c, str(tmp_path / 'ft'))
  assert summary['init_checkpoint'].endswith('model.ckpt-7')
  source, tokenizer = pretrained.network_config(c)
  assert source.vocab_size == tokenizer.vocab_size == len(official.VOCAB)


class _ShapesOnly:
  """A reader that knows names and shapes only: the official layouts no fixture holds."""

  def __init__(self, shapes):
    self._shapes = shapes

  def names(self):
    return sorted(self._shapes)

  def shape(self, name):
    return self._shapes[name]


@pytest.mark.parametrize('layout, error', [
    ({'generator_ltr/encoder/layer_0/attention/self/query/kernel': (8, 8)},
     'is an Electric checkpoint'),
    ({'discriminator_predictions/dense_1/kernel': None}, 'holds no discriminator_predictions'),
    ({f'generator/{k.split("/", 1)[1]}': None for k in official.shapes()
      if k.startswith('generator/encoder/')}, r'untied_generator=False'),
])
def test_official_layouts_our_model_cannot_hold_are_one_line(layout, error, monkeypatch):
  shapes = dict(official.shapes())
  for name, shape in layout.items():
    if shape is None:
      shapes.pop(name)
    else:
      shapes[name] = shape
  monkeypatch.setattr(tf_checkpoint, 'Reader', lambda prefix: _ShapesOnly(shapes))
  with pytest.raises(UserError, match=error):
    official_checkpoint.Checkpoint('ckpt').keys()
  # The fixture's own layout passes.
  monkeypatch.setattr(tf_checkpoint, 'Reader', lambda prefix: _ShapesOnly(official.shapes()))
  assert official_checkpoint.Checkpoint('ckpt').keys()['tie'] == 'embeddings'


def test_a_generator_ours_cannot_hold_starts_random_with_the_reason(tmp_path, small_corpus,
                                                                   capsys, monkeypatch):
  """A run that set num_attention_heads keeps the official generator's width // 64 heads, which
  ours (the discriminator's scaled) may not have; or untied embeddings narrower than ours. Both
  were refused, for fine-tuning (which drops the generator) too; the discriminator imports."""
  shapes = dict(official.shapes())
  shapes['generator/embeddings/word_embeddings'] = (len(official.VOCAB), official.G)
  monkeypatch.setattr(tf_checkpoint, 'Reader', lambda prefix: _ShapesOnly(shapes))
  ckpt = official_checkpoint.Checkpoint('ckpt')
  keys = ckpt.keys()
  assert 'generator_hidden_size' not in keys and keys['hidden_size'] == official.H
  assert re.search(r'embeddings of its own 8 wide \(untied_generator_embeddings\), the '
                   r"discriminator.s 12", ckpt.generator_misfit(keys))
  monkeypatch.undo()
  # 4 heads: the official generator (width 8) has 1, ours would have round(4 x 0.5) = 2.
  workdir = str(tmp_path / 'run')
  config = tiny_config(init_from=FIXTURE, train_files=small_corpus, eval_every_steps=0,
                       progress_bar=False, num_heads=4)
  assert train.train_and_evaluate(config, workdir, stop_after_steps=0,
                                  overridden=('num_heads',))['step'] == 0
  out = capsys.readouterr().out
  assert re.search(r"randomly initialised: generator.*\(the generator sizes .*'num_heads': 1.* "
                   r"of the checkpoint are not the discriminator sizes scaled by one fraction "
                   r"\(that gives .*'num_heads': 2", out), out
  c = saved_config.load(workdir)
  params, _ = checkpoint.read_params(workdir)
  ids = np.random.default_rng(0).integers(5, len(official.VOCAB), (2, 12))
  mask, segments = np.ones_like(ids), np.zeros_like(ids)
  model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  _, disc = jax.jit(lambda p: model.apply({'params': p}, ids, segments, mask, positions))(params)
  want_disc, _ = official_logits(official.values(), ids, segments, mask, 4)
  assert np.abs(np.asarray(disc) - want_disc).max() < 1e-4
  # Fine-tuning starts from the converted run, as the README says.
  from electra_jax.finetune import pretrained  # pylint: disable=import-outside-toplevel
  _, converted_config = pretrained.load_pretrained(workdir)
  assert converted_config.num_heads == 4
