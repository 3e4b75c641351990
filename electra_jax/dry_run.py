"""`train --dry_run`: the plan of a run (mesh, batch split, memory per device, FLOPs per step)
from shapes alone, so a pod or cluster plan can be checked on a laptop.

Nothing is allocated: the state's shapes come from jax.eval_shape and its per-device size from
each leaf's sharding. To plan for N devices on a CPU, force them:
JAX_NUM_CPU_DEVICES=N python -m electra_jax.train ... --dry_run
"""
import math

import jax

from electra_jax import flops


def _bytes_per_device(abstract_tree) -> int:
  """Largest per-device footprint of a tree of sharded ShapeDtypeStructs."""
  total = 0
  for leaf in jax.tree.leaves(abstract_tree):
    shard = leaf.sharding.shard_shape(leaf.shape)
    total += math.prod(shard) * leaf.dtype.itemsize
  return total


def plan(exp) -> dict:
  """The dry-run report of an experiment_lib.Experiment, as a flat dict."""
  c, mesh = exp.config, exp.mesh
  state = exp.abstract_state()
  device = mesh.devices.flat[0]
  # Processes of the mesh's devices: this run's, or the hosts of a TPU slice planned for.
  num_devices = mesh.devices.size
  num_processes = len({d.process_index for d in mesh.devices.flat})
  global_batch = c.train_batch_size
  step_flops = flops.model_flops_per_step(c)
  return dict(
      dry_run=True,
      mesh_shape=dict(mesh.shape),
      mesh_axes=list(mesh.axis_names),
      device_kind=device.device_kind,
      platform=device.platform,
      num_devices=num_devices,
      num_processes=num_processes,
      global_batch=global_batch,
      per_host_batch=global_batch // num_processes,
      per_device_batch=global_batch // num_devices,
      grad_accum_steps=c.grad_accum_steps,
      per_device_micro_batch=global_batch // num_devices // c.grad_accum_steps,
      seq_length=c.max_seq_length,
      num_params=sum(math.prod(x.shape) for x in jax.tree.leaves(state.params)),
      param_bytes_per_device=_bytes_per_device(state.params),
      optimizer_bytes_per_device=_bytes_per_device(state.opt_state),
      model_flops_per_step=step_flops,
      model_flops_per_step_per_device=step_flops / num_devices,
  )


def describe(p: dict) -> str:
  """Human-readable lines of a plan()."""
  gib = lambda b: f'{b / 2**30:.2f} GiB'
  mesh = ' x '.join(f'{a}={n}' for a, n in p['mesh_shape'].items())
  return '\n'.join([
      f"mesh        {mesh} over {p['num_devices']} {p['device_kind']} device(s) in "
      f"{p['num_processes']} process(es)",
      f"batch       global {p['global_batch']} | per host {p['per_host_batch']} | per device "
      f"{p['per_device_batch']} | per device micro-batch {p['per_device_micro_batch']} "
      f"(grad_accum_steps {p['grad_accum_steps']}) x {p['seq_length']} tokens",
      f"parameters  {p['num_params'] / 1e6:.1f}M (G+D): {gib(p['param_bytes_per_device'])} "
      f"per device; optimizer state {gib(p['optimizer_bytes_per_device'])} per device",
      f"compute     {flop(p['model_flops_per_step'])} per step (model FLOPs, fwd+bwd), "
      f"{flop(p['model_flops_per_step_per_device'])} per device",
  ])


def flop(count: float) -> str:
  """A FLOP count to 3 digits in the smallest unit that keeps it under 1000: the demo's
  16.5 GFLOP a step and Large's 1.2 PFLOP read alike."""
  units = (('FLOP', 1), ('kFLOP', 1e3), ('MFLOP', 1e6), ('GFLOP', 1e9), ('TFLOP', 1e12),
           ('PFLOP', 1e15), ('EFLOP', 1e18))
  for unit, scale in units:
    value = float(f'{count / scale:.3g}')
    if value < 1000 or unit == units[-1][0]:
      return f'{value:g} {unit}'
