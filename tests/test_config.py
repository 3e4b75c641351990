import json
import re
import subprocess
import sys

import pytest

from configs import base, base_config, demo, demo_long, large, small, small_plus
from electra_jax import config as config_lib
from electra_jax import saved_config
from electra_jax.errors import UserError


def test_presets_fill_only_unset_size_keys():
  c = small.get_config()
  c.num_layers = 6
  r = config_lib.resolve(c)
  assert (r.hidden_size, r.num_heads, r.intermediate_size, r.embedding_size) == (256, 4, 1024, 128)
  assert r.num_layers == 6


def test_a_warmup_longer_than_the_run_is_capped_with_a_note_and_a_normal_one_is_kept():
  short = small.get_config()
  short.num_train_steps = 20
  assert config_lib.resolve(short).num_warmup_steps == 20
  note = config_lib.warmup_note(short)
  assert 'num_warmup_steps=10000 exceeds config.num_train_steps=20' in note and '\n' not in note
  r = config_lib.resolve(small.get_config())
  assert (r.num_warmup_steps, r.num_train_steps) == (10_000, 1_000_000)
  assert config_lib.warmup_note(small.get_config()) is None


def test_max_predictions_follows_official_formula():
  assert config_lib.resolve(small.get_config()).max_predictions_per_seq == 19
  assert config_lib.resolve(large.get_config()).max_predictions_per_seq == int(0.255 * 512)


@pytest.mark.parametrize('module,expected', [
    (small, dict(learning_rate=5e-4, train_batch_size=128, max_seq_length=128,
                 num_train_steps=1_000_000, mask_prob=0.15, generator_hidden_size=0.25)),
    (base, dict(learning_rate=2e-4, train_batch_size=256, max_seq_length=512,
                num_train_steps=766_000, mask_prob=0.15, generator_hidden_size=1 / 3)),
    (large, dict(learning_rate=2e-4, train_batch_size=2048, max_seq_length=512,
                 num_train_steps=400_000, mask_prob=0.25, generator_hidden_size=0.25)),
    # The released Small (official README, google-research/electra issues 39 and 68).
    (small_plus, dict(learning_rate=5e-4, train_batch_size=128, max_seq_length=512,
                      num_train_steps=4_000_000, mask_prob=0.15, generator_hidden_size=1.0,
                      hidden_size=256, num_layers=12, embedding_size=128,
                      max_predictions_per_seq=79)),
])
def test_paper_configs_carry_paper_hyperparameters(module, expected):
  c = config_lib.resolve(module.get_config())
  for key, value in expected.items():
    assert c[key] == pytest.approx(value), key
  shared = dict(num_warmup_steps=10_000, weight_decay_rate=0.01, adam_epsilon=1e-6,
                adam_b1=0.9, adam_b2=0.999, dropout_rate=0.1, attention_dropout_rate=0.1,
                max_grad_norm=1.0, disc_weight=50.0, gen_weight=1.0, temperature=1.0,
                mask_token_prob=0.85, random_token_prob=0.0)
  for key, value in shared.items():
    assert c[key] == value, key


def test_paper_configs_change_only_paper_keys():
  allowed = {'model_size', 'generator_hidden_size', 'mask_prob', 'learning_rate',
             'train_batch_size', 'max_seq_length', 'num_train_steps', 'num_warmup_steps',
             'steps_per_execution'}  # How, not what, is computed (Small: 100 steps a call).
  defaults = base_config.get_config().to_dict()
  for module in (small, small_plus, base, large):
    cfg = module.get_config().to_dict()
    changed = {k for k in cfg if cfg[k] != defaults[k]}
    assert changed <= allowed, (module.__name__, changed - allowed)


def test_official_preset_sets_the_release_keys_on_the_named_paper_config():
  from configs import official  # pylint: disable=import-outside-toplevel
  for size, module in (('small', small), ('small_plus', small_plus), ('large', large)):
    c = official.get_config(size).to_dict()
    expected = dict(module.get_config().to_dict(), **official.OFFICIAL)
    assert c == expected, size
  assert official.get_config('small_plus').generator_hidden_size == 1.0
  with pytest.raises(UserError, match="'smal' is not a paper config; pick small, small_plus"):
    official.get_config('smal')


def test_demo_long_stretches_the_demo_and_its_argument_changes_only_the_objective():
  short, long, mlm = (c.to_dict() for c in (
      demo.get_config(), demo_long.get_config(), demo_long.get_config('mlm')))
  assert {k for k in long if long[k] != short[k]} == {
      'num_train_steps', 'num_warmup_steps', 'log_every_steps', 'eval_every_steps',
      'save_checkpoints_steps', 'generator_lr_multiplier'}
  assert {k for k in mlm if mlm[k] != long[k]} == {'objective'} and mlm['objective'] == 'mlm'
  bad = demo_long.get_config('bert')
  with pytest.raises(UserError, match="config.objective='bert' must be one of"):
    config_lib.resolve(bad)


@pytest.mark.parametrize('overrides,needle', [
    (dict(model_size='huge'), "model_size='huge'"),
    (dict(hidden_size=100, num_heads=3), 'hidden_size=100'),
    (dict(max_seq_length=1024), 'max_seq_length=1024'),
    (dict(max_seq_length=3), 'max_seq_length=3 must be >= 8'),  # Not the key derived from it.
    (dict(dtype='float16'), "dtype='float16'"),
    (dict(mask_token_prob=0.9, random_token_prob=0.2), 'random_token_prob=0.2'),
    (dict(generator_hidden_size=1.5), 'generator_hidden_size=1.5'),
    (dict(text_key=''), 'config.text_key is empty'),
    # Checked before the masking budget derived from it, which a NaN cannot give.
    (dict(mask_prob=float('nan')), 'config.mask_prob=nan must be in (0, 1)'),
    (dict(mask_prob=0.0), 'config.mask_prob=0.0 must be in (0, 1)'),
    (dict(mask_prob=0.001), 'config.mask_prob=0.001 masks no token of a config.max_seq_length='),
    (dict(type_vocab_size=1), 'config.type_vocab_size=1 must be >= 2'),
    (dict(seed=2**32), 'config.seed=4294967296 must be in [0, 2**32)'),
    (dict(adam_b2=1.0), 'config.adam_b2=1.0 must be in [0, 1)'),
    (dict(adam_b1=float('nan')), 'config.adam_b1=nan must be in [0, 1)'),
    (dict(adam_epsilon=0.0), 'config.adam_epsilon=0.0 must be > 0 (ELECTRA: 1e-6)'),
    (dict(learning_rate=float('inf')), 'config.learning_rate=inf must be > 0'),
    (dict(lr_decay_power=float('inf')), 'config.lr_decay_power=inf must be > 0'),
    (dict(weight_decay_rate=float('nan')), 'config.weight_decay_rate=nan must be >= 0'),
    (dict(max_grad_norm=-1.0), 'config.max_grad_norm=-1.0 must be >= 0 (0: no clipping)'),
    (dict(disc_weight=-50.0), 'config.disc_weight=-50.0 must be >= 0'),
    (dict(short_seq_prob=2.0), 'config.short_seq_prob=2.0 must be a probability in [0, 1]'),
    (dict(disc_output_bias_init=float('inf')), 'config.disc_output_bias_init=inf must be a '
                                               'finite number'),
    (dict(objective='adversarial', tie='gdes'), "config.tie='gdes' shares"),
])
def test_invalid_values_fail_with_one_line_naming_the_key(overrides, needle):
  c = demo.get_config()
  c.update(overrides)
  with pytest.raises(UserError) as e:
    config_lib.resolve(c, training=True)
  assert needle in str(e.value) and '\n' not in str(e.value)


def test_what_only_training_reads_is_checked_for_training_not_when_a_run_is_loaded(tmp_path):
  """A finished run an older version trained (a seed past 2**32, gdes with adversarial, a
  single token type) still evaluates, exports and fine-tunes; training it is refused."""
  for overrides in (dict(seed=2**32), dict(objective='adversarial', tie='gdes'),
                    dict(type_vocab_size=1), dict(adam_epsilon=0.0)):
    c = demo.get_config()
    c.update(overrides)
    workdir = tmp_path / '_'.join(overrides)
    workdir.mkdir()
    saved = config_lib.resolve(c).to_dict()
    (workdir / 'config.json').write_text(json.dumps(saved))
    assert saved_config.load(str(workdir)).to_dict() == saved
    with pytest.raises(UserError):
      config_lib.resolve(c, training=True)


def test_data_paths_resolve_absolute_where_found_from_the_cwd_then_the_repository_root(
    tmp_path, monkeypatch):
  """The resolved (and so saved) config names the files the run reads, whichever directory a
  later resume or evaluate starts from; a URL, and a glob matching nothing, stay as written, and
  files in the repository are named relative to it."""
  (tmp_path / 'mine').mkdir()
  (tmp_path / 'mine' / 'a.txt').write_text('text\n')
  (tmp_path / 'data').mkdir()  # Holds no files: 'data/...' is found in the repository.
  (tmp_path / 'spm.model').write_bytes(b'model')
  monkeypatch.chdir(tmp_path)
  c = demo.get_config()
  c.update(train_files='mine/*.txt, data/demo_corpus/train/*.txt', eval_files='gs://b/e*.txt',
           vocab_file='spm.model', tfds_data_dir='nowhere/tfds', init_from='~/run')
  r = config_lib.resolve(c)
  # The bundled data stays named as the repository names it: the clone may move.
  assert r.train_files == f"{tmp_path / 'mine' / '*.txt'},data/demo_corpus/train/*.txt"
  assert r.eval_files == 'gs://b/e*.txt'
  assert r.vocab_file == str(tmp_path / 'spm.model')
  assert r.tfds_data_dir == str(tmp_path / 'nowhere' / 'tfds')
  assert r.init_from.startswith('/') and r.init_from.endswith('/run')
  c.eval_files = 'missing/*.txt'  # Left for the one-line 'no files match' error naming it.
  assert config_lib.resolve(c).eval_files == 'missing/*.txt'
  assert config_lib.resolve(r).to_dict() == r.to_dict()  # Resolving again changes nothing.


def test_a_saved_config_loads_with_renamed_keys_under_their_new_names(tmp_path):
  """A workdir written before tfds_text_key became text_key keeps its value; one written after
  keeps its own; keys since removed are dropped."""
  saved = config_lib.resolve(demo.get_config()).to_dict()
  del saved['text_key']
  (tmp_path / 'config.json').write_text(json.dumps(dict(saved, tfds_text_key='body', gone=1)))
  assert saved_config.load(str(tmp_path)).text_key == 'body'
  (tmp_path / 'config.json').write_text(json.dumps(dict(saved, text_key='content')))
  assert saved_config.load(str(tmp_path)).text_key == 'content'


def test_loading_a_pretraining_config_names_a_fine_tuning_or_transformers_workdir(tmp_path):
  """evaluate, detect, init_from and fine-tuning's init_checkpoint read a pretraining run: given
  another kind of directory, they say which kind it is (not that a key of it is invalid)."""
  saved = config_lib.resolve(demo.get_config()).to_dict()
  for contents, message in [
      (dict(task='files', model_size='demo', save_checkpoints_steps=0),
       'holds a fine-tuning run (python -m electra_jax.finetune); pass the workdir of a '
       'pretraining run (python -m electra_jax.train); to label text with it: python -m '
       f'electra_jax.predict --workdir={tmp_path} --input=FILE --output=DIR'),
      (dict(model_type='electra', hidden_size=256),
       'holds a config.json that python -m electra_jax.train did not write')]:
    (tmp_path / 'config.json').write_text(json.dumps(contents))
    with pytest.raises(UserError, match=re.escape(message)):
      saved_config.load(str(tmp_path))
  (tmp_path / 'config.json').write_text(json.dumps(saved))
  assert saved_config.load(str(tmp_path)).to_dict() == saved


def test_an_edited_config_json_of_the_wrong_shape_is_one_line_naming_it(tmp_path):
  """A value of the wrong type, or a file that is no JSON object, raised TypeError from
  ConfigDict (a traceback from evaluate, detect, export or predict)."""
  # pylint: disable=import-outside-toplevel
  from configs.finetune import glue
  saved = config_lib.resolve(demo.get_config()).to_dict()
  target = tmp_path / 'config.json'
  for contents, message in [
      (dict(saved, mask_prob='0.15'), f"'{target}': mask_prob=\"0.15\" does not fit the key"),
      (None, f"'{target}' holds null, not a JSON object of config keys"),
      ([saved], f"'{target}' holds an array, not a JSON object of config keys"),
      # ConfigDict takes null into any key; resolve then compared None with an int.
      (dict(saved, num_train_steps=None), f"'{target}': num_train_steps=null does not fit the "
       'key (num_train_steps has no unset value; its default is 1000000)'),
      (dict(saved, vocab_size=None), f"'{target}': vocab_size=null does not fit")]:
    target.write_text(json.dumps(contents))
    with pytest.raises(UserError, match=re.escape(message)):
      saved_config.load(str(tmp_path))
  finetuning = dict(glue.get_config().to_dict(), task='files', num_epochs='3')
  target.write_text(json.dumps(finetuning))
  with pytest.raises(UserError, match=re.escape(f"'{target}': num_epochs=\"3\" does not fit")):
    saved_config.load_finetuning(str(tmp_path))
  # A key finetune leaves unset may stay null.
  target.write_text(json.dumps(dict(finetuning, num_epochs=3, eval_file=None)))
  assert saved_config.load_finetuning(str(tmp_path)).eval_file is None


def test_resolved_config_is_locked_against_typos():
  r = config_lib.resolve(demo.get_config())
  with pytest.raises(AttributeError):
    r.hiden_size = 3  # pylint: disable=attribute-defined-outside-init


# Imports every module of the package, then lists the flags any of them defined.
_IMPORT_ALL = """
import importlib, pkgutil
from absl import flags
import electra_jax
for module in pkgutil.walk_packages(electra_jax.__path__, 'electra_jax.'):
  importlib.import_module(module.name)
print(sorted(name for module, defined in flags.FLAGS.flags_by_module_dict().items()
             if module.startswith('electra_jax') for name in [f.name for f in defined]))
"""


def test_importing_any_module_defines_no_flags():
  """Flags are defined by a command when it runs (DESIGN: entry points only), so any module
  imports beside any command's (a test, a notebook, fine-tuning's own --workdir) without a
  clash, and a library function takes values as arguments, not from global flags."""
  proc = subprocess.run([sys.executable, '-c', _IMPORT_ALL], capture_output=True, text=True,
                        timeout=300, check=True)
  assert proc.stdout.strip().splitlines()[-1] == '[]'


def test_a_sources_generator_becomes_our_fractions_or_one_line_naming_it():
  """A released generator (transformers, official) is held as the fractions that give its
  sizes; one that is not the discriminator scaled by one fraction is refused."""
  keys = dict(hidden_size=256, intermediate_size=1024, num_heads=4, num_layers=12)
  small = dict(hidden_size=64, intermediate_size=256, num_heads=1, num_layers=12)
  assert config_lib.with_generator(keys, small, 'x') == dict(
      keys, generator_hidden_size=0.25, generator_layers=1.0)
  half_depth = dict(small, num_layers=6)
  assert config_lib.with_generator(keys, half_depth, 'x')['generator_layers'] == 0.5
  with pytest.raises(UserError, match=r"generator sizes .* of 'ckpt' are not the discriminator "
                                      r"sizes scaled by one fraction \(that gives .*"
                                      r"'intermediate_size': 256"):
    config_lib.with_generator(keys, dict(small, intermediate_size=128), "'ckpt'")
