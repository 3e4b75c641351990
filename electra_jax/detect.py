r"""The discriminator at work: which tokens of a text it takes for replaced.

  python -m electra_jax.detect --workdir=/tmp/electra_demo \
      --text="Anne walked to the the house with her sister." [--text=...] [--sample] [--seed=K]

Each --text as written: every token with the discriminator's probability that it was replaced
(plant a wrong word and see whether it is flagged). With --sample the text is first corrupted as
in pretraining: the run's masking picks positions and its generator samples a token at each,
with the same code and randomness a training step uses; the table then shows each sample beside
the original, `R` where it differs (a sample equal to the original counts as original). `*`
marks what the discriminator flags (p > 0.5). Prints a table per text, then one JSON line.
"""
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from electra_jax import checkpoint
from electra_jax import cli
from electra_jax import config as config_lib
from electra_jax import distributed
from electra_jax import model as model_lib
from electra_jax import objectives
from electra_jax import paths
from electra_jax import saved_config
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError

FLAGS = flags.FLAGS


def texts_batch(tokenizer, texts: list[str], max_seq_length: int) -> tuple[dict, list[int]]:
  """`[CLS] text [SEP]` rows padded to max_seq_length (the run's: position embeddings end
  there), and how many tokens of each text were cut to fit."""
  rows, cut = [], []
  for text in texts:
    ids = tokenizer.encode(text)
    if not ids:
      raise UserError(f'--text={text!r} has no tokens; pass some words')
    cut.append(max(0, len(ids) - (max_seq_length - 2)))
    rows.append([tokenizer.cls_id, *ids[:max_seq_length - 2], tokenizer.sep_id])
  input_ids = np.full((len(rows), max_seq_length), tokenizer.pad_id, np.int32)
  input_mask = np.zeros_like(input_ids)
  for i, row in enumerate(rows):
    input_ids[i, :len(row)], input_mask[i, :len(row)] = row, 1
  return dict(input_ids=input_ids, input_mask=input_mask,
              segment_ids=np.zeros_like(input_ids)), cut


def check_detects(objective, name: str):
  """Only a full-size network with a per-token head gives p(replaced)
  (Objective.replaced_logits): not the MLM-only objectives."""
  if not objective.layout.rtd_head:
    detecting = ', '.join(n for n, cls in objectives.OBJECTIVES.items() if cls.layout.rtd_head)
    raise UserError(f"objective '{name}' has no per-token head that gives the probability that "
                    f'a token was replaced; detect reads runs of {detecting}')


def discriminate(objective, params, batch, rng=None) -> dict:
  """The discriminator's p(replaced) [B, S] of `batch` as given (rng None), or of the batch
  corrupted as a training step with `rng` corrupts it (Objective.masked_step and
  detect_corrupted; no dropout), then with the input it read ('input', [B, S]) and where that
  differs from the text ('replaced': a sample equal to the original is no replacement)."""
  batch = jax.tree.map(jnp.asarray, batch)
  if rng is None:
    return dict(p_replaced=jax.nn.sigmoid(objective.replaced_logits(params, batch)))
  step = objective.masked_step(params, batch, rng, deterministic=True)
  corrupted, logits = objective.detect_corrupted(step)
  return dict(p_replaced=jax.nn.sigmoid(logits), input=corrupted,
              replaced=(corrupted != batch['input_ids']) & (batch['input_mask'] > 0))


def _table(tokenizer, text: str, batch, out, row: int, sample: bool, cut: int) -> dict:
  """Prints one text's table; returns its JSON record (text tokens only, no [CLS]/[SEP])."""
  ids = batch['input_ids']
  span = range(1, int(batch['input_mask'][row].sum()) - 1)
  tokens = [tokenizer.id_to_piece(int(ids[row, j])) for j in span]
  p = [float(out['p_replaced'][row, j]) for j in span]
  flagged = [x > 0.5 for x in p]
  # cut_tokens: how many of the text's tokens did not fit (its tokens are not the whole text).
  record = dict(text=text, tokens=tokens, p_replaced=[round(x, 4) for x in p], cut_tokens=cut)
  if sample:
    seen = [tokenizer.id_to_piece(int(out['input'][row, j])) for j in span]
    replaced = [bool(out['replaced'][row, j]) for j in span]
    record.update(input=seen, replaced=replaced)
    hits = sum(f and r for f, r in zip(flagged, replaced))
    mean = lambda values: f'{np.mean(values):.3f}' if values else '-'
    print(f'{sum(replaced)} of {len(tokens)} tokens replaced; the discriminator flags '
          f'{sum(flagged)}, {hits} of them replaced (mean p(replaced): replaced '
          f'{mean([x for x, r in zip(p, replaced) if r])}, originals '
          f'{mean([x for x, r in zip(p, replaced) if not r])})')
    print(f"  {'token':16s} {'input':16s}   p(replaced)")
    for token, s, r, x, f in zip(tokens, seen, replaced, p, flagged):
      print(f"  {token:16s} {s if s != token else '':16s} {'R' if r else ' '} {x:6.3f}"
            f"{'  *' if f else ''}")
  else:
    print(f'the discriminator flags {sum(flagged)} of {len(tokens)} tokens')
    print(f"  {'token':16s} p(replaced)")
    for token, x, f in zip(tokens, p, flagged):
      print(f"  {token:16s} {x:6.3f}{'  *' if f else ''}")
  if cut:
    print(f'  (the last {cut} token(s) did not fit max_seq_length and were left out)')
  return record


def main(argv):
  del argv  # cli.run refuses stray arguments.
  distributed.require_one_process('python -m electra_jax.detect')
  if FLAGS.workdir is None or not FLAGS.text:
    raise UserError('pass --workdir=DIR (a pretraining run) and --text="..." (one or more)')
  if not 0 <= FLAGS.seed < 2**32:  # jax.random.key(2**32) is key(0): another seed, same draws.
    raise UserError(f'--seed={FLAGS.seed} must be in [0, 2**32)')
  if FLAGS['seed'].present and not FLAGS.sample:
    raise UserError(f'--seed={FLAGS.seed} picks --sample\'s randomness; add --sample, or drop '
                    '--seed to read the text as written')
  start = time.time()
  config = config_lib.resolve(saved_config.load(FLAGS.workdir))
  tokenizer = tokenizer_lib.for_config(config)
  model = model_lib.Electra(model_lib.ModelConfig.from_config(config))
  objective = objectives.build_for_vocabulary(model, config, tokenizer)
  check_detects(objective, config.objective)
  params, step = checkpoint.read_params(FLAGS.workdir, FLAGS.step, '--step')
  batch, cut = texts_batch(tokenizer, FLAGS.text, config.max_seq_length)
  rng = jax.random.key(FLAGS.seed) if FLAGS.sample else None
  out = jax.device_get(jax.jit(functools.partial(discriminate, objective))(params, batch, rng))
  records = []
  for i, text in enumerate(FLAGS.text):
    print(f'text {i + 1} of {len(FLAGS.text)} (step {step}): ', end='')
    records.append(_table(tokenizer, text, batch, out, i, FLAGS.sample, cut[i]))
  cli.print_result(dict(workdir=paths.absolute(FLAGS.workdir), step=int(step),
                        sample=FLAGS.sample, seed=FLAGS.seed if FLAGS.sample else None,
                        texts=records, wall_time_sec=round(time.time() - start, 2)))


def _define_flags():
  flags.DEFINE_string('workdir', None, 'A pretraining workdir (python -m electra_jax.train).')
  flags.DEFINE_multi_string('text', [], 'A text to run the discriminator on; repeat for several.')
  flags.DEFINE_bool('sample', False, "Corrupt each text first as pretraining does (the run's "
                    'masking and generator samples), then discriminate.')
  flags.DEFINE_integer('seed', 0, "--sample's randomness: other seeds, other positions and "
                       'samples.')
  flags.DEFINE_integer('step', None, 'Checkpoint step to read (default: the latest).')


def run():
  """Console entry point (electra-detect)."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  run()
