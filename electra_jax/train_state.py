"""Train state and the jitted train / eval steps (pure functions; the loop does the I/O)."""
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np
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
                    grad_accum_steps: int = 1, mesh=None):
  """(state, batch, base_rng) -> (state, metric sums); step k's randomness is fold_in(rng, k).

  `objective`: (params, batch, rng, ...) -> (loss, metric sums), with `at_step(step)` (itself
  for optimizer step `step`) and `prepare_params(params, step)` (the params that step starts
  from): objectives.base.Objective, or fine-tuning's steps.TaskObjective.

  With grad_accum_steps = k the batch runs as k micro-batches (a lax.scan) whose gradients sum
  to the whole batch's: micro-batch i holds rows i, i+k, i+2k, ... (so every device keeps its
  rows), each row keeps its global index for its randomness, and losses are normalised by the
  whole batch's counts. Metric sums add up; only disc_auc counts pairs within micro-batches.
  On a mesh with an 'fsdp' axis the parameters, sharded at rest, are gathered for the forward
  and backward pass; their gradients flow back into the sharded optimizer update.

  A non-finite step is skipped by tx (optim.skip_if_nonfinite): its sums are zeroed and
  `consecutive_nonfinite` reports the run of skips.
  """
  fsdp = mesh is not None and parallel.FSDP_AXIS in mesh.axis_names

  def grads_and_sums(params, batch, rng, loss_fn):
    if grad_accum_steps == 1:
      (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng)
      return grads, sums
    denominators = objective.loss_denominators(batch, rng)
    batch_size = batch['input_ids'].shape[0]
    k = grad_accum_steps
    # [B, ...] -> [k, B/k, ...] with micro-batch i = rows i, i+k, ...; global row ids alike.
    split = lambda x: jnp.swapaxes(x.reshape((batch_size // k, k) + x.shape[1:]), 0, 1)
    micro_batches = jax.tree.map(split, dict(batch))
    example_ids = split(jnp.arange(batch_size))

    def micro_grads(micro_batch, ids):
      micro_loss = lambda p: loss_fn(p, micro_batch, rng, example_ids=ids,
                                     denominators=denominators)
      (_, sums), grads = jax.value_and_grad(micro_loss, has_aux=True)(params)
      return grads, sums

    def micro_step(carry, inputs):
      return jax.tree.map(jnp.add, carry, micro_grads(*inputs)), None

    first = jax.tree.map(lambda x: x[0], (micro_batches, example_ids))
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                         jax.eval_shape(micro_grads, *first))
    (grads, sums), _ = jax.lax.scan(micro_step, zeros, (micro_batches, example_ids))
    return grads, sums

  def train_step(state: TrainState, batch, base_rng):
    rng = jax.random.fold_in(base_rng, state.step)
    step_objective = objective.at_step(state.step)
    start_params = objective.prepare_params(state.params, state.step)
    params = start_params
    if fsdp:
      params = jax.lax.with_sharding_constraint(params, parallel.replicated(mesh))
    grads, sums = grads_and_sums(params, batch, rng, step_objective)
    extra = ({'step': state.step} if isinstance(tx, optax.GradientTransformationExtraArgs)
             else {})
    updates, opt_state = tx.update(grads, state.opt_state, start_params, **extra)
    params = optax.apply_updates(start_params, updates)
    sums = dict(sums, grad_norm_sum=optax.tree.norm(grads), num_steps=jnp.float32(1))
    sums = nonfinite.drop_skipped(sums, opt_state)
    sums['consecutive_nonfinite'] = nonfinite.consecutive_skipped(opt_state)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), sums

  return train_step


def make_train_steps(train_step):
  """(state, window, batches, base_rng) -> (state, window, consecutive_nonfinite): the steps
  of `batches`' leading axis in one program (a lax.scan over `train_step`).

  Each step's metric sums are added into `window` (the loop's running sums since the last
  log) as the loop did between steps; `consecutive_nonfinite` holds each step's run of skips
  (one per step, not the call's longest: the stop names the step that reached its limit, as
  at one step a call; a run that spans calls continues, the count lives in the optimizer
  state). The steps compute what one call per step computes, bit for bit on a CPU
  (tests/test_train_cli.py), with one dispatch, one CUDA-graph update and one host round trip
  per call instead of per step (config.steps_per_execution).
  """

  def train_steps(state: TrainState, window: dict, batches, base_rng):
    def one_step(carry, batch):
      state, window = carry
      state, sums = train_step(state, batch, base_rng)
      consecutive = sums.pop('consecutive_nonfinite')
      return (state, jax.tree.map(jnp.add, window, sums)), consecutive

    (state, window), consecutive = jax.lax.scan(one_step, (state, window), batches)
    return state, window, consecutive

  return train_steps


def window_zeros(train_step, abstract_state: TrainState, batches, base_rng) -> dict:
  """Zeroed host sums of what `train_step` adds into the window (structure and dtypes), for
  make_train_steps' `window` at the start of a log window."""
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), batches)
  _, sums = jax.eval_shape(train_step, abstract_state, batch, base_rng)
  sums.pop('consecutive_nonfinite')
  return {k: np.zeros(s.shape, s.dtype) for k, s in sums.items()}


def make_eval_step(objective: Callable):
  """(params, batch, rng) -> metric sums, without dropout."""

  def eval_step(params, batch, rng):
    _, sums = objective(params, batch, rng, deterministic=True)
    return sums

  return eval_step


def jit_train_step(train_step, mesh, state_sharding=None):
  """One global program: state in `state_sharding` (default replicated) and donated, batch
  sharded over the mesh's batch axes."""
  rep, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  state_sharding = rep if state_sharding is None else state_sharding
  return jax.jit(train_step, in_shardings=(state_sharding, data, rep),
                 out_shardings=(state_sharding, rep), donate_argnums=0)


def jit_train_steps(train_steps, mesh, state_sharding=None):
  """make_train_steps' program: as jit_train_step, the window replicated and donated too (its
  buffers then keep their addresses from call to call), the batches' rows sharded over the
  mesh after their leading steps axis."""
  rep = parallel.replicated(mesh)
  data = parallel.batch_sharding(mesh, steps_axis=True)
  state_sharding = rep if state_sharding is None else state_sharding
  return jax.jit(train_steps, in_shardings=(state_sharding, rep, data, rep),
                 out_shardings=(state_sharding, rep, rep), donate_argnums=(0, 1))


def jit_eval_step(eval_step, mesh, params_sharding=None):
  rep, data = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  params_sharding = rep if params_sharding is None else params_sharding
  return jax.jit(eval_step, in_shardings=(params_sharding, data, rep), out_shardings=rep)


def state_shapes(model, tx, max_seq_length, max_predictions) -> TrainState:
  """Shapes and dtypes of the state (jax.eval_shape: nothing is allocated)."""
  create = lambda r: create_train_state(r, model, tx, max_seq_length, max_predictions)
  return jax.eval_shape(create, jax.random.key(0))


def state_sharding(mesh, shapes: TrainState) -> TrainState:
  """Per-leaf shardings: params and optimizer state by the FSDP rule, step replicated."""
  return parallel.tree_shardings(mesh, shapes)


def init_state(mesh, rng, model, tx, max_seq_length, max_predictions,
               shardings: TrainState | None = None) -> TrainState:
  """Initialises the state directly in its sharding (never whole on one device).

  `shardings`: the state's, where the caller has them (abstract_state's); else computed.
  """
  create = lambda r: create_train_state(r, model, tx, max_seq_length, max_predictions)
  if shardings is None:
    shardings = state_sharding(mesh, state_shapes(model, tx, max_seq_length, max_predictions))
  return jax.jit(create, out_shardings=shardings)(rng)


def abstract_state(mesh, model, tx, max_seq_length, max_predictions) -> TrainState:
  """Shapes, dtypes and shardings of the state, without allocating it (for restoring)."""
  shapes = state_shapes(model, tx, max_seq_length, max_predictions)
  shardings = state_sharding(mesh, shapes)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      shapes, shardings)
