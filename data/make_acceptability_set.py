"""Builds data/austen_acceptability/: a small acceptability set in the spirit of CoLA (is this
sentence as Austen wrote it, or have some of its words been replaced or moved?), the bundled
task on which pretraining the demo model shows (README, "What to expect from the demo").

Half of the sentences are kept as written ("acceptable"); in the other half ("corrupted") a
fifth of the words after the first (at least two) are either replaced by words drawn from the
training novels' non-initial words (so a replaced word is as frequent as the word it stands for
would be on average: no single word gives the label away) or swapped with their right
neighbours (every word is still the author's: only the order is wrong), one or the other with
equal chance. The first word is never touched, so capitalisation at the start says nothing.

Training sentences come from the five training novels (data/demo_corpus/train); evaluation
sentences from *Persuasion* (data/demo_corpus/eval), which pretraining never sees, so a
pretrained model cannot tell an evaluation sentence from its corruption by having read it.
Sentences are those of data/make_finetune_set.py (8-30 words).

  python data/make_acceptability_set.py --corpus_dir=data/demo_corpus \
      --output_dir=data/austen_acceptability --num_train=2000 --num_eval=1000 --seed=0
"""
import glob
import os
import random

from make_finetune_set import chapter_sentences
from make_finetune_set import parse_args
from make_finetune_set import write_splits
from make_finetune_set import write_tsv

CORRUPTED_FRACTION = 0.2  # Of a corrupted sentence's words after the first; at least two.


def sentences(path: str) -> list[str]:
  return [s for chapter in chapter_sentences(path) for s in chapter]


def corrupt(words: list[str], replacements: list[str], rng: random.Random) -> list[str]:
  """`words` with a fifth of them (not the first) replaced, or swapped with their neighbours;
  never the sentence itself (swaps can undo each other: drawn again)."""
  count = max(2, round(CORRUPTED_FRACTION * (len(words) - 1)))
  replace = rng.random() < 0.5
  if len(set(words[1:])) == 1:  # No swap after the first word changes the sentence.
    replace = True
  while True:
    out = list(words)
    if replace:
      for i in rng.sample(range(1, len(out)), count):
        new = rng.choice(replacements)
        while new == out[i]:
          new = rng.choice(replacements)
        out[i] = new
    else:
      for _ in range(count):
        i = rng.randrange(1, len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    if out != words:
      return out


def labelled(texts: list[str], replacements: list[str], rng: random.Random):
  rows = []
  for text in texts:
    if rng.random() < 0.5:
      rows.append((text, 'acceptable'))
    else:
      rows.append((' '.join(corrupt(text.split(), replacements, rng)), 'corrupted'))
  return rows


def build(train_paths: list[str], eval_path: str, num_train: int, num_eval: int,
          rng: random.Random):
  train = [s for path in train_paths for s in sentences(path)]
  evaluation = sentences(eval_path)
  if len(train) < num_train or len(evaluation) < num_eval:
    raise SystemExit(f'only {len(train)} train / {len(evaluation)} eval sentences available')
  replacements = [w for s in train for w in s.split()[1:]]
  rng.shuffle(train)
  rng.shuffle(evaluation)
  return (labelled(train[:num_train], replacements, rng),
          labelled(evaluation[:num_eval], replacements, rng))


def main():
  args = parse_args(__doc__, 'data/austen_acceptability', 2000, 1000)
  train, evaluation = build(sorted(glob.glob(os.path.join(args.corpus_dir, 'train', '*.txt'))),
                            os.path.join(args.corpus_dir, 'eval', 'persuasion.txt'),
                            args.num_train, args.num_eval, random.Random(args.seed))
  write_splits(args.output_dir, write_tsv, 'tsv', train, evaluation, 'examples')


if __name__ == '__main__':
  main()
