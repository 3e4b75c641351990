"""A new run from released or earlier weights (config.init_from): not the same as resuming.

A run whose workdir holds no checkpoint and whose config names init_from starts at step 0 with
a fresh optimizer state, learning-rate schedule and data order, but with the weights of
  - a transformers ELECTRA discriminator directory (config.json + model.safetensors or
    pytorch_model.bin), plus its generator directory from init_generator_from, or
  - an electra_jax workdir (its latest checkpoint) or one of its checkpoints
    (WORKDIR/checkpoints/STEP), generator included, or
  - an official (TF1) ELECTRA checkpoint (official_checkpoint.py), generator included.
The source fixes the shape keys and the vocabulary; a --config override that disagrees is an
error naming both values. A transformers vocabulary (and an extended one) is written into the
workdir once the run has passed its start-up checks (write_vocabulary), so the run and its
exports do not depend on the source directory staying put. A
workdir that already holds checkpoints resumes instead: init_from is ignored and the saved
config supplies the keys it set.
"""
import copy
import dataclasses
import tempfile
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from electra_jax import atomic
from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import objectives
from electra_jax import official_checkpoint
from electra_jax import saved_config
from electra_jax import tf_checkpoint
from electra_jax import train_state as ts
from electra_jax import paths
from electra_jax.data import extend_vocab
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.data import wordpiece
from electra_jax.errors import UserError
from electra_jax.hf import configs as hf_configs
from electra_jax.hf import files as hf_files
from electra_jax.hf import tokenizer_files
from electra_jax.hf import weights as hf_weights
from electra_jax.objectives import base as objective_base

SIZE_KEYS = ('embedding_size', 'hidden_size', 'num_layers', 'num_heads', 'intermediate_size')
# The config keys a source can fix: parameter shapes and the vocabulary.
SOURCE_KEYS = ('model_size', *SIZE_KEYS, 'generator_hidden_size', 'generator_layers', 'vocab_size',
               'max_position_embeddings', 'type_vocab_size', 'relative_attention_span',
               'objective', 'tie', 'vocab_file', 'do_lower_case')


@dataclasses.dataclass
class Source:
  """Where a new run's weights come from."""
  name: str                  # for messages: "init_from '...'"
  keys: dict                 # config keys it fixes (besides the vocabulary)
  vocabulary: tokenizer_files.Vocabulary
  copy_vocabulary: bool      # a vocabulary from outside any run, copied into the workdir
  # (config with the source's vocab_size) -> (params it holds, numpy, partial tree; notes).
  read_params: Callable[[ml_collections.ConfigDict], tuple[dict, list[str]]]
  generator_hint: str = ''   # why a generator starts from random weights


@dataclasses.dataclass
class Start:
  """How a run in a workdir starts: its config and, for a new run with init_from, the source."""
  config: ml_collections.ConfigDict             # resolved
  source: Source | None = None                  # None: random init, or a resume
  extension: extend_vocab.Extension | None = None
  notes: list[str] = dataclasses.field(default_factory=list)
  # The content of a new run's own vocabulary file (config.vocab_file, in its workdir), which
  # write_vocabulary writes once the run passed its checks: a refused run leaves no trace.
  vocabulary: Callable[[], bytes] | None = None
  _staged: tempfile.TemporaryDirectory | None = dataclasses.field(default=None, repr=False)

  def readable_vocab_file(self) -> str:
    """config.vocab_file, or while it is not written yet, a local copy (removed with this
    Start): the file the run's tokenizer reads."""
    if self.vocabulary is None:
      return self.config.vocab_file
    if self._staged is None:
      self._staged = tempfile.TemporaryDirectory(prefix='electra_jax_vocab_')
      atomic.write_bytes(self._staged_path(), self.vocabulary())
    return self._staged_path()

  def _staged_path(self) -> str:
    return paths.join(self._staged.name, paths.name(self.config.vocab_file))


def _tree_equal(a, b) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _transformers_source(path: str, generator_path: str) -> Source:
  name = f"init_from '{path}'"
  hf = hf_files.read_config(path)
  if hf_configs.is_generator(hf, f"'{paths.join(path, 'config.json')}'"):
    raise UserError(f"config.init_from='{path}' holds a generator (ElectraForMaskedLM); pass "
                    'the discriminator as init_from and this one as init_generator_from')
  hf_generator = None
  if generator_path:
    if not hf_files.is_hf_dir(generator_path):
      raise UserError(f"config.init_generator_from='{generator_path}' is not a transformers "
                      'ELECTRA directory (config.json with model_type electra + weights)')
    hf_generator = hf_files.read_config(generator_path)
    if not hf_configs.is_generator(hf_generator,
                                   f"'{paths.join(generator_path, 'config.json')}'"):
      raise UserError(f"config.init_generator_from='{generator_path}' is not an "
                      'ElectraForMaskedLM generator; pass the generator directory')
  keys = hf_configs.shape_keys(hf, hf_generator)
  if hf_configs.preset_name(keys):
    keys['model_size'] = hf_configs.preset_name(keys)
  vocab = tokenizer_files.read_vocabulary(path)

  def read_params(c):
    generator = (lambda: hf_files.read_dir(generator_path)[1]) if generator_path else None
    return _networks_params(c, hf_files.read_dir(path)[1], generator)

  return Source(name, keys, vocab, copy_vocabulary=True, read_params=read_params,
                generator_hint=' (no init_generator_from)')


def _networks_params(c, discriminator: dict, generator: Callable[[], dict] | None
                     ) -> tuple[dict, list[str]]:
  """Our params from transformers state dicts: the discriminator's, and the generator's where
  `generator` reads one; notes to print."""
  layout = objectives.get(c.objective).layout_for(c)
  params = hf_weights.hf_to_params(discriminator, c, 'discriminator', with_head=layout.rtd_head)
  notes = []
  if generator is not None and layout.cloze_generator:
    notes.append(f"the source's generator (a masked LM) cannot start objective "
                 f"{c.objective!r}'s two-tower cloze generator: it starts from random weights")
    generator = None
  if generator is not None and not layout.generator:
    notes.append(_generator_left_out(c))
    generator = None
  if generator is not None:
    theirs = hf_weights.hf_to_params(generator(), c, 'generator')
    params['generator'] = theirs['generator']
    if c.tie == 'none':
      params['generator_embeddings'] = theirs['embeddings']
    elif c.tie == 'gdes':
      # The shared tables are the generator's, the discriminator's are them plus its delta:
      # both networks as the source has them (an export of a gdes run reads back whole).
      params['discriminator_embeddings'] = jax.tree.map(
          np.subtract, params['embeddings'], theirs['embeddings'])
      params['embeddings'] = theirs['embeddings']
    elif not _tree_equal(theirs['embeddings'], params['embeddings']):
      notes.append("the generator's embedding tables differ from the discriminator's; took "
                   f"the discriminator's (tie={c.tie!r} shares one set; --config.tie=none or "
                   "'gdes' keeps both)")
  return params, notes


def _generator_left_out(c) -> str:
  return (f"the source's generator is left out: objective {c.objective!r}"
          + (' with uniform_generator' if c.get('uniform_generator') else '')
          + ' has no generator network')


def _official_source(path: str, prefix: str, config, overridden) -> Source:
  """An official (TF1) ELECTRA checkpoint: both networks; the vocabulary is the vocab.txt
  beside it or the official layout's DATA_DIR/vocab.txt, else --config.vocab_file."""
  if config.init_generator_from:
    raise UserError(f"config.init_generator_from is for a transformers init_from; '{path}' is "
                    'an official checkpoint, whose generator comes along: drop '
                    'init_generator_from')
  official = official_checkpoint.Checkpoint(prefix)
  keys = official.keys(config.num_heads if 'num_heads' in overridden else None)
  if hf_configs.preset_name(keys):
    keys['model_size'] = hf_configs.preset_name(keys)
  vocab = tokenizer_files.Vocabulary(official.vocab_file(), None, config.do_lower_case)
  misfit = official.generator_misfit(keys)

  def read_params(c):
    generator = (lambda: official.hf_state('generator')) if (
        official.has_generator and not misfit) else None
    return _networks_params(c, official.hf_state('discriminator'), generator)

  return Source(f"init_from '{prefix}' (official checkpoint)", keys, vocab,
                copy_vocabulary=True, read_params=read_params,
                generator_hint=f' ({misfit})' if misfit else
                ' (the checkpoint holds no generator)')


def _workdir_source(path: str, workdir: str, step: int | None) -> Source:
  saved = saved_config.load(workdir)
  ckpt, latest = checkpoint.open_for_reading(workdir)
  steps = ckpt.all_steps()
  ckpt.close()
  if step is not None and step not in steps:
    raise UserError(f"config.init_from='{path}': step {step} is not a complete checkpoint of "
                    f"'{workdir}' (it has {sorted(steps)})")
  step = latest if step is None else step
  keys = {k: saved[k] for k in SOURCE_KEYS if k not in ('vocab_file', 'do_lower_case')}

  def read_params(c):
    params, _ = checkpoint.read_params(workdir, step)
    if 'generator' in params and not objectives.get(c.objective).layout_for(c).generator:
      # The same objective (a source key) with uniform_generator: as the other sources do.
      params = {k: v for k, v in params.items() if not objective_base.is_generator(k)}
      return params, [_generator_left_out(c)]
    return params, []

  # A run from before runs kept their vocabulary may name a file since gone: then it must be
  # given (_vocabulary: --config.vocab_file).
  vocab_file = saved.vocab_file if paths.exists(saved.vocab_file) else None
  return Source(f"init_from '{path}' (step {step})", keys,
                tokenizer_files.Vocabulary(vocab_file, None, saved.do_lower_case),
                copy_vocabulary=False, read_params=read_params)


def open_source(config, overridden=()) -> Source:
  """The source config.init_from names: a transformers directory, a workdir, one of its
  checkpoint steps, or an official (TF1) checkpoint. `overridden`: the --config keys given."""
  init_from, init_generator_from = config.init_from, config.init_generator_from
  path = paths.absolute(init_from)
  if hf_files.is_hf_dir(path):
    return _transformers_source(path, init_generator_from)
  workdir, step = (saved_config.run_step(path) or
                   ((path, None) if saved_config.exists(path) else (None, None)))
  if workdir is not None:
    if init_generator_from:
      raise UserError(f"config.init_generator_from is for a transformers init_from; "
                      f"'{init_from}' is a workdir, whose generator comes along: drop "
                      'init_generator_from')
    return _workdir_source(path, workdir, step)
  prefix = tf_checkpoint.find_prefix(path)
  if prefix is not None:
    return _official_source(init_from, prefix, config, overridden)
  raise UserError(f"config.init_from='{init_from}' is neither a transformers ELECTRA directory "
                  '(config.json with model_type electra + model.safetensors or '
                  'pytorch_model.bin), a training workdir (config.json + checkpoints/), one '
                  'of its checkpoints (WORKDIR/checkpoints/STEP), nor an official TensorFlow '
                  'checkpoint (PREFIX.index + PREFIX.data-*, or their directory)')


def _same(key, value, wanted, keys) -> bool:
  if key in ('generator_hidden_size', 'generator_layers'):
    # The same generator, however the fraction is written.
    sizes = lambda f: config_lib.generator_sizes(ml_collections.ConfigDict(dict(keys, **{key: f})))
    return sizes(value) == sizes(wanted)
  return value == wanted


def _merge(config, keys: dict, overridden, name: str) -> ml_collections.ConfigDict:
  """`config` with the source's keys; a --config override that disagrees is an error."""
  c = copy.deepcopy(config)
  if 'model_size' in overridden and 'model_size' not in keys:
    raise UserError(f'--config.model_size={c.model_size!r} conflicts with {name}, whose sizes '
                    'match no preset; drop the override (shape keys come from init_from)')
  for key, value in keys.items():
    if key in overridden and not _same(key, c[key], value, keys):
      raise UserError(f'--config.{key}={c[key]!r} conflicts with {name}, which has '
                      f'{key}={value!r}; drop the override (shape keys and the vocabulary come '
                      'from init_from)')
    c[key] = value
  return c


def _first_difference(a: list[str], b: list[str]) -> str:
  i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
  return f'{len(a)} vs {len(b)} tokens, first difference at id {i}: ' + ' vs '.join(
      repr(t[i]) if i < len(t) else 'none' for t in (a, b))


def _vocabulary(config, source: Source, overridden) -> tokenizer_files.Vocabulary:
  """The source's vocabulary, or config.vocab_file when given on the command line and equal."""
  vocab = source.vocabulary
  if 'do_lower_case' in overridden and config.do_lower_case != vocab.do_lower_case:
    raise UserError(f'--config.do_lower_case={config.do_lower_case} conflicts with '
                    f'{source.name}, which has do_lower_case={vocab.do_lower_case}; drop the '
                    'override')
  if 'vocab_file' not in overridden:
    if vocab.file is None and vocab.tokens is None:
      raise tokenizer_files.missing_vocabulary_error(config.init_from)
    return vocab
  # The one loader's checks: a missing or unreadable file is a UserError naming it.
  tokenizer_lib.load_tokenizer(config.vocab_file, do_lower_case=vocab.do_lower_case)
  given = tokenizer_files.Vocabulary(config.vocab_file, None, vocab.do_lower_case)
  if vocab.file is not None or vocab.tokens is not None:
    ours, theirs = given.token_list(), vocab.token_list()
    if ours != theirs:
      raise UserError(f"--config.vocab_file='{config.vocab_file}' differs from the vocabulary "
                      f'of {source.name} ({_first_difference(ours, theirs)}); drop the override '
                      "to use init_from's")
  return given


def write_vocabulary(start: Start):
  """Writes a new run's vocabulary into its workdir (atomically, on process 0; every process
  calls it and waits): train calls it after every check, beside saved_config.write."""
  if start.vocabulary is None:
    return
  target = start.config.vocab_file
  if jax.process_index() == 0:
    paths.make_dirs(paths.parent(target))
    atomic.write_bytes(target, paths.read_bytes(start.readable_vocab_file()))
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    multihost_utils.sync_global_devices(f'init_from_{paths.name(target)}')
  start.vocabulary = None  # config.vocab_file holds it now.


def saved_run_config(config, workdir: str, overridden=()) -> ml_collections.ConfigDict:
  """`config` for a workdir whose run exists: with init_from set, the keys init_from fixed
  come from the saved config (the source may have moved since); unchanged otherwise."""
  if not config.init_from:
    return config
  saved = saved_config.load(workdir)
  c = copy.deepcopy(config)
  for key in SOURCE_KEYS:
    if key not in overridden:
      c[key] = saved[key]
  return c


def prepare(config, workdir: str | None, overridden=()) -> Start:
  """How a run in `workdir` starts; writes nothing (a new run's vocabulary: write_vocabulary).
  `workdir` may be None (--dry_run). `overridden`: keys given as --config.KEY=VALUE."""
  if workdir and checkpoint.has_steps(workdir):
    notes = []
    if config.init_from:
      config = saved_run_config(config, workdir, overridden)
      notes.append(f'config.init_from is ignored: {workdir} already holds checkpoints, so the '
                   'run resumes')
    resolved = config_lib.resolve(config, training=True)
    return Start(saved_config.resumed_vocabulary(resolved, workdir), notes=notes)
  if not config.init_from:
    return Start(config_lib.resolve(config, training=True))
  source = open_source(config, overridden)
  vocab = _vocabulary(config, source, overridden)
  keys = dict(source.keys, do_lower_case=vocab.do_lower_case)
  size = len(vocab.token_list())
  if size != keys['vocab_size']:
    raise UserError(f"{source.name} has vocab_size={keys['vocab_size']} but its vocabulary "
                    f'holds {size} tokens; they must agree')
  extension, content = None, None
  name = tokenizer_files.WORDPIECE_FILE if vocab.wordpiece else tokenizer_files.SPM_FILE
  if config.extend_vocab_file:
    new = extend_vocab.read_new_tokens(config.extend_vocab_file)
    if vocab.wordpiece:
      extension = extend_vocab.extend_wordpiece(vocab.token_list(), vocab.do_lower_case, new,
                                                config.extend_vocab_file)
    else:
      extension = extend_vocab.extend_sentencepiece(paths.resolve(vocab.file), new,
                                                    config.extend_vocab_file)
    keys['vocab_size'], content = extension.new_size, extension.content
  elif vocab.file is None:
    content = lambda: wordpiece.vocab_bytes(vocab.tokens)
  elif source.copy_vocabulary and 'vocab_file' not in overridden:
    content = lambda: paths.read_bytes(vocab.file)
  keys['vocab_file'] = (vocab.file if content is None else
                        saved_config.vocabulary_path(workdir or '.', name))
  c = _merge(config, keys, overridden, source.name)
  _check_layout(c)
  resolved = config_lib.resolve(c, training=True)
  notes = [f'{source.name}: ' + ', '.join(f'{k} {keys[k]}' for k in SIZE_KEYS)
           + f", vocabulary {keys['vocab_file']} ({keys['vocab_size']} tokens"
           + ('' if vocab.do_lower_case or not vocab.wordpiece else ', cased') + ')']
  if extension is not None:
    notes.append(f'extend_vocab_file: {extension.summary(config.extend_vocab_file)}')
  return Start(resolved, source, extension, notes, vocabulary=content)


def _check_layout(c):
  """What the merged config must allow for its source's parts."""
  if c.max_seq_length > c.max_position_embeddings:
    raise UserError(f'config.max_seq_length={c.max_seq_length} exceeds the '
                    f'{c.max_position_embeddings} positions of init_from; lower '
                    '--config.max_seq_length')
  layout = objectives.get(c.objective).layout_for(c)
  if c.init_generator_from and not layout.generator:
    raise UserError(f'objective {c.objective!r} has no generator to take '
                    f"init_generator_from='{c.init_generator_from}'; drop it")
  if c.init_generator_from and layout.cloze_generator:
    raise UserError(f"objective {c.objective!r}'s generator is a two-tower cloze model, which "
                    f"a transformers masked LM (init_generator_from='{c.init_generator_from}') "
                    'cannot start; drop init_generator_from (it starts from random weights)')
  if c.init_generator_from and c.tie == 'all':
    raise UserError("config.tie='all' runs the discriminator's encoder as the generator, so a "
                    "transformers generator cannot start it; drop init_generator_from or pick "
                    "tie='embeddings'")


def _extend_rows(params, extension: extend_vocab.Extension):
  """New vocabulary rows: each word-embedding row the mean of its old pieces' rows; each MLM
  output bias the smallest of theirs (a whole word is a priori no likelier than its rarest
  piece)."""
  def grow(path, x):
    name = getattr(path[-1], 'key', None)
    if (name not in ('word_embeddings', 'output_bias') or x.shape[0] != extension.old_size
        or not extension.pieces):
      return x
    reduce = np.mean if name == 'word_embeddings' else np.min
    rows = np.stack([reduce(x[ids], axis=0) for ids in extension.pieces]).astype(x.dtype)
    return np.concatenate([x, rows])
  return jax.tree_util.tree_map_with_path(grow, params)


def _parts(paths_) -> str:
  return ', '.join(sorted({'/'.join(p[:2]) for p in paths_}))


def initial_state(exp, start: Start) -> tuple[ts.TrainState, list[str]]:
  """The step-0 state of a new run from `start.source`: its parameters (new vocabulary rows
  added), random ones for any part it lacks, a fresh optimizer state; and notes to print."""
  c = exp.config
  source_config = ml_collections.ConfigDict(c.to_dict())
  if start.extension is not None:
    source_config.vocab_size = start.extension.old_size
  loaded, notes = start.source.read_params(source_config)
  if start.extension is not None:
    loaded = _extend_rows(loaded, start.extension)
  loaded = {tuple(k.key for k in path): x
            for path, x in jax.tree_util.tree_leaves_with_path(loaded)}
  broken = [key for key, x in loaded.items() if not np.isfinite(x).all()]
  if broken:  # Refused before the run writes anything (its first save would refuse it later).
    raise UserError(f"{start.source.name}: parameter {'/'.join(broken[0])} holds NaN/inf "
                    f'({len(broken)} parameter(s) do); start from weights that are finite')
  abstract = exp.abstract_state()
  shardings = jax.tree.map(lambda x: x.sharding, abstract)
  fresh = abstract.params
  keys = [tuple(k.key for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(fresh)]
  if any(key not in loaded for key in keys):  # Random weights for what the source lacks.
    fresh = jax.jit(lambda r: model_lib.init_params(exp.model, r, c.max_seq_length,
                                                    c.max_predictions_per_seq),
                    out_shardings=shardings.params)(jax.random.key(c.seed))
  fresh_paths = []

  def take(path, leaf):
    key = tuple(k.key for k in path)
    if key not in loaded:
      fresh_paths.append(key)
      return leaf
    value = loaded.pop(key)
    if value.shape != leaf.shape:
      raise UserError(f"{start.source.name}: parameter {'/'.join(key)} has shape {value.shape}, "
                      f'this config needs {leaf.shape}')
    return jax.make_array_from_callback(value.shape, leaf.sharding, lambda i: value[i])

  params = jax.tree_util.tree_map_with_path(take, fresh)
  if loaded:
    raise UserError(f'{start.source.name} holds parameters this config has no place for '
                    f'({_parts(loaded)}); check objective and tie')
  state = jax.jit(lambda p: ts.TrainState(step=jnp.zeros((), jnp.int32), params=p,
                                          opt_state=exp.tx.init(p)),
                  out_shardings=shardings)(params)
  total = len(jax.tree.leaves(fresh))
  line = f'{total - len(fresh_paths)} of {total} parameter arrays from {start.source.name}'
  if fresh_paths:
    line += f'; randomly initialised: {_parts(fresh_paths)}'
    # Why the generator starts random, where the source could have held it (adversarial's
    # baseline head no source holds; Electric's cloze generator no source can start).
    if (any(p[0] == 'generator' and p[1:2] != ('baseline',) for p in fresh_paths)
        and not objectives.get(c.objective).layout_for(c).cloze_generator):
      line += start.source.generator_hint
  return state, notes + [line]
