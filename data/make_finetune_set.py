"""Builds data/austen_novels/: a small sentence classification set from the bundled Austen
corpus (which of the five training novels a sentence comes from), for the fine-tuning demo
(configs/finetune/files.py) and the "pretrained vs random init" comparison.

Sentences of 8-30 words are taken from data/demo_corpus/train (one file per novel, one
chapter per blank-line-separated document). Every 4th chapter of each novel goes to eval, the
rest to train, so no eval sentence shares a chapter (scene, conversation) with a training
sentence. The pretraining corpus does contain these sentences (unlabelled), as a pretraining
corpus usually contains text like the downstream task's; *Persuasion* (held out of
pretraining) cannot be used because it is not one of the classes.

  python data/make_finetune_set.py --corpus_dir=data/demo_corpus \
      --output_dir=data/austen_novels --num_train=2000 --num_eval=1000 --seed=0
"""
import argparse
import glob
import os
import random
import re

# A sentence ends at . ! or ? followed by space and a capital or quote; titles don't end one.
_SENTENCE_END = re.compile(r'(?<!\bMr)(?<!\bMrs)(?<!\bDr)(?<!\bSt)(?<!\bMs)([.!?])\s+(?=["\'A-Z])')
MIN_WORDS, MAX_WORDS = 8, 30


def chapter_sentences(path: str) -> list[list[str]]:
  """Sentences (whitespace-normalised, 8-30 words) of each chapter of one novel."""
  with open(path, encoding='utf-8') as f:
    chapters = f.read().split('\n\n')
  out = []
  for chapter in chapters:
    found = []
    for paragraph in chapter.splitlines():
      for sentence in _SENTENCE_END.sub(r'\1\n', paragraph.strip()).split('\n'):
        sentence = ' '.join(sentence.split())
        if MIN_WORDS <= len(sentence.split()) <= MAX_WORDS:
          found.append(sentence)
    out.append(found)
  return out


def split_chapters(path: str) -> tuple[list[str], list[str]]:
  """(train, eval) sentences of one novel: every 4th chapter's go to eval."""
  train, evaluation = [], []
  for k, chapter in enumerate(chapter_sentences(path)):
    (evaluation if k % 4 == 3 else train).extend(chapter)
  return train, evaluation


def build(paths: list[str], num_train: int, num_eval: int, rng: random.Random):
  train, evaluation = [], []
  for path in paths:
    label = os.path.splitext(os.path.basename(path))[0]
    novel_train, novel_eval = split_chapters(path)
    train += [(s, label) for s in novel_train]
    evaluation += [(s, label) for s in novel_eval]
  for rows in (train, evaluation):
    rng.shuffle(rows)
  if len(train) < num_train or len(evaluation) < num_eval:
    raise SystemExit(f'only {len(train)} train / {len(evaluation)} eval sentences available')
  return train[:num_train], evaluation[:num_eval]


def write_tsv(path: str, rows):
  with open(path, 'w', encoding='utf-8') as f:
    f.write('text\tlabel\n')
    for text, label in rows:
      f.write(f'{text}\t{label}\n')


def parse_args(doc: str, output_dir: str, num_train: int, num_eval: int) -> argparse.Namespace:
  """The flags every data/make_*_set.py script takes (its defaults build the bundled set)."""
  parser = argparse.ArgumentParser(description=doc.split('\n\n', maxsplit=1)[0])
  parser.add_argument('--corpus_dir', default='data/demo_corpus')
  parser.add_argument('--output_dir', default=output_dir)
  parser.add_argument('--num_train', type=int, default=num_train)
  parser.add_argument('--num_eval', type=int, default=num_eval)
  parser.add_argument('--seed', type=int, default=0)
  return parser.parse_args()


def write_splits(output_dir: str, write, extension: str, train, evaluation, unit: str):
  """Writes OUTPUT_DIR/train.EXT and eval.EXT with write(path, rows) and says so."""
  os.makedirs(output_dir, exist_ok=True)
  write(os.path.join(output_dir, f'train.{extension}'), train)
  write(os.path.join(output_dir, f'eval.{extension}'), evaluation)
  print(f'wrote {len(train)} train and {len(evaluation)} eval {unit} to {output_dir}')


def main():
  args = parse_args(__doc__, 'data/austen_novels', 2000, 1000)
  train, evaluation = build(sorted(glob.glob(os.path.join(args.corpus_dir, 'train', '*.txt'))),
                            args.num_train, args.num_eval, random.Random(args.seed))
  write_splits(args.output_dir, write_tsv, 'tsv', train, evaluation, 'examples')


if __name__ == '__main__':
  main()
