r"""Tokenize and pack a pretraining corpus once, into sharded ArrayRecord files.

  python -m electra_jax.data.prepare --config=configs/small.py --output=prepared/small \
      [--config.train_files=GLOB | --config.tfds_name=c4/en ...] [--examples_per_shard=N]

Reads the config's corpus (train_files, or tfds_name when set), packs it exactly as training
would stream it (vocab_file, max_seq_length, short_seq_prob, seed) and writes
OUTPUT/train-NNNNN.array_record plus OUTPUT/train_metadata.json. Then train with
--config.train_data_dir=OUTPUT. The last stdout line is a JSON summary.
"""
import shlex
import sys
import time

import tqdm
from absl import flags
from ml_collections import config_flags

from electra_jax import cli
from electra_jax import init_from
from electra_jax import paths
from electra_jax import saved_config
from electra_jax.data import pipeline
from electra_jax.data import shards
from electra_jax.data import sources
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError


def _output_dir(output: str) -> str:
  output = paths.absolute(output)
  if paths.exists(shards.metadata_path(output)):
    raise UserError(f"--output '{output}' already holds prepared data "
                    f'({shards.metadata_path(output)}); pick a new directory or delete it')
  if saved_config.exists(output):  # A training or fine-tuning run's workdir.
    raise UserError(f"--output '{output}' holds a run ({saved_config.path(output)}); pick a new "
                    'directory for the prepared data')
  return paths.check_writable_dir(output, '--output')


def _write(corpus, tokenizer, c, output: str, writer: shards.ShardWriter,
           progress: bool, vocab_name: str) -> dict:
  """Packs `corpus` into `writer`'s shards; returns the metadata written last."""
  print(f'Packing {corpus.description} with {tokenizer} into {output} '
        f'(max_seq_length {c.max_seq_length}, seed {c.seed})', flush=True)
  bar = tqdm.tqdm(total=corpus.num_parts, unit=f' {corpus.unit}', file=sys.stderr,
                  disable=not progress, mininterval=1.0 if sys.stderr.isatty() else 30.0,
                  dynamic_ncols=True)
  with bar:  # Closed on failure too: the error line starts a line of its own.
    for tokens, num_first in pipeline.corpus_examples(corpus, tokenizer, c, 'train',
                                                      bar.update):
      writer.write(tokens, num_first)
      if writer.num_examples % 10_000 == 0:
        bar.set_postfix(examples=writer.num_examples, refresh=False)
  if not writer.num_examples:
    raise UserError(f'{corpus.description} produced no examples; check it contains text')
  return writer.finish(dict(
      source=corpus.source, vocab_file=vocab_name,
      vocab_sha256=shards.file_sha256(tokenizer.vocab_file),
      vocab_size=tokenizer.vocab_size, do_lower_case=c.do_lower_case,
      max_seq_length=c.max_seq_length, pack_across_documents=c.pack_across_documents,
      short_seq_prob=c.short_seq_prob, seed=c.seed, special_ids=dict(
          pad=tokenizer.pad_id, cls=tokenizer.cls_id, sep=tokenizer.sep_id,
          mask=tokenizer.mask_id)))


def prepare(config, output: str, examples_per_shard: int = 100_000,
            progress: bool = True, overridden=()) -> dict:
  """Writes the packed training examples of `config`'s corpus; returns the metadata. With
  config.init_from, in the vocabulary (extend_vocab_file's too) the run will train with.
  `overridden`: the keys given as --config.KEY=VALUE."""
  if examples_per_shard <= 0:
    raise UserError(f'--examples_per_shard={examples_per_shard} must be positive')
  start = time.time()
  run_start = init_from.prepare(config, None, overridden)
  c = run_start.config
  tokenizer = tokenizer_lib.load_tokenizer(run_start.readable_vocab_file(), c.vocab_size,
                                           c.do_lower_case)
  vocab_name = (c.vocab_file if run_start.vocabulary is None else
                f"the vocabulary of init_from '{c.init_from}'"
                + (f" extended with '{c.extend_vocab_file}'" if c.extend_vocab_file else ''))
  corpus = sources.open_corpus(c, 'train')
  with paths.new_dirs_removed_on_failure(output):
    output = _output_dir(output)
    writer = shards.ShardWriter(output, 'train', tokenizer.vocab_size, examples_per_shard)
    try:
      metadata = _write(corpus, tokenizer, c, output, writer, progress, vocab_name)
    except BaseException:
      writer.abort()
      raise
  seconds = time.time() - start
  return dict(output=output, metadata=shards.metadata_path(output),
              num_examples=metadata['num_examples'], num_tokens=metadata['num_tokens'],
              num_shards=len(metadata['shards']), seconds=round(seconds, 2))


def main(argv):
  del argv  # cli.run refuses stray arguments.
  f = flags.FLAGS
  overridden = set(config_flags.get_override_values(f['config']))
  summary = prepare(f.config, f.output, f.examples_per_shard, progress=True,
                    overridden=overridden)
  print(f"Wrote {summary['num_examples']} examples ({summary['num_tokens']} tokens) in "
        f"{summary['num_shards']} shard(s) to {summary['output']} in {summary['seconds']:.1f}s; "
        f"train with --config.train_data_dir={shlex.quote(summary['output'])}", flush=True)
  cli.print_result(summary)


def _define_flags():
  # Defined here, not at import, so other commands (the data benchmark) can import prepare().
  config_flags.DEFINE_config_file('config', None, 'Experiment config file (configs/*.py); '
                                  'override any key with --config.KEY=VALUE.', lock_config=True)
  flags.DEFINE_string('output', None, 'Directory to write the shards and metadata into '
                      '(created; must not already hold prepared data).')
  flags.DEFINE_integer('examples_per_shard', 100_000, 'Examples per ArrayRecord shard (100k '
                       'examples of 128 tokens are about 26 MB).')
  flags.mark_flags_as_required(['config', 'output'])


def run():
  """Console entry point (electra-prepare-data)."""
  _define_flags()
  cli.run(main)


if __name__ == '__main__':
  run()
