"""Train state and the jitted train / eval steps (pure functions; the loop does the I/O)."""
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import optax

from electra_jax import model as model_lib
from electra_jax import nonfinite
from electra_jax import parallel


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data position; randomness derives from `step`."""
  step: jax.Array
  params: Any
  opt_state: Any


def create_train_state(rng, model: model_lib.Electra, tx: optax.GradientTransformation,
                       max_seq_length: int, max_predictions: int) -> TrainState:
  params = model_lib.init_params(model, rng, max_seq_length, max_predictions)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def make_train_step(objective: Callable, tx: optax.GradientTransformation,
                    poison_steps: tuple[int, ...] = ()):
  """(state, batch, base_rng) -> (state, metric sums); step k's randomness is fold_in(rng, k).

  A non-finite step is skipped by tx (optax.apply_if_finite): its sums are zeroed and
  `consecutive_nonfinite` reports the run of skips. poison_steps: test hook, steps (1-based,
  as logged) whose loss is made NaN.
  """

  def train_step(state: TrainState, batch, base_rng):
    rng = jax.random.fold_in(base_rng, state.step)
    loss_fn = nonfinite.poisoned(objective, poison_steps, state.step + 1)
    (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    sums = dict(sums, grad_norm_sum=optax.tree.norm(grads), num_steps=jnp.float32(1))
    sums = nonfinite.drop_skipped(sums, opt_state)
    sums['consecutive_nonfinite'] = nonfinite.consecutive_skipped(opt_state)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), sums

  return train_step


def make_eval_step(objective: Callable):
  """(params, batch, rng) -> metric sums, without dropout."""

  def eval_step(params, batch, rng):
    _, sums = objective(params, batch, rng, deterministic=True)
    return sums

  return eval_step


def jit_train_step(train_step, mesh):
  """Data-parallel jit: state replicated and donated, batch sharded on 'data'."""
  rep, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  return jax.jit(train_step, in_shardings=(rep, data, rep), out_shardings=(rep, rep),
                 donate_argnums=0)


def jit_eval_step(eval_step, mesh):
  rep, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  return jax.jit(eval_step, in_shardings=(rep, data, rep), out_shardings=rep)


def init_state(mesh, rng, model, tx, max_seq_length, max_predictions) -> TrainState:
  """Initialises the state directly in its (replicated) sharding."""
  create = lambda r: create_train_state(r, model, tx, max_seq_length, max_predictions)
  return jax.jit(create, out_shardings=parallel.replicated(mesh))(rng)


def abstract_state(mesh, model, tx, max_seq_length, max_predictions) -> TrainState:
  """Shapes, dtypes and shardings of the state, without allocating it (for restoring)."""
  create = lambda r: create_train_state(r, model, tx, max_seq_length, max_predictions)
  shapes = jax.eval_shape(create, jax.random.key(0))
  rep = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), shapes)
