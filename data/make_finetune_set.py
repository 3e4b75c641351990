"""Builds data/austen_acceptability/: a small CoLA-like sentence classification set from the
bundled Austen corpus, for the fine-tuning demo and the "pretrained beats random init" test.

Each example is one sentence, labelled `acceptable` (Austen's sentence as written) or
`corrupted` (two of its words swapped, or one word replaced by a word drawn from the split's
word-frequency distribution). Every sentence is used at most once, as either the original or
a corrupted copy, so no example has its own fixed version elsewhere in the set.

Train sentences come from the five training novels, eval sentences from *Persuasion*, the
novel held out of pretraining: no eval sentence (nor its source text) is seen in pretraining
or in fine-tuning.

  python data/make_finetune_set.py --corpus_dir=data/demo_corpus \
      --output_dir=data/austen_acceptability --num_train=3000 --num_eval=1000 --seed=0
"""
import argparse
import collections
import glob
import os
import random
import re

# A sentence ends at . ! or ? followed by space and a capital or quote; titles don't end one.
_SENTENCE_END = re.compile(r'(?<!\bMr)(?<!\bMrs)(?<!\bDr)(?<!\bSt)(?<!\bMs)([.!?])\s+(?=["\'A-Z])')
MIN_WORDS, MAX_WORDS = 8, 30


def sentences(paths: list[str]) -> list[str]:
  out = []
  for path in paths:
    with open(path, encoding='utf-8') as f:
      for paragraph in f:
        paragraph = paragraph.strip()
        if not paragraph:
          continue
        for sentence in _SENTENCE_END.sub(r'\1\n', paragraph).split('\n'):
          sentence = sentence.strip()
          if MIN_WORDS <= len(sentence.split()) <= MAX_WORDS and '\t' not in sentence:
            out.append(sentence)
  return out


def corrupt(sentence: str, rng: random.Random, vocabulary: list[str], weights: list[int]) -> str:
  words = sentence.split()
  for _ in range(20):  # Retry until the text actually changes.
    if rng.random() < 0.5:
      i, j = rng.sample(range(len(words)), 2)
      new = list(words)
      new[i], new[j] = new[j], new[i]
    else:
      new = list(words)
      new[rng.randrange(len(words))] = rng.choices(vocabulary, weights)[0]
    if new != words:
      return ' '.join(new)
  raise ValueError(f'cannot corrupt {sentence!r}')


def build(paths: list[str], count: int, rng: random.Random) -> list[tuple[str, str]]:
  pool = sorted(set(sentences(paths)))
  rng.shuffle(pool)
  if len(pool) < count:
    raise SystemExit(f'only {len(pool)} usable sentences in {paths}; ask for fewer')
  frequency = collections.Counter(w for s in pool for w in s.split())
  vocabulary, weights = zip(*sorted(frequency.items()))
  rows = []
  for k, sentence in enumerate(pool[:count]):
    if k % 2:
      rows.append((corrupt(sentence, rng, vocabulary, weights), 'corrupted'))
    else:
      rows.append((' '.join(sentence.split()), 'acceptable'))
  rng.shuffle(rows)
  return rows


def write_tsv(path: str, rows):
  with open(path, 'w', encoding='utf-8') as f:
    f.write('text\tlabel\n')
    for text, label in rows:
      f.write(f'{text}\t{label}\n')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--corpus_dir', default='data/demo_corpus')
  parser.add_argument('--output_dir', default='data/austen_acceptability')
  parser.add_argument('--num_train', type=int, default=3000)
  parser.add_argument('--num_eval', type=int, default=1000)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  rng = random.Random(args.seed)
  train = build(sorted(glob.glob(os.path.join(args.corpus_dir, 'train', '*.txt'))),
                args.num_train, rng)
  evaluation = build(sorted(glob.glob(os.path.join(args.corpus_dir, 'eval', '*.txt'))),
                     args.num_eval, rng)
  os.makedirs(args.output_dir, exist_ok=True)
  write_tsv(os.path.join(args.output_dir, 'train.tsv'), train)
  write_tsv(os.path.join(args.output_dir, 'eval.tsv'), evaluation)
  print(f'wrote {len(train)} train and {len(evaluation)} eval examples to {args.output_dir}')


if __name__ == '__main__':
  main()
