"""Text -> packed ELECTRA examples -> shuffled, per-host batches (grain), checkpointable.

Examples are built as the official release's ExampleBuilder builds them: consecutive lines of
a document accumulate until a target length, then split into segments A and B and become
`[CLS] A [SEP] B [SEP]`. The global batch of step s is a pure function of (files, vocabulary,
seed, s); each host reads the rows of it its devices hold (parallel.process_rows: no block of
rows on a TPU slice), so training does not depend on how many hosts share the work. The corpus
is text files or a TFDS dataset packed at start-up, or the shards `prepare` packed once
(shards.py): both give the same examples in the same order.
"""
import itertools
import sys
from typing import Iterable, Iterator, Sequence

from absl import flags
import grain
import numpy as np

from electra_jax import paths
from electra_jax.data import shards
from electra_jax.data import sources
from electra_jax.errors import UserError

FEATURES = ('input_ids', 'input_mask', 'segment_ids')
SINGLE_SEGMENT_PROB = 0.1  # Official: some examples have only segment A, like classification.
MIN_RANDOM_LENGTH = 5      # Official: a random-length target is drawn from [5, max_seq_length].
TOKENIZE_CHUNK_LINES = 4096  # Lines per batched (multi-threaded) sentencepiece call.
EVAL_SEED = 1234           # Eval examples must never change between runs.

Example = tuple[list[int], int]  # (tokens incl. [CLS]/[SEP]s, length of `[CLS] A [SEP]`)


class ExampleBuilder:
  """Packs the tokenized lines of documents into two-segment examples (official logic).

  Two differences from the official code. A line longer than `max_length` tokens is split into
  `max_length`-token pieces that go on into the next examples (the official code makes one
  example of it and drops all but its first max_length - 2 tokens); a piece still loses what
  does not fit the segment it lands in (A holds max_length - 2 tokens, so at least 2). Once
  segment B has begun, later lines stay in B (the official code moves a later short line back
  into A, so A and B were not always contiguous text; the random draws are unchanged).
  Targets, truncation and the choice of the split point are official.
  """

  def __init__(self, max_length: int, cls_id: int, sep_id: int, short_seq_prob: float,
               rng: np.random.Generator):
    self._max_length, self._cls_id, self._sep_id = max_length, cls_id, sep_id
    self._short_seq_prob, self._rng = short_seq_prob, rng
    self._lines, self._length, self._target_length = [], 0, max_length

  def add_line(self, ids: list[int]) -> list[Example]:
    """Adds one tokenized line; returns the examples completed by it (usually none or one)."""
    examples = []
    for start in range(0, len(ids), self._max_length):
      piece = ids[start:start + self._max_length]
      self._lines.append(piece)
      self._length += len(piece)
      if self._length >= self._target_length:
        examples.append(self._create_example())
    return examples

  def end_document(self) -> list[Example]:
    """Emits what has accumulated: examples never span documents."""
    return [self._create_example()] if self._length else []

  def _create_example(self) -> Example:
    if self._rng.random() < SINGLE_SEGMENT_PROB:
      first_target = sys.maxsize
    else:
      first_target = (self._target_length - 3) // 2  # -3: [CLS] and two [SEP]s.
    first, second = [], []
    for line in self._lines:
      # Until B begins, a line joins A if A is empty, if it fits A's target, or (half the
      # time) if it is the line that crosses A's target. So A and B split at a line boundary.
      if not second and (not first or len(first) + len(line) < first_target
                         or (len(first) < first_target and self._rng.random() < 0.5)):
        first += line
      else:
        second += line
    first = first[:self._max_length - 2]
    second = second[:max(0, self._max_length - len(first) - 3)]
    self._lines, self._length = [], 0
    if self._rng.random() < self._short_seq_prob:
      self._target_length = int(self._rng.integers(MIN_RANDOM_LENGTH, self._max_length + 1))
    else:
      self._target_length = self._max_length
    tokens = [self._cls_id, *first, self._sep_id]
    num_first = len(tokens)
    if second:
      tokens += [*second, self._sep_id]
    return tokens, num_first


def _tokenized_documents(documents: Iterable[list[str]],
                         tokenizer) -> Iterator[list[list[int]]]:
  """Documents as lists of token-id lines, tokenized many lines per call for speed."""
  documents = iter(documents)
  while True:
    chunk, num_lines = [], 0
    for doc in documents:
      chunk.append(doc)
      num_lines += len(doc)
      if num_lines >= TOKENIZE_CHUNK_LINES:
        break
    if not chunk:
      return
    ids = iter(tokenizer.encode_batch([line for doc in chunk for line in doc]))
    for doc in chunk:
      yield [next(ids) for _ in doc]


def iter_examples(documents: Iterable[list[str]], tokenizer, max_seq_length: int,
                  short_seq_prob: float, seed: int,
                  across_documents: bool = False) -> Iterator[Example]:
  """Streams the examples of `documents` (lists of lines) in corpus order; deterministic given
  `seed`. across_documents: an example ends at a document's end only if it is the last."""
  if max_seq_length < MIN_RANDOM_LENGTH:
    raise UserError(f'max_seq_length={max_seq_length} is too short for [CLS] A [SEP] B [SEP]; '
                    f'use at least {MIN_RANDOM_LENGTH}')
  builder = ExampleBuilder(max_seq_length, tokenizer.cls_id, tokenizer.sep_id, short_seq_prob,
                           np.random.default_rng(seed))
  for doc in _tokenized_documents(documents, tokenizer):
    for line in doc:
      yield from builder.add_line(line)
    if not across_documents:
      yield from builder.end_document()
  yield from builder.end_document()


def _to_arrays(examples: Sequence[Example], max_seq_length: int,
               num_rows: int | None = None) -> dict[str, np.ndarray]:
  """int32 [num_rows, max_seq_length] features; rows past len(examples) are all zero."""
  num_rows = len(examples) if num_rows is None else num_rows
  input_ids = np.zeros((num_rows, max_seq_length), np.int32)
  lengths = np.zeros((num_rows, 1), np.int32)
  num_first = np.zeros((num_rows, 1), np.int32)
  for i, (tokens, first) in enumerate(examples):
    input_ids[i, :len(tokens)] = tokens
    lengths[i], num_first[i] = len(tokens), first
  positions = np.arange(max_seq_length, dtype=np.int32)
  return {
      'input_ids': input_ids,
      'input_mask': (positions < lengths).astype(np.int32),
      'segment_ids': ((positions >= num_first) & (positions < lengths)).astype(np.int32),
  }


def corpus_examples(corpus: sources.Corpus, tokenizer, config, split: str,
                    part_done=lambda: None) -> Iterator[Example]:
  """The examples of `corpus` as `config` packs its 'train' split (short_seq_prob, seed) or
  its 'eval' split (full length, EVAL_SEED: the same examples in every run)."""
  short_seq_prob, seed = ((config.short_seq_prob, config.seed) if split == 'train' else
                          (0.0, EVAL_SEED))
  return iter_examples(corpus.documents(part_done), tokenizer, config.max_seq_length,
                       short_seq_prob, seed, bool(config.get('pack_across_documents', False)))


def build_train_examples(config, tokenizer) -> dict[str, np.ndarray]:
  """The training corpus (train_files or the TFDS dataset), packed in memory: int32 arrays
  [N, max_seq_length] (FEATURES)."""
  return _pack_train_corpus(sources.open_corpus(config, 'train'), tokenizer, config)


def _pack_train_corpus(corpus: sources.Corpus, tokenizer, config) -> dict[str, np.ndarray]:
  examples = list(corpus_examples(corpus, tokenizer, config, 'train'))
  if not examples:
    raise UserError(f'{corpus.description} produced no examples; check it contains text')
  return _to_arrays(examples, config.max_seq_length)


class HostRowsMapDataset(grain.MapDataset):
  """One host's rows of each global batch of the parent stream, from `start`.

  Element i of a host reading rows R (ascending, parallel.process_rows) is parent element
  start + s*B + R[j] (s = i // len(R), j = i % len(R)), so every example keeps its row of the
  single-host global batch on any topology, and a run resumed at global position `start`
  (examples consumed) reads on from there with any number of hosts.
  """

  def __init__(self, parent: grain.MapDataset, global_batch: int, rows: np.ndarray,
               start: int = 0):
    super().__init__(parent)
    self._global_batch = global_batch
    self._rows = np.asarray(rows)
    self._start = start

  def __len__(self) -> int:
    return (len(self._parent) - self._start) // self._global_batch * len(self._rows)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    step, row = divmod(index, len(self._rows))
    return self._parent[self._start + step * self._global_batch + int(self._rows[row])]

  def __str__(self) -> str:
    return (f'HostRowsMapDataset(global_batch={self._global_batch}, '
            f'rows={len(self._rows)} of {self._global_batch})')


class InMemoryExamples:
  """Examples packed at start-up (streaming from raw text): `gather(indices)` -> features.
  `source`: the corpus's (sources.Corpus.source)."""

  def __init__(self, arrays: dict[str, np.ndarray], source: dict):
    self._arrays, self.source = arrays, source

  def __len__(self) -> int:
    return len(self._arrays['input_ids'])

  def gather(self, indices) -> dict[str, np.ndarray]:
    # One fancy-index copy per feature and batch, rather than stacking row by row.
    indices = np.asarray(indices)
    return {name: array[indices] for name, array in self._arrays.items()}

  @property
  def nbytes(self) -> int:
    return sum(array.nbytes for array in self._arrays.values())

  @property
  def num_tokens(self) -> int:
    """Tokens of all examples, [CLS]/[SEP]s included, padding not."""
    return int(self._arrays['input_mask'].sum(dtype=np.int64))


# Packing the corpus at start-up for longer than this earns a hint to pack it once (prepare).
SLOW_PACKING_SECONDS = 60.0


def packing_note(examples, seconds: float) -> str | None:
  """A hint when open_train_examples packed the corpus slowly: every start and resume pays it
  again, where prepared shards open at once."""
  if not isinstance(examples, InMemoryExamples) or seconds < SLOW_PACKING_SECONDS:
    return None
  return (f'packing the corpus took {seconds:.0f} s ({len(examples):,} examples, '
          f'{examples.nbytes / 2**30:.1f} GiB held in memory), and every start and resume pays '
          'it again; pack it once with `python -m electra_jax.data.prepare --config=FILE '
          '--output=DIR` and train with --config.train_data_dir=DIR')


# Reading the training examples more often than this earns a note (they get memorised).
MANY_EPOCHS = 100
# Examples filled below this fraction of max_seq_length on average earn a note.
LOW_FILL = 0.5


def data_summary(examples, config) -> tuple[str, list[str]]:
  """The start-up line on the training examples (how many, how full, how many times the run
  reads them), and notes where those numbers mean a wasted run."""
  num_examples, num_tokens = len(examples), examples.num_tokens
  fill = num_tokens / (num_examples * config.max_seq_length)
  epochs = config.num_train_steps * config.train_batch_size / num_examples
  reads = (f'read them {epochs:,.1f} times' if epochs >= 1 else
           f'read {100 * epochs:.3g}% of them')
  line = (f'data: {num_examples:,} examples, {num_tokens:,} tokens ({fill:.0%} of their '
          f'{config.max_seq_length} positions); {config.num_train_steps:,} steps of '
          f'{config.train_batch_size} {reads}')
  notes = []
  if epochs > MANY_EPOCHS:
    notes.append(f'the run reads its {num_examples:,} training examples {epochs:,.0f} times: '
                 'it will memorise them long before the end, and held-out metrics stall; '
                 'train on more text (train_files, tfds_name or train_data_dir) or lower '
                 'num_train_steps')
  if fill < LOW_FILL:
    notes.append(f'the examples fill {fill:.0%} of their {config.max_seq_length} positions '
                 f'({num_tokens / num_examples:.0f} tokens on average: short documents), so '
                 'most of every step computes padding; if the records are lines of longer '
                 'texts set records_are_lines=True, else pack_across_documents=True (examples '
                 'run on into the next document) or a lower max_seq_length')
  packed_with = getattr(examples, 'seed', None)
  if packed_with is not None and packed_with != config.seed:
    notes.append(f'train_data_dir was packed with seed={packed_with}, so its examples are not '
                 f'those a streaming run with config.seed={config.seed} packs (masking, order '
                 'and initialisation follow config.seed); for those, re-run prepare with it')
  return line, notes


class PreparedExampleBatches:
  """Examples from prepare's ArrayRecord shards: `gather(indices)` -> features. `source`: the
  corpus they were prepared from, as their metadata records it."""

  def __init__(self, examples: shards.PreparedExamples, max_seq_length: int, source: dict,
               seed: int | None = None):
    self._examples, self._max_seq_length, self.source = examples, max_seq_length, source
    self.seed = seed  # The packing's (short_seq_prob draws, segment splits).

  def __len__(self) -> int:
    return len(self._examples)

  def gather(self, indices) -> dict[str, np.ndarray]:
    return _to_arrays(self._examples.examples(indices), self._max_seq_length)

  @property
  def num_tokens(self) -> int:
    return self._examples.num_tokens


def open_train_examples(config, tokenizer):
  """The training examples: prepared shards if config.train_data_dir is set, else the corpus
  (train_files or tfds_name) tokenized and packed now."""
  data_dir = config.get('train_data_dir')
  if data_dir:
    data_dir = paths.as_found(data_dir)
    metadata = shards.read_metadata(data_dir, 'train')
    shards.check_compatible(metadata, data_dir, config, tokenizer)
    return PreparedExampleBatches(shards.PreparedExamples(data_dir, metadata),
                                  config.max_seq_length, metadata['source'], metadata.get('seed'))
  corpus = sources.open_corpus(config, 'train')
  return InMemoryExamples(_pack_train_corpus(corpus, tokenizer, config), corpus.source)


# Odd, so seed -> seed * _SEED_SPREAD mod 2**32 is a bijection that keeps seed 0's order; it is
# floor(2**32 / golden ratio), which keeps the images of nearby seeds far apart.
_SEED_SPREAD = 0x9E3779B9


# The data order a new run reads (checkpoints record theirs: a run resumes in its own).
# 1: grain's shuffle seeded with config.seed as given (runs started before 2026-12-02).
ORDER_VERSION = 2


def example_order(num_examples: int, seed: int,
                  order_version: int = ORDER_VERSION) -> grain.MapDataset:
  """Indices into the examples, every epoch in a new order, forever.

  grain shuffles epoch e with seed + e: seeds s and s+1 as given would read the same orders one
  epoch apart (order_version 1). Spreading the seeds over the 32-bit range first puts them
  millions of epochs apart.
  """
  if order_version not in (1, ORDER_VERSION):
    raise UserError(f'data order version {order_version} is newer than this electra_jax '
                    f'reads ({ORDER_VERSION}); update electra_jax to resume this run')
  spread_seed = seed if order_version == 1 else seed * _SEED_SPREAD % 2**32
  return grain.MapDataset.range(num_examples).shuffle(seed=spread_seed).repeat(None)


def make_train_iterator(config, tokenizer, rows=None, start: int = 0, examples=None,
                        order_version: int = ORDER_VERSION) -> grain.DatasetIterator:
  """Infinite iterator over this host's `rows` (parallel.process_rows; default: all) of each
  global batch, from global position `start` (examples of the shuffled stream already
  consumed: what a checkpoint stores).

  Yields {'input_ids', 'input_mask', 'segment_ids'}: int32 [len(rows), max_seq_length]; every
  epoch is reshuffled, deterministically from config.seed. Prepared
  shards and streamed text of the same corpus give the same batches. `examples`: what
  open_train_examples returned, if already opened; `order_version`: example_order's.
  """
  rows = np.arange(config.train_batch_size) if rows is None else np.asarray(rows)
  examples = open_train_examples(config, tokenizer) if examples is None else examples
  # Indices into `examples`, in global order; elements are resolved only when a batch is read.
  order = example_order(len(examples), config.seed, order_version)
  host_rows = HostRowsMapDataset(order, config.train_batch_size, rows, start)
  batches = host_rows.batch(len(rows)).map(examples.gather)
  # A small read-ahead on one thread overlaps reading with the train step.
  read_options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)
  dataset = batches.to_iter_dataset(read_options)
  num_workers = config.get('num_data_workers', 0)
  if num_workers:
    # Worker w builds batches w, w + W, ...; they are read back in order, so the batches do
    # not depend on the worker count. grain reads an absl flag of its own: called from Python
    # (a notebook, a test) rather than a command, flags are unparsed, so they keep defaults.
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
  return iter(dataset)


def make_eval_iterator(config, tokenizer, rows=None, num_batches: int | None = None,
                       corpus: sources.Corpus | None = None,
                       rows_per_batch: int | None = None) -> Iterator[dict[str, np.ndarray]]:
  """The eval set in file order: this host's `rows` (parallel.process_rows; default: all) of
  each global batch of eval_batch_size.

  The same examples every call (no shuffle, short_seq_prob 0, fixed seed). The last batch is
  filled with all-zero rows (input_mask 0) so shapes stay static; `num_batches` (None or 0:
  all) stops early, and only what it needs is tokenized. `corpus`: the eval set, if already
  opened (default: the config's, opened now). `rows_per_batch` (default eval_batch_size): more
  rows, all-zero after the eval_batch_size examples, so the batch splits over more devices.
  """
  rows = np.arange(rows_per_batch or config.eval_batch_size) if rows is None else rows
  # A bad glob fails here, not at next().
  corpus = sources.open_corpus(config, 'eval') if corpus is None else corpus
  return _eval_batches(corpus, tokenizer, config, rows, num_batches)


def _eval_batches(corpus, tokenizer, config, rows, num_batches):
  examples = corpus_examples(corpus, tokenizer, config, 'eval')
  global_batch, max_seq_length = config.eval_batch_size, config.max_seq_length
  for step in itertools.count():
    if num_batches and step >= num_batches:
      return
    batch = list(itertools.islice(examples, global_batch))
    if not batch:
      if step == 0:
        raise UserError(f'{corpus.description} produced no examples; check it contains text')
      return
    # Rows past the batch's examples (ascending, so last) stay all zero.
    yield _to_arrays([batch[r] for r in rows if r < len(batch)], max_seq_length, len(rows))


def count_token_frequencies(config, tokenizer, corpus: sources.Corpus | None = None,
                            num_examples: int = 0) -> np.ndarray:
  """Counts [vocab_size] of each token over the eval examples' real, non-special tokens (the
  first `num_examples`; 0: all) of `corpus` (default: the config's eval set)."""
  corpus = sources.open_corpus(config, 'eval') if corpus is None else corpus
  examples = itertools.islice(corpus_examples(corpus, tokenizer, config, 'eval'),
                              num_examples or None)
  counts = np.zeros(tokenizer.vocab_size, np.int64)
  while chunk := list(itertools.islice(examples, 4096)):
    tokens = np.fromiter(itertools.chain.from_iterable(t for t, _ in chunk), np.int64)
    counts += np.bincount(tokens, minlength=tokenizer.vocab_size)
  counts[list(tokenizer.special_ids)] = 0
  return counts
