r"""Pretrain ELECTRA.

  python -m electra_jax.train --config=configs/demo.py --workdir=/tmp/electra_demo \
      [--config.num_train_steps=200 --config.train_batch_size=16 ...]

Re-running the same command on the same workdir resumes from the latest checkpoint. Writes
WORKDIR/{config.json, metrics.jsonl, eval_metrics.jsonl, checkpoints/, tensorboard/}; the
last stdout line is a JSON summary of the run.
"""
import shlex
import sys
import time

import jax
import numpy as np
import tqdm
from absl import flags
from ml_collections import config_flags

from electra_jax import checkpoint
from electra_jax import chips
from electra_jax import cli
from electra_jax import compile_ahead
from electra_jax import config as config_lib
from electra_jax import cpu_devices
from electra_jax import device_memory
from electra_jax import distributed
from electra_jax import dry_run
from electra_jax import eval_loop
from electra_jax import experiment as experiment_lib
from electra_jax import flops as flops_lib
from electra_jax import init_from
from electra_jax import metric_writer
from electra_jax import nonfinite
from electra_jax import parallel
from electra_jax import paths
from electra_jax.objectives import metrics as objective_metrics
from electra_jax import saved_config
from electra_jax import step_trace
from electra_jax import stop_request
from electra_jax import tpu_plan
from electra_jax import train_state as ts
from electra_jax.data import pipeline
from electra_jax.data import prefetch
from electra_jax.data import sources

FLAGS = flags.FLAGS


def _loop_state(window, data_position: int, data_size: dict, data_order: int) -> dict:
  """What a checkpoint keeps of the loop: the metric sums not yet logged, exactly (values with
  dtypes), the data position (examples of the global stream consumed; pipeline.py), which
  any process or device count resumes from, the size of the data it counts in and the
  version of the order it counts in (pipeline.ORDER_VERSION)."""
  if window is not None:
    window = {k: [np.asarray(v).item(), str(np.asarray(v).dtype)]
              for k, v in jax.device_get(window).items()}
  return dict(window=window, data_position=int(data_position), data=data_size,
              data_order=data_order)


def _data_order(resumed: bool, loop_state) -> int:
  """The data order a run reads: a new run today's, a resumed one its own (checkpoints from
  before orders had versions read version 1)."""
  if not resumed:
    return pipeline.ORDER_VERSION
  return int((loop_state or {}).get('data_order', 1))


def _data_size(examples) -> dict:
  """What a checkpoint keeps of the data's size (read once: num_tokens of examples packed at
  start-up is a pass over all of them)."""
  return dict(examples=len(examples), tokens=int(examples.num_tokens))


def _changed_data_note(loop_state, data_size: dict) -> str | None:
  """A note when the training data is not the data the checkpoint's position counts in (files
  added to the glob, a corpus re-prepared): the run goes on, but not where it left off."""
  saved = (loop_state or {}).get('data')
  if saved is None or saved == data_size:
    return None
  return (f"the training data changed since the checkpoint: {saved['examples']:,} examples "
          f"({saved['tokens']:,} tokens) then, {data_size['examples']:,} "
          f"({data_size['tokens']:,}) now; "
          f"the run reads on from position {loop_state['data_position']:,} of the new data's "
          'order, not where it left off in the old')


def _data_position(loop_state, step: int, c) -> int:
  """Examples consumed at a restored step (checkpoints older than data_position held only
  per-process iterator states: one batch of train_batch_size per step)."""
  if loop_state and loop_state.get('data_position') is not None:
    return int(loop_state['data_position'])
  return step * c.train_batch_size


def _window_from_json(loop_state) -> dict | None:
  if not loop_state or loop_state.get('window') is None:
    return None
  return {k: np.asarray(v, dtype) for k, (v, dtype) in loop_state['window'].items()}


def train_and_evaluate(config, workdir: str, stop_after_steps: int | None = None,
                       overridden=(), profile_dir: str | None = None,
                       profile_steps: tuple[int, int] | None = None) -> dict:
  """Trains (or resumes) to config.num_train_steps; returns the run summary.

  stop_after_steps=0 saves the starting state as a checkpoint (e.g. init_from's step 0) and
  stops. overridden: the keys given as --config.KEY=VALUE (init_from checks them against its
  source). profile_dir, profile_steps: trace those steps with jax.profiler (step_trace.py).
  """
  on_error = []  # Cleanups for a run that fails (e.g. finish pending saves of good states).
  # SIGTERM / Ctrl-C ask the loop to stop while it runs; an in-process caller (a notebook) gets
  # its own handlers back when this returns.
  stop = stop_request.StopRequest()
  # A run refused at start-up (a bad glob, a full disk) leaves no empty workdir (nor an empty
  # --profile_dir) behind.
  with (paths.new_dirs_removed_on_failure(workdir),
        paths.new_dirs_removed_on_failure(profile_dir)):
    try:
      trace = step_trace.StepTrace(profile_dir, profile_steps)
      return _train_and_evaluate(config, workdir, stop_after_steps, on_error, overridden, trace,
                                 stop)
    except Exception:
      for cleanup in reversed(on_error):
        try:
          cleanup()
        except Exception:  # pylint: disable=broad-except
          pass  # The run's error is the one to report, not a cleanup's after it.
      raise
    finally:
      stop.restore()


def _train_and_evaluate(config, workdir, stop_after_steps, on_error, overridden,
                        trace, stop) -> dict:
  start_time = time.time()
  if stop_after_steps is not None and stop_after_steps < 0:
    raise cli.UserError(f'--stop_after_steps={stop_after_steps} must be >= 0')
  start = init_from.prepare(config, workdir, overridden)
  exp = experiment_lib.Experiment.create(start.config, vocab_file=start.readable_vocab_file())
  c, mesh = exp.config, exp.mesh
  saved_config.check_trains_in(workdir, c, start.readable_vocab_file())
  workdir = experiment_lib.prepare_workdir(workdir)
  changed = experiment_lib.check_resume_config(workdir, c)
  is_chief = jax.process_index() == 0
  say = print if is_chief else (lambda *a, **k: None)
  write_line = (lambda line: bar.write(line, file=sys.stdout)) if is_chief else say
  for note in [config_lib.warmup_note(config), config_lib.steps_per_execution_note(c),
               *start.notes]:
    if note:
      say(f'note: {note}', flush=True)

  packing_start = time.time()
  examples = pipeline.open_train_examples(c, exp.tokenizer)
  packing_note = pipeline.packing_note(examples, time.time() - packing_start)
  data_line, notes = pipeline.data_summary(examples, c)
  say(data_line, flush=True)
  for note in [packing_note, *notes]:
    if note:
      say(f'note: {note}', flush=True)
  eval_corpus = None  # Opened once: every evaluation reads the files listed now.
  if c.eval_every_steps:  # A bad eval glob or split fails now, not after hours of training.
    eval_corpus = sources.open_corpus(c, 'eval')
    # Every evaluation reads the same examples: read once now, a bad file or line among them
    # fails before training, not at the first evaluation (which also cost the checkpoint due at
    # its step).
    for _ in pipeline.make_eval_iterator(c, exp.tokenizer, None, c.num_eval_steps, eval_corpus):
      pass
    note = sources.held_out_note(examples.source, eval_corpus)
    if note:
      say(f'note: {note}', flush=True)
  abstract_state = exp.abstract_state()
  checkpoint.check_disk(checkpoint.directory_of(workdir), abstract_state)
  ckpt = checkpoint.Checkpointer(checkpoint.directory_of(workdir), keep=c.keep_checkpoint_max)
  on_error.append(ckpt.close)
  latest, state, loop_state = ckpt.restore_latest_valid(abstract_state)
  if latest is not None:
    say(f'Resuming from step {latest} in {ckpt.directory}'
        + (f' (config keys changed since: {", ".join(changed)})' if changed else ''))
  elif c.init_from and start.source is None:
    raise cli.UserError(f'{ckpt.directory} holds step directories but no complete checkpoint, '
                        'so the run can neither resume nor start from config.init_from; move '
                        'them away or use a new --workdir')
  elif start.source is not None:
    state, notes = init_from.initial_state(exp, start)
    for note in notes:
      say(f'note: {note}', flush=True)
  # A new run's state is initialised below, while its first train call compiles.
  step = 0 if state is None else int(jax.device_get(state.step))
  if step > c.num_train_steps:  # Before config.json would say so beside the checkpoint.
    raise cli.UserError(f'the run in {workdir} is at step {step}, past --config.num_train_steps='
                        f'{c.num_train_steps}: a run cannot be shortened; pass at least {step}, '
                        f'or start a new --workdir with --config.init_from='
                        f'{shlex.quote(ckpt.step_path(step))}')
  first_position = _data_position(loop_state, step, c)
  data_order = _data_order(latest is not None, loop_state)
  data_size = _data_size(examples)
  note = _changed_data_note(loop_state, data_size)
  if note:
    say(f'note: {note}', flush=True)
  # Each item holds the batches of one train call (config.steps_per_execution steps, fewer
  # where a log, evaluation or save comes first).
  boundaries = config_lib.loop_boundaries(c)
  # --stop_after_steps ends a call at its step, whatever steps_per_execution says.
  stop_at = None if stop_after_steps is None else step + stop_after_steps
  train_iter = prefetch.to_mesh(prefetch.StepChunks(pipeline.make_train_iterator(
      c, exp.tokenizer, parallel.process_rows(mesh, c.train_batch_size), first_position,
      examples, data_order),
      step, c.steps_per_execution, boundaries, stop_at), mesh, steps_axis=True)
  # Stop the prefetch thread before exiting: one still placing arrays on devices while the
  # interpreter shuts down can abort the process.
  on_error.append(train_iter.close)
  train_steps = exp.jit_train_steps()
  base_rng = jax.random.key(c.seed)
  ahead, eval_ahead = None, None  # compile_ahead.py's threads.
  if step < c.num_train_steps and stop_after_steps != 0:
    ahead = compile_ahead.FirstCallCompile(train_steps, exp.train_step(),
                                           abstract_state if state is None else state,
                                           abstract_state, train_iter, mesh, base_rng)
    on_error.append(ahead.wait)  # Before train_iter.close: it may be waiting for a batch.
  if state is None:
    state = exp.init_state()
  # Every check has passed: the run's first files go into the workdir.
  init_from.write_vocabulary(start)
  if is_chief:
    saved_config.keep_vocabulary(workdir, c)
    saved_config.write(workdir, c)
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  say(f'Writing to {workdir} | objective {c.objective} | {num_params / 1e6:.2f}M parameters | '
      f'{mesh.devices.size} device(s) {jax.devices()[0].platform} | '
      f'batch {c.train_batch_size} x {c.max_seq_length} tokens', flush=True)
  if parallel.FSDP_AXIS in mesh.axis_names:
    unsplit = parallel.unsplit_fraction(mesh, abstract_state)
    if unsplit > parallel.UNSPLIT_WARNING:
      print(f'warning: fsdp_axis_size={c.fsdp_axis_size} divides no dimension of arrays '
            f'holding {unsplit:.0%} of the parameter and optimizer bytes: they stay whole on '
            'every device; a size that divides hidden_size (e.g. 2, 4, 8) splits them',
            file=sys.stderr, flush=True)

  params_sharding = jax.tree.map(lambda x: x.sharding, abstract_state.params)
  eval_step = ts.jit_eval_step(ts.make_eval_step(exp.objective), mesh, params_sharding)
  writer = metric_writer.MetricWriter(workdir, enabled=is_chief, resume_step=latest or 0)
  # A run that fails (diverged, a failed save) still leaves its last rows, on gs:// and in
  # TensorBoard too: the ones that say why.
  on_error.append(writer.close)
  too_many_nonfinite = nonfinite.ConsecutiveLimit(c.max_consecutive_nonfinite)
  if c.steps_per_execution > 1:  # What the loop finishes before it stops, as the notice says.
    stop.unit = f'call (up to {c.steps_per_execution} steps)'
  stop.install()

  first_step = step
  note = trace.plan(first_step, c.num_train_steps, is_chief,
                    prefetch.call_size(first_step, c.steps_per_execution, boundaries,
                                       stop_at))
  if note:
    say(f'note: {note}', flush=True)
  on_error.append(lambda: trace.close(step))
  tokens_per_step = c.train_batch_size * c.max_seq_length
  model_flops = flops_lib.model_flops_per_step(c)
  flops_stages = flops_lib.model_flops_stages(c)  # two_stage's steps cost less, then more.
  peak, _ = chips.peak_tflops(jax.devices()[0].device_kind, c.dtype, None)

  def throughput(steps: int, seconds: float, first: int, last: int) -> dict:
    """Of `steps` timed steps taking `seconds`, among steps first+1..last (FLOPs: theirs)."""
    if not steps:  # Only calls that compiled ran: no steady-state figure (null in the JSON).
      return dict.fromkeys(('tokens_per_sec', 'steps_per_sec',
                            'model_tflops_per_sec_per_device', 'mfu'))
    flops_per_step = ((flops_lib.flops_to_step(flops_stages, last)
                       - flops_lib.flops_to_step(flops_stages, first)) / (last - first))
    return dict(tokens_per_sec=steps * tokens_per_step / max(seconds, 1e-9),
                steps_per_sec=steps / max(seconds, 1e-9),
                **flops_lib.utilization(flops_per_step, steps, seconds, mesh.devices.size,
                                        peak))

  train_metrics, eval_metrics, last_eval_step = {}, {}, None
  if latest is not None:  # E.g. a finished run re-run: its final rows stand (and its summary).
    train_metrics = metric_writer.record_at(workdir, 'metrics', latest) or {}
    saved_eval = (metric_writer.record_at(workdir, 'eval_metrics', latest)
                  if c.eval_every_steps else None)
    if saved_eval is not None:
      eval_metrics, last_eval_step = saved_eval, latest
  # The metric sums since the last log, on the devices (host values at a log); a resumed run
  # continues its checkpoint's window exactly (on the host until the first call).
  window, zeros = _window_from_json(loop_state), None
  resumed_window = window is not None
  window_start, window_steps = time.time(), 0  # For throughput: steps of this process only.
  bar = tqdm.tqdm(total=c.num_train_steps, initial=step, unit='step', file=sys.stderr,
                  disable=not (is_chief and c.progress_bar), dynamic_ncols=True,
                  mininterval=1.0 if sys.stderr.isatty() else 30.0)
  train_seconds, timed_steps, first_step_seconds = 0.0, 0, None

  def window_metrics(window, speed: dict) -> dict:
    """A log row: the window's metrics at `step` (host values), with `speed` (throughput)."""
    metrics = objective_metrics.summarize(window, c.gen_weight, c.disc_weight)
    finite_steps = float(window['num_steps'])  # Skipped (non-finite) steps count 0.
    metrics.update(
        grad_norm=float(window['grad_norm_sum']) / finite_steps if finite_steps else None,
        learning_rate=float(exp.schedule(step - 1)),
        skipped_steps=int(nonfinite.total_skipped(state.opt_state)), **speed)
    return metrics

  def run_eval():
    nonlocal eval_metrics, window_start, last_eval_step
    last_eval_step = step
    # The train call before it may still be running: its time is training's, not evaluation's
    # (counted here, tokens_per_sec came out several times too high).
    jax.block_until_ready(state)
    t = time.time()
    if eval_ahead is not None:
      eval_ahead.wait()  # Its executable is the one the evaluation's first call uses.
    eval_metrics = eval_loop.evaluate_params(state.params, eval_step, c, exp.tokenizer, mesh,
                                            num_batches=c.num_eval_steps, corpus=eval_corpus)
    if eval_metrics:
      writer.write('eval_metrics', step, eval_metrics)
      write_line(f'eval  step {step:>7d} | {objective_metrics.progress_line(eval_metrics)} | '
                 f'{time.time() - t:.1f}s')
    window_start += time.time() - t  # Evaluation time does not count as training time.

  def position() -> int:
    """Examples of the data order consumed at `step` (each step read its batch size)."""
    return first_position + (step - first_step) * c.train_batch_size

  def save():
    nonlocal window_start
    jax.block_until_ready(state)  # As in run_eval: the last train call's time is training's.
    t = time.time()
    writer.flush()  # Rows up to this step reach the workdir before the checkpoint does.
    ckpt.save(step, state, force=True,
              loop_state=_loop_state(window, position(), data_size, data_order))
    window_start += time.time() - t  # Nor does saving (async: the copy off the devices).

  def stop_now(reason: str) -> dict:
    traced = trace.close(step)
    if traced:
      write_line(traced)
    ckpt.close()  # The save finishes first (a preemption's grace period is short).
    if eval_ahead is not None:
      eval_ahead.wait()  # Not exiting under a compile.
    train_iter.close()
    bar.close()
    writer.close()
    say(f'Stopped at step {step} ({reason}); checkpoint saved in {ckpt.step_path(step)}. '
        'Re-run the same command to resume.', flush=True)
    return dict(status='interrupted', step=step, workdir=workdir,
                checkpoint=ckpt.step_path(step))

  if step >= c.num_train_steps:
    say(f'Already at step {step} of {c.num_train_steps}: nothing to train. To continue, raise '
        '--config.num_train_steps and pass --config.allow_config_change=num_train_steps.')
    if window is not None and not train_metrics:
      # A run stopped between logs, now ended at that step (num_train_steps lowered to it):
      # its checkpoint's window is the last step's row, as the step that ends a run logs.
      train_metrics = window_metrics(window, throughput(0, 0.0, step, step))
      writer.write('metrics', step, train_metrics)
  elif stop_after_steps == 0:
    if latest is None:  # The starting state, e.g. to export or evaluate init_from's weights.
      save()
    return stop_now('--stop_after_steps=0')
  loop_start = time.time()
  # Before the loop: the mesh, the data, the initial state (its compile: 16 s for Small on a
  # 2-core CPU) or the restore; the first call's compile ran alongside (compile_ahead.py).
  setup_seconds = loop_start - start_time
  ahead_seconds = None
  if ahead is not None:
    ahead.wait()  # What is left of the compile counts in the first call's time.
    ahead_seconds, zeros = ahead.seconds, ahead.window_zeros
  # Compiled ahead only for an evaluation to come (a finished run re-run has none).
  will_evaluate = step < c.num_train_steps or last_eval_step != step
  if (c.eval_every_steps and will_evaluate
      and compile_ahead.compiles_eval_alongside(jax.devices()[0])):
    eval_ahead = compile_ahead.FirstEvalCompile(
        eval_step, abstract_state.params,
        lambda: eval_loop.eval_batches(c, exp.tokenizer, mesh, 1, eval_corpus))
    on_error.insert(0, eval_ahead.wait)  # Last: after pending saves finish.
  if (c.eval_every_steps and latest and latest < c.num_train_steps
      and latest % c.eval_every_steps == 0 and last_eval_step != latest):
    evaluating = time.time()  # Due at the checkpoint's step, after its save: it never ran.
    run_eval()
    loop_start += time.time() - evaluating  # Not the first call's time.
  # Calls of a length not run before compile (the first call, then shorter calls at a log,
  # save or resume): their time and steps are left out of their window's throughput.
  call_lengths, compile_seconds, compile_steps = set(), 0.0, 0
  while step < c.num_train_steps:
    batches = next(train_iter)  # Global arrays, built while the previous call ran.
    num_steps = batches['input_ids'].shape[0]
    if window is None or resumed_window:  # A new log window, or the checkpoint's.
      if zeros is None:
        zeros = ts.window_zeros(exp.train_step(), abstract_state, batches, base_rng)
      # A window saved by an earlier version lacks the sums added since (masked_count): 0.
      window = parallel.replicated_arrays(
          zeros if window is None else {k: window.get(k, v) for k, v in zeros.items()}, mesh)
      resumed_window = False
    traced_seconds = trace.seconds
    trace.before(step + 1, step + num_steps)
    compiles = num_steps not in call_lengths
    if compiles:
      jax.block_until_ready(window)  # Time this call alone.
      call_start = time.time()
    state, window, consecutive_nonfinite = train_steps(state, window, batches, base_rng)
    call_lengths.add(num_steps)
    if compiles:
      jax.block_until_ready(window)
      compile_seconds += time.time() - call_start
      compile_steps += num_steps
    steps_done = range(step + 1, step + num_steps + 1)
    step += num_steps
    too_many_nonfinite.push(steps_done, consecutive_nonfinite)
    window_steps += num_steps
    traced = trace.after(step, window)
    if traced:
      write_line(traced)
    window_start += trace.seconds - traced_seconds  # Writing a trace is not training time.
    bar.update(num_steps)
    budget_spent = stop_after_steps is not None and step - first_step >= stop_after_steps
    # Every process asks about every step: the preemption sync point is one step number.
    preempted = any([ckpt.reached_preemption(s) for s in steps_done])
    preempted = preempted or stop.signal is not None or budget_spent
    log_step = step % c.log_every_steps == 0 or step == c.num_train_steps
    if steps_done[0] == first_step + 1:
      # This process's first call compiles the train steps (minutes for Large): it is reported
      # apart, and throughput and MFU count from the next call on (a window that holds only
      # this call logs them as null). Like every call of a new length, it was waited for above.
      first_step_seconds = time.time() - loop_start
      what = f'step {step}' if num_steps == 1 else f'steps {steps_done[0]}-{step}'
      compiled = ('compiling or loading the train step included, ' if ahead_seconds is None
                  else '')
      alongside = ('' if ahead_seconds is None else
                   f', the train step compiled (or loaded) in {ahead_seconds:.1f}s alongside')
      write_line(f'first {what}: {first_step_seconds:.1f}s, {compiled}after '
                 f'{setup_seconds:.1f}s of set-up (data, initial or restored state){alongside}'
                 f'; {device_memory.describe(device_memory.peak())}')
      if not (log_step or preempted):
        window_start, window_steps, compile_seconds, compile_steps = time.time(), 0, 0.0, 0

    # A stop between logging steps prints the partial window but does not write it to
    # metrics.jsonl: the window goes into the checkpoint and the resumed run logs it whole,
    # so its metrics.jsonl matches an uninterrupted run's.
    if log_step or preempted:
      window = jax.device_get(window)
      elapsed = time.time() - window_start - compile_seconds
      window_timed_steps = window_steps - compile_steps
      if window_timed_steps:
        train_seconds += elapsed
        timed_steps += window_timed_steps
      train_metrics = window_metrics(window, throughput(window_timed_steps, elapsed,
                                                        step - window_steps, step))
      if log_step:
        writer.write('metrics', step, train_metrics)
      tokens_per_sec = train_metrics['tokens_per_sec']
      speed = (f'{tokens_per_sec:.0f} tok/s' if tokens_per_sec is not None else
               'no tok/s (only compiling calls)')
      bar.set_postfix(loss=f'{train_metrics["loss"]:.3f}', refresh=False,
                      **({} if tokens_per_sec is None else {'tok_s': f'{tokens_per_sec:.0f}'}))
      write_line(f'train step {step:>7d} | {objective_metrics.progress_line(train_metrics)} | '
                 f'lr {train_metrics["learning_rate"]:.2e} | {speed}'
                 + (f' | MFU {train_metrics["mfu"]:.1%}' if train_metrics['mfu'] else ''))
      if log_step:
        window, window_start, window_steps = None, time.time(), 0
        compile_seconds, compile_steps = 0.0, 0

    # The save first: an evaluation that fails (out of memory, say) costs no training, and a
    # preemption's save waits for none (its evaluation runs when the run resumes).
    if step % c.save_checkpoints_steps == 0 or step == c.num_train_steps or preempted:
      too_many_nonfinite.check_now()
      save()
    notice = preempted and not budget_spent and step < c.num_train_steps
    if c.eval_every_steps and step % c.eval_every_steps == 0 and not notice:
      run_eval()
    if preempted and step < c.num_train_steps:
      return stop_now(f'signal {stop.signal}' if stop.signal is not None else
                      '--stop_after_steps' if budget_spent else 'preemption notice')

  bar.close()
  ckpt.close()
  train_iter.close()
  if c.eval_every_steps and last_eval_step != step:
    run_eval()
  writer.close()
  steps_run = step - first_step
  summary = dict(status='completed', step=step, workdir=workdir,
                 checkpoint=ckpt.step_path(ckpt.latest_step()), steps_run=steps_run,
                 train_examples=len(examples),  # And the passes over them up to `step`:
                 epochs=round(position() / len(examples), 4))
  summary.update(train_metrics)
  if steps_run:
    summary.update(throughput(timed_steps, train_seconds, first_step, step),
                   first_step_sec=first_step_seconds,
                   setup_sec=round(setup_seconds, 2),
                   train_compile_sec=None if ahead_seconds is None else round(ahead_seconds, 2),
                   model_flops_per_step=model_flops, peak_tflops_per_device=peak,
                   **device_memory.peak())
  summary.update({f'eval_{k}': v for k, v in eval_metrics.items()})
  summary['wall_time_sec'] = round(time.time() - start_time, 2)
  return summary


def _sweep_grid():
  """(remats, fsdps) of --sweep, or (None, None) without it."""
  if not FLAGS.sweep:
    return None, None
  return FLAGS.sweep_remat, cli.integers('sweep_fsdp', FLAGS.sweep_fsdp, 1, '1,8')


def main(argv):
  del argv  # cli.run refuses stray arguments.
  if FLAGS.topology and not FLAGS.dry_run:
    raise cli.UserError(f'--topology={FLAGS.topology} plans a run without training; add --dry_run')
  if FLAGS.sweep and not FLAGS.topology:
    raise cli.UserError('--sweep compiles the step for a TPU slice; add --topology=NAME, '
                        'e.g. --topology=v4-128')
  sweep_only = [f'--{name}' for name in ('sweep_remat', 'sweep_fsdp') if FLAGS[name].present]
  training_only = [f'--{name}' for name in ('stop_after_steps', 'profile_dir', 'profile_steps')
                   if FLAGS[name].present]
  if sweep_only and not FLAGS.sweep:
    verb = 'choose' if len(sweep_only) > 1 else 'chooses'
    raise cli.UserError(f'{" and ".join(sweep_only)} {verb} what --sweep tries; add --sweep '
                        '(and --dry_run --topology=NAME)')
  if FLAGS.dry_run and training_only:
    verb = 'act' if len(training_only) > 1 else 'acts'
    raise cli.UserError(f'{" and ".join(training_only)} {verb} on a run that trains; --dry_run '
                        'trains nothing: drop one or the other')
  if not FLAGS.dry_run and not FLAGS.workdir:
    raise cli.UserError('--workdir is required to train; pass --workdir=DIR (only --dry_run '
                        'runs without one)')
  overridden = set(config_flags.get_override_values(FLAGS['config']))
  if not FLAGS.topology:  # Before anything starts JAX (init_from reading a checkpoint does).
    mode = distributed.initialize_from(FLAGS)
    cpu_devices.configure_for(FLAGS.config, FLAGS.cpu_devices, single_process=mode == 'single')
  if FLAGS.dry_run:  # Plans the shapes the run would train: init_from's, or its workdir's.
    start = init_from.prepare(FLAGS.config, FLAGS.workdir, overridden)
    config = start.config
    if FLAGS.workdir:  # What the run would refuse there, the plan refuses (reading only).
      saved_config.check_trains_in(FLAGS.workdir, config, start.readable_vocab_file())
      experiment_lib.check_resume_config(FLAGS.workdir, config)
  if FLAGS.topology:
    cli.print_result(tpu_plan.run(config, FLAGS.topology, *_sweep_grid()))
    return
  if FLAGS.dry_run:
    plan = dry_run.plan(experiment_lib.Experiment.create(config, read_vocab=False))
    if jax.process_index() == 0:
      print(dry_run.describe(plan), flush=True)
    cli.print_result(plan)
    return
  cli.print_result(train_and_evaluate(
      FLAGS.config, FLAGS.workdir, FLAGS.stop_after_steps, overridden, FLAGS.profile_dir,
      step_trace.parse_steps(FLAGS.profile_steps)))


def _define_flags():
  """Defined when the command runs, so this module imports beside other commands' modules
  (tests, notebooks) without a clash on --config."""
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py); '
                                  'override any key with --config.KEY=VALUE.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and TensorBoard logs.')
  flags.DEFINE_integer('stop_after_steps', None, 'Save and exit after this many steps in this '
                       'invocation (a call of config.steps_per_execution ends there; e.g. to '
                       'fit a job time limit); the schedule still runs to '
                       'config.num_train_steps and the same command resumes. 0 saves the '
                       'starting state (e.g. the weights of config.init_from) as a checkpoint.')
  flags.DEFINE_bool('dry_run', False, 'Print the mesh, per-host/per-device batch, parameter and '
                    'optimizer memory per device and FLOPs per step, then exit without training '
                    'or writing anything.')
  flags.DEFINE_string('topology', None, 'With --dry_run: compile the real train step for this '
                      'TPU slice without a TPU (needs libtpu: pip install -e .[tpu]) and report '
                      'its memory per chip against HBM and a roofline prediction of step time and '
                      'MFU. Names: v4:4x4x4, v5p:4x8x8, v5e:16x16, v6e:16x16, or v4-128, '
                      'v5p-512, v5litepod-256, v6e-256 (v4/v5p count TensorCores, 2 per chip).')
  flags.DEFINE_bool('sweep', False, 'With --topology: compile every --sweep_remat x '
                    '--sweep_fsdp setting with the fewest grad_accum_steps that fit, print the '
                    'table and the fastest predicted setting.')
  flags.DEFINE_list('sweep_remat', 'none,save_dots,full', 'Remat policies --sweep tries.')
  flags.DEFINE_list('sweep_fsdp', '1,8', 'fsdp_axis_size values --sweep tries (those that divide '
                    'the chip count).')
  flags.DEFINE_string('profile_dir', None, 'Trace steps of this run with jax.profiler into this '
                      'local directory (Perfetto JSON and xplane; read it with '
                      'benchmarks/profile_top_ops.py, TensorBoard or XProf). Process 0 only.')
  flags.DEFINE_string('profile_steps', None, 'FIRST:LAST, the steps --profile_dir traces '
                      '(default: the 3 after this process\'s first step, which compiles).')
  cpu_devices.define_flag()
  distributed.define_flags()


def run():
  _define_flags()
  flags.mark_flags_as_required(['config'])
  cli.run(main)


if __name__ == '__main__':
  run()
