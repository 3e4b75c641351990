"""Everything built from a config before any step runs: tokenizer, mesh, model, objective,
optimizer; plus the workdir checks shared by train and evaluate."""
import dataclasses
import os

import jax
import ml_collections
import optax
from etils import epath

from electra_jax import checkpoint
from electra_jax import config as config_lib
from electra_jax import model as model_lib
from electra_jax import objective as objective_lib
from electra_jax import optim
from electra_jax import parallel
from electra_jax import saved_config
from electra_jax import train_state as ts
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError

# Keys that fix parameter shapes: a checkpoint cannot be resumed or evaluated if they change.
SHAPE_KEYS = ('model_size', 'embedding_size', 'hidden_size', 'num_layers', 'num_heads',
              'intermediate_size', 'generator_hidden_size', 'vocab_size',
              'max_position_embeddings', 'type_vocab_size', 'relative_attention_span', 'objective',
              'tie')


@dataclasses.dataclass
class Experiment:
  config: ml_collections.ConfigDict
  tokenizer: object
  mesh: jax.sharding.Mesh
  model: model_lib.Electra
  objective: objective_lib.ElectraObjective
  tx: optax.GradientTransformation
  schedule: optax.Schedule

  @classmethod
  def create(cls, config, devices=None) -> 'Experiment':
    c = config_lib.resolve(config)
    tokenizer = tokenizer_lib.for_config(c)
    mesh = parallel.make_mesh(devices, c.fsdp_axis_size)
    parallel.check_batch_divides(c.train_batch_size, mesh, 'train_batch_size',
                                 c.grad_accum_steps)
    parallel.check_batch_divides(c.eval_batch_size, mesh, 'eval_batch_size')
    model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
    objective = objective_lib.ElectraObjective.from_config(model, c, tokenizer.special_ids,
                                                           tokenizer.mask_id)
    tx, schedule = optim.make_optimizer(c)
    return cls(c, tokenizer, mesh, model, objective, tx, schedule)

  def init_state(self) -> ts.TrainState:
    c = self.config
    return ts.init_state(self.mesh, jax.random.key(c.seed), self.model, self.tx,
                         c.max_seq_length, c.max_predictions_per_seq)

  def abstract_state(self) -> ts.TrainState:
    c = self.config
    return ts.abstract_state(self.mesh, self.model, self.tx, c.max_seq_length,
                             c.max_predictions_per_seq)


def check_saved_config_matches(workdir: str, c) -> list[str]:
  """Refuses a workdir trained with other parameter shapes; returns the other changed keys."""
  if not saved_config.exists(workdir):
    return []
  saved, current = saved_config.load(workdir).to_dict(), c.to_dict()
  changed = sorted(k for k in current if saved.get(k) != current[k])
  shape_changes = [k for k in changed if k in SHAPE_KEYS]
  if shape_changes:
    diffs = ', '.join(f'{k}: {saved.get(k)!r} -> {current[k]!r}' for k in shape_changes)
    raise UserError(f"workdir '{workdir}' holds a model with different shapes ({diffs}); "
                    'use a new --workdir or the saved config')
  return changed


# Keys that change only logging, evaluation, checkpoint bookkeeping or memory use, never the
# trained weights: they may differ on resume without being listed in allow_config_change. The
# init_* keys only choose a new run's starting weights; a resumed run ignores them.
HARMLESS_KEYS = ('log_every_steps', 'eval_every_steps', 'eval_batch_size', 'num_eval_steps',
                 'eval_files', 'save_checkpoints_steps', 'keep_checkpoint_max', 'progress_bar',
                 'max_consecutive_nonfinite', 'allow_config_change', 'remat', 'init_from',
                 'init_generator_from', 'extend_vocab_file')


def has_checkpoints(workdir: str) -> bool:
  """True if the workdir holds a checkpoint step (so a run there resumes)."""
  ckpt_dir = epath.Path(workdir) / 'checkpoints'
  return ckpt_dir.is_dir() and any(p.name.isdigit() for p in ckpt_dir.iterdir())


def check_resume_config(workdir: str, c) -> list[str]:
  """Refuses to resume with a config other than the saved one, except for harmless keys and
  those listed in config.allow_config_change; returns the changed keys."""
  if not has_checkpoints(workdir):
    return []  # Nothing to resume: the new config simply replaces the saved one.
  changed = check_saved_config_matches(workdir, c)
  allowed = set(HARMLESS_KEYS) | set(config_lib.split_keys(c.allow_config_change))
  refused = [k for k in changed if k not in allowed]
  if refused:
    saved, current = saved_config.load(workdir).to_dict(), c.to_dict()
    diffs = ', '.join(f'{k}: {saved.get(k)!r} -> {current[k]!r}' for k in refused)
    listed = ','.join(config_lib.split_keys(c.allow_config_change) + refused)
    raise UserError(f"workdir '{workdir}' was trained with another config ({diffs}); re-run "
                    'with the saved values (WORKDIR/config.json), use a new --workdir, or accept '
                    f'the change with --config.allow_config_change={listed}')
  return changed


def prepare_workdir(workdir: str) -> str:
  workdir = os.path.abspath(os.path.expanduser(workdir))
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UserError(f"--workdir '{workdir}' is a file; pass a directory path")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise UserError(f"cannot create --workdir '{workdir}': {e.strerror}; "
                    'pick a writable location') from e
  if not os.access(workdir, os.W_OK):
    raise UserError(f"--workdir '{workdir}' is not writable; pick a writable location")
  return workdir


def open_checkpoints(workdir: str):
  return checkpoint.open_for_reading(workdir)
