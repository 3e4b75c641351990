"""One training run for tests/test_scale.py, in its own process (device count fixed at start).

  python tests/scale_worker.py REPO_ROOT SPEC_JSON

SPEC keys: fsdp, accum (grad_accum_steps), steps, save (checkpoint dir: save after step
`save_step`), restore (checkpoint dir: afterwards restore `save_step` onto this topology and run
the following steps again), process ([coordinator, num_processes, process_id] or null),
interleave (the processes' devices alternate along the mesh, as jax.make_mesh lays out the
hosts of a TPU slice). Prints
one JSON line: per-step losses, and fingerprints (per-leaf sum and sum of squares) of states.
"""
import json
import sys

sys.path.insert(0, sys.argv[1])
spec = json.loads(sys.argv[2])
# pylint: disable=wrong-import-position
from electra_jax import distributed

if spec.get('process'):
  coordinator, num_processes, process_id = spec['process']
  distributed.initialize(coordinator, num_processes, process_id)

import jax
import jax.numpy as jnp
import numpy as np

from electra_jax import checkpoint, config as config_lib, model as model_lib
from electra_jax import objectives, optim, parallel, train_state as ts
from electra_jax.objectives import metrics as objective_metrics
from tests.conftest import tiny_config
from tests.test_model_objective import toy_batch

c = config_lib.resolve(tiny_config(train_batch_size=16, num_layers=1, dropout_rate=0.1,
                                   attention_dropout_rate=0.1, grad_accum_steps=spec['accum'],
                                   fsdp_axis_size=spec['fsdp']))
model = model_lib.Electra(model_lib.ModelConfig.from_config(c))
objective = objectives.build(model, c, (0, 2, 3, 4), 4)
tx, _ = optim.make_optimizer(c)
devices = jax.devices()
if spec.get('interleave'):
  by_process = [[d for d in devices if d.process_index == p] for p in range(jax.process_count())]
  devices = [d for same_place in zip(*by_process) for d in same_place]
mesh = parallel.make_mesh(devices, fsdp_axis_size=c.fsdp_axis_size)
parallel.check_batch_divides(c.train_batch_size, mesh, 'config.train_batch_size',
                             c.grad_accum_steps)
abstract = ts.abstract_state(mesh, model, tx, c.max_seq_length, c.max_predictions_per_seq)
sharding = jax.tree.map(lambda x: x.sharding, abstract)
step_fn = ts.jit_train_step(ts.make_train_step(objective, tx, c.grad_accum_steps, mesh),
                            mesh, sharding)
fingerprint_fn = jax.jit(
    lambda t: [jnp.stack([jnp.sum(x), jnp.sum(x * x)]) for x in jax.tree.leaves(t)],
    out_shardings=parallel.replicated(mesh))


def fingerprint(state):
  return np.concatenate(jax.device_get(fingerprint_fn(state.params))).tolist()


def batch_for(step):
  """This process's rows of the global toy batch of `step`."""
  rows = parallel.process_rows(mesh, c.train_batch_size)
  local = {k: np.asarray(v)[rows] for k, v in toy_batch(c, seed=step).items()}
  return parallel.global_batch(local, mesh)


def train(state, first_step, losses, save=None):
  for step in range(first_step, spec['steps']):
    state, sums = step_fn(state, batch_for(step), base_rng)
    losses[step + 1] = objective_metrics.summarize(jax.device_get(sums), 1.0, 50.0)
    if save and step + 1 == spec['save_step']:
      ckpt = checkpoint.Checkpointer(save)
      ckpt.save(step + 1, state, force=True)
      ckpt.close()
      out['saved_fingerprint'] = fingerprint(state)
  return state


base_rng = jax.random.key(1)
out = dict(devices=jax.device_count(), processes=jax.process_count(),
           mesh=dict(mesh.shape), mesh_processes=[d.process_index for d in mesh.devices.flat],
           losses={})
state = ts.init_state(mesh, jax.random.key(0), model, tx, c.max_seq_length,
                      c.max_predictions_per_seq)
state = train(state, 0, out['losses'], spec.get('save'))
out['fingerprint'] = fingerprint(state)
if spec.get('restore'):
  # The same steps resumed from a checkpoint written by another topology.
  ckpt = checkpoint.Checkpointer(spec['restore'], read_only=True)
  state = ckpt.restore(spec['save_step'], abstract)
  ckpt.close()
  out['restored_sharding_ok'] = all(
      x.sharding == s for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(sharding)))
  out['restored_fingerprint'] = fingerprint(state)
  out['restored_losses'] = {}
  state = train(state, spec['save_step'], out['restored_losses'])
  out['restored_final_fingerprint'] = fingerprint(state)
print(json.dumps(out))
