"""Everything built from a config before any step runs: tokenizer, mesh, model, objective,
optimizer; plus the workdir checks shared by train and evaluate."""
import dataclasses
import math

import jax
import ml_collections
import optax

from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import objectives
from electra_jax.objectives import base as objective_base
from electra_jax import optim
from electra_jax import parallel
from electra_jax import paths
from electra_jax import saved_config
from electra_jax import train_state as ts
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError

# Keys that fix parameter shapes: a checkpoint cannot be resumed or evaluated if they change.
SHAPE_KEYS = ('model_size', 'embedding_size', 'hidden_size', 'num_layers', 'num_heads',
              'intermediate_size', 'generator_hidden_size', 'generator_layers', 'vocab_size',
              'max_position_embeddings', 'type_vocab_size', 'relative_attention_span', 'objective',
              'tie', 'uniform_generator')


@dataclasses.dataclass
class Experiment:
  config: ml_collections.ConfigDict
  tokenizer: object
  mesh: jax.sharding.Mesh
  model: model_lib.Electra
  objective: objective_base.Objective
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  # abstract_state()'s result: tracing the model's init takes about a second at Large size and
  # the run, the dry-run plan and the compiled step each need it.
  _abstract_state: ts.TrainState | None = dataclasses.field(default=None, init=False,
                                                            repr=False)

  @classmethod
  def create(cls, config, devices=None, read_vocab: bool = True,
             vocab_file: str | None = None, training: bool = True) -> 'Experiment':
    """`devices`: the mesh's devices (default all; a TPU topology's to compile ahead of time).
    read_vocab=False builds the same program without the vocabulary file (tokenizer None,
    special ids of the sentencepiece layout): any vocab_size, for synthetic data and plans.
    vocab_file: where to read config.vocab_file's content while that is not written yet
    (init_from.Start.readable_vocab_file). training=False (evaluate): the train and eval batches
    need not divide these devices (eval_loop fills its batches up), nor the run's
    fsdp_axis_size (the mesh's fsdp axis is the largest size dividing both: a run trained on 8
    devices evaluates on 2 or 3)."""
    c = config_lib.resolve(config)
    tokenizer = (tokenizer_lib.load_tokenizer(vocab_file or c.vocab_file, c.vocab_size,
                                              c.do_lower_case) if read_vocab else None)
    fsdp_axis_size = c.fsdp_axis_size if training else math.gcd(
        c.fsdp_axis_size, len(devices) if devices is not None else jax.device_count())
    mesh = parallel.make_mesh(devices, fsdp_axis_size)
    if training:  # Evaluate fills its batches up to a multiple of the devices (eval_loop).
      parallel.check_batch_divides(c.train_batch_size, mesh, 'config.train_batch_size',
                                   c.grad_accum_steps)
      parallel.check_batch_divides(c.eval_batch_size, mesh, 'config.eval_batch_size')
    model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
    if tokenizer is None:  # The sentencepiece layout's ids; words of a stand-in vocabulary.
      layout = tokenizer_lib.SentencePieceTokenizer
      objective = objectives.build(model, c, layout.special_ids, layout.mask_id)
    else:
      objective = objectives.build_for_vocabulary(model, c, tokenizer)
    tx, schedule = optim.make_optimizer(c)
    return cls(c, tokenizer, mesh, model, objective, tx, schedule)

  def init_state(self) -> ts.TrainState:
    c = self.config
    return ts.init_state(self.mesh, jax.random.key(c.seed), self.model, self.tx,
                         c.max_seq_length, c.max_predictions_per_seq, self.state_shardings())

  def abstract_state(self) -> ts.TrainState:
    if self._abstract_state is None:
      c = self.config
      self._abstract_state = ts.abstract_state(self.mesh, self.model, self.tx, c.max_seq_length,
                                               c.max_predictions_per_seq)
    return self._abstract_state

  def state_shardings(self) -> ts.TrainState:
    return jax.tree.map(lambda x: x.sharding, self.abstract_state())

  def train_step(self):
    """The train step of a run (not jitted): grad_accum_steps micro-batches."""
    c = self.config
    return ts.make_train_step(self.objective, self.tx, c.grad_accum_steps, self.mesh)

  def jit_train_step(self):
    """The train step jitted over the mesh, state sharded as abstract_state() and donated."""
    return ts.jit_train_step(self.train_step(), self.mesh, self.state_shardings())

  def jit_train_steps(self):
    """What the training loop calls: config.steps_per_execution steps a call
    (train_state.make_train_steps), jitted as jit_train_step."""
    return ts.jit_train_steps(ts.make_train_steps(self.train_step()), self.mesh,
                              self.state_shardings())


def check_saved_config_matches(
    workdir: str, c, advice: str = 'use a new --workdir or the saved config') -> list[str]:
  """Refuses a workdir trained with other parameter shapes (`advice`: what to do instead);
  returns the other changed keys."""
  if not saved_config.exists(workdir):
    return []
  saved, current = saved_config.load(workdir).to_dict(), c.to_dict()
  changed = sorted(k for k in current if saved.get(k) != current[k])
  shape_changes = [k for k in changed if k in SHAPE_KEYS]
  if shape_changes:
    diffs = ', '.join(f'{k}: {saved.get(k)!r} -> {current[k]!r}' for k in shape_changes)
    raise UserError(f"workdir '{workdir}' holds a model with different shapes ({diffs}); "
                    f'{advice}')
  return changed


# Keys that change only logging, evaluation, checkpoint bookkeeping, memory use, how many steps
# one call runs, which kernel computes the same values or which processes read the same
# batches, never what is trained (the weights at most to float rounding): they may differ on
# resume without being listed in allow_config_change. STARTING_KEYS only choose a new run's
# starting weights: a resumed run ignores them, but a finished run's weights depend on them.
STARTING_KEYS = ('init_from', 'init_generator_from', 'extend_vocab_file')
HARMLESS_KEYS = ('log_every_steps', 'eval_every_steps', 'eval_batch_size', 'num_eval_steps',
                 'eval_files', 'tfds_eval_split', 'save_checkpoints_steps', 'keep_checkpoint_max',
                 'progress_bar', 'max_consecutive_nonfinite', 'allow_config_change', 'remat',
                 'steps_per_execution', 'attention_implementation', 'num_data_workers',
                 'fsdp_axis_size', *STARTING_KEYS)


def weight_changing_differences(saved: dict, c) -> list[str]:
  """Keys whose value in resolved config `c` differs from `saved` (a run's config.json) and may
  change the trained weights: neither HARMLESS_KEYS (but STARTING_KEYS: a run started from
  other weights is no run from scratch) nor keys c's objective never reads. For reusing a
  finished run's weights; resuming also needs the same optimizer state, so it checks every
  key."""
  skip = ((set(HARMLESS_KEYS) - set(STARTING_KEYS))
          | set(objectives.get(c.objective).unread_keys(c)))
  planned = c.to_dict()
  saved_vocab = saved.get('vocab_file')
  if saved_vocab and paths.same_file(paths.resolve(saved_vocab),
                                     paths.resolve(planned['vocab_file'])):
    skip.add('vocab_file')  # The run's kept copy (saved_config) of the planned vocabulary.
  return sorted(k for k in planned if saved.get(k) != planned[k] and k not in skip)


def check_resume_config(workdir: str, c) -> list[str]:
  """Refuses to resume with a config other than the saved one, except for harmless keys,
  those listed in config.allow_config_change and derived keys following their sources;
  returns the changed keys."""
  if not checkpoint.has_steps(workdir):
    return []  # Nothing to resume: the new config simply replaces the saved one.
  changed = check_saved_config_matches(workdir, c)
  if not changed:
    return []
  saved_c = saved_config.load(workdir)
  saved, current = saved_c.to_dict(), c.to_dict()
  was = optim.chain_steps(saved_c)
  for key, _, adding, not_adding in optim.CHAIN_STEPS:
    if key in changed and was[key] != optim.chain_steps(c)[key]:
      raise UserError(f"workdir '{workdir}': {key} {saved[key]!r} -> {current[key]!r} "
                      f"{'removes' if was[key] else 'adds'} a step of the optimizer, so its "
                      f'saved state cannot be restored; resume with {key} '
                      f'{adding if was[key] else not_adding}, or use a new --workdir')
  allowed = (set(HARMLESS_KEYS) | set(config_lib.split_keys(c.allow_config_change))
             | _derived_in_both(saved, current))
  refused = [k for k in changed if k not in allowed]
  if refused:
    diffs = ', '.join(f'{k}: {saved.get(k)!r} -> {current[k]!r}' for k in refused)
    listed = ','.join(config_lib.split_keys(c.allow_config_change) + refused)
    raise UserError(f"workdir '{workdir}' was trained with another config ({diffs}); re-run "
                    'with the saved values (WORKDIR/config.json), use a new --workdir, or accept '
                    f'the change with --config.allow_config_change={listed}')
  return changed


def _derived_in_both(saved: dict, current: dict) -> set[str]:
  """Derived keys whose values in both configs one setting of the user's explains: such a key
  changes only with its sources, which are allowed or refused themselves. BERT's length
  schedule: max_predictions_per_seq left to its formula follows max_seq_length. Continuing a
  short run: num_warmup_steps, cut to num_train_steps, follows num_train_steps."""
  follows = set()
  try:
    if all(run['max_predictions_per_seq'] == config_lib.derived_max_predictions(run)
           for run in (saved, current)):
      follows.add('max_predictions_per_seq')
    # A warmup w the resolved config cuts to min(w, num_train_steps) in both runs.
    warmup = current['num_warmup_steps']
    if saved['num_warmup_steps'] == saved['num_train_steps'] and (
        warmup >= saved['num_train_steps'] or warmup == current['num_train_steps']):
      follows.add('num_warmup_steps')
  except (KeyError, TypeError):  # A saved config without the keys: nothing is derived.
    pass
  return follows


def prepare_workdir(workdir: str) -> str:
  """The workdir's canonical path (absolute, or a URL), created and proven writable."""
  return paths.check_writable_dir(workdir, '--workdir')
