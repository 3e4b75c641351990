r"""Train a sentencepiece vocabulary for ELECTRA.

  python -m electra_jax.data.build_vocab --input='corpus/*.txt' --vocab_size=30522 \
      --output=vocab/spm

Writes PREFIX.model and PREFIX.vocab with [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0..4; the last
stdout line is a JSON summary. Point --config.vocab_file at PREFIX.model and set
--config.vocab_size to the same N.
"""
import shlex
import time

from absl import flags

from electra_jax import cli
from electra_jax import paths
from electra_jax import saved_config
from electra_jax.data import sources
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError

FLAGS = flags.FLAGS


def _prefix(output: str) -> str:
  """--output as a prefix: users often name the file they want, and 'vocab/spm.model' must
  write vocab/spm.model, not vocab/spm.model.model; or a folder ('vocab/', or one that exists),
  which gets vocab/spm.model, not vocab.model beside it."""
  if output.endswith('/') or paths.is_dir(output):
    return paths.join(paths.absolute(output.rstrip('/') or '/'), 'spm')
  output = paths.absolute(output)
  for suffix in ('.model', '.vocab'):
    if output.endswith(suffix) and len(paths.name(output)) > len(suffix):
      return output[:-len(suffix)]
  return output


def main(argv):
  del argv  # cli.run refuses stray arguments.
  start = time.time()
  # Sentencepiece takes an int32 and reads max_sentences 0 as "all lines".
  if not (1 <= FLAGS.max_sentences < 2**31 and FLAGS.vocab_size < 2**31):
    raise UserError(f'--max_sentences={FLAGS.max_sentences} must be in [1, 2**31) and '
                    f'--vocab_size={FLAGS.vocab_size} below 2**31')
  prefix = _prefix(FLAGS.output)
  folder = paths.parent(prefix)
  if saved_config.exists(folder):  # A run (its own copy of its vocabulary) or a model.
    raise UserError(f"--output={FLAGS.output}: '{folder}' holds a run or a model "
                    f'({saved_config.path(folder)}), whose vocabulary is its own; pass '
                    '--output in another folder')
  existing = [f for f in (prefix + '.model', prefix + '.vocab') if paths.exists(f)]
  if existing and not FLAGS.overwrite:
    # A run names its vocabulary by path: a new one there would change its token ids.
    raise UserError(f"--output={FLAGS.output}: '{existing[0]}' exists, and runs that use it "
                    'would read the new vocabulary; pass another --output, or --overwrite')
  files = sources.list_files(FLAGS.input)
  # One read of the corpus: a bad line or record fails it with the file named (sentencepiece's
  # own error would not say which).
  read = dict(skip_bad_lines=FLAGS.skip_bad_lines, text_key=FLAGS.text_key, flags='--')
  num_lines, blank, too_long = 0, 0, 0

  def counted(lines):
    nonlocal num_lines, blank, too_long
    limit = tokenizer_lib.MAX_TRAINING_LINE_BYTES
    for num_lines, line in enumerate(lines, 1):
      if not line.strip():
        blank += 1
      elif len(line) > limit // 4 and len(line.encode('utf-8')) > limit:
        too_long += 1  # Sentencepiece leaves it out without a word.
      yield line

  with paths.new_dirs_removed_on_failure(paths.parent(prefix)):
    paths.check_writable_dir(paths.parent(prefix), '--output (its folder)')
    print(f'Training a {FLAGS.vocab_size}-token {FLAGS.model_type} vocabulary on {len(files)} '
          f'file(s); writing {prefix}.model and {prefix}.vocab', flush=True)
    try:
      model_file = tokenizer_lib.train_sentencepiece(
          counted(sources.vocabulary_lines(files, **read)), FLAGS.vocab_size, prefix,
          FLAGS.model_type, FLAGS.max_sentences)
    except UserError as e:
      if num_lines and blank + too_long == num_lines:
        raise UserError(f'--input has no line to train a vocabulary on: its {num_lines} line(s) '
                        f'are blank ({blank}) or longer than sentencepiece reads '
                        f'({too_long} over {tokenizer_lib.MAX_TRAINING_LINE_BYTES // 1024} KiB); '
                        'give it text, one sentence or paragraph a line') from None
      if str(e).startswith('vocab_size='):
        raise UserError(f'--{e}') from None  # The flag that sets it.
      raise
  if too_long:
    print(f'note: {too_long} of the {num_lines} lines are over '
          f'{tokenizer_lib.MAX_TRAINING_LINE_BYTES // 1024} KiB, which sentencepiece leaves out '
          'of training: characters found only there become [UNK]; split such text into '
          'sentences or paragraphs, one a line', flush=True)
  vocab_size = tokenizer_lib.load_tokenizer(model_file).vocab_size
  print(f'Wrote {model_file} ({vocab_size} tokens) from {num_lines} lines in '
        f'{time.time() - start:.1f}s; use --config.vocab_file={shlex.quote(model_file)} '
        f'--config.vocab_size={vocab_size}', flush=True)
  cli.print_result({'model': model_file, 'vocab': prefix + '.vocab',
                    'vocab_size': vocab_size, 'num_input_files': len(files),
                    'num_lines': num_lines, 'num_lines_too_long': too_long})


def _define_flags():
  flags.DEFINE_string('input', None, 'Glob of UTF-8 training text, JSON Lines, Parquet or Arrow '
                      'files (comma-separated globs allowed).')
  flags.DEFINE_string('text_key', 'text', 'JSON Lines, Parquet and Arrow files: the field holding '
                      "each record's text.")
  flags.DEFINE_bool('skip_bad_lines', False, 'Skip (and count in the log) lines that are not '
                    'UTF-8 text (JSON Lines: not objects; record files: records without text) '
                    'instead of failing.')
  flags.DEFINE_integer('vocab_size', 8000, 'Vocabulary size, including the 5 special tokens.')
  flags.DEFINE_string('output', None, 'Output prefix: writes PREFIX.model and PREFIX.vocab '
                      '(a trailing .model or .vocab is dropped: vocab/spm.model writes '
                      'vocab/spm.model and vocab/spm.vocab; a folder, vocab/, writes '
                      'vocab/spm.*).')
  flags.DEFINE_bool('overwrite', False, 'Replace an existing PREFIX.model / PREFIX.vocab.')
  flags.DEFINE_enum('model_type', 'unigram', ['unigram', 'bpe'], 'Sentencepiece model type.')
  flags.DEFINE_integer('max_sentences', 2_000_000,
                       'At most this many randomly sampled lines train the vocabulary (>= 1).')


def run():
  """Console entry point (electra-build-vocab)."""
  _define_flags()
  flags.mark_flags_as_required(['input', 'output'])
  cli.run(main)


if __name__ == '__main__':
  run()
