"""Rebuilds data/demo_corpus/ from the plain-text novels of Debian's r-cran-janeaustenr.

Input: the six /tmp/austen_*.txt files written by the R one-liner in data/README.md (hard-
wrapped lines, blank lines between paragraphs, "CHAPTER I" / "Chapter 1" headings).
Output, in the official ELECTRA/BERT pretraining format: one paragraph per line, documents
(= chapters) separated by one blank line. Train: five novels; eval: Persuasion.

  python data/make_demo_corpus.py --input_dir=/tmp --output_dir=data/demo_corpus
"""
import argparse
import os
import re

NOVELS = {  # File written by the R one-liner -> our name (no '&' in file names).
    'austen_emma.txt': 'emma.txt',
    'austen_mansfield_park.txt': 'mansfield_park.txt',
    'austen_northanger_abbey.txt': 'northanger_abbey.txt',
    'austen_pride_&_prejudice.txt': 'pride_and_prejudice.txt',
    'austen_sense_&_sensibility.txt': 'sense_and_sensibility.txt',
    'austen_persuasion.txt': 'persuasion.txt',
}
EVAL_NOVELS = {'persuasion.txt'}
CHAPTER_HEADING = re.compile(r'^(CHAPTER|Chapter)\s+[\dIVXLC]+\.?$')
# Headings and end marks inside the text; the title page comes before the first chapter.
SKIPPED_LINE = re.compile(r'^(VOLUME|Volume)\s+[\dIVXLC]+$|^(THE END|FINIS|Finis)$')
# A modern editor's note appended to Northanger Abbey: not Austen's text, maybe not free.
END_OF_TEXT = re.compile(r'^A NOTE ON THE TEXT$')


def chapters(lines: list[str]):
  """Yields each chapter as a list of paragraphs; front matter before chapter 1 is dropped."""
  chapter, paragraph, started = [], [], False
  for raw in lines + ['']:
    line = raw.strip()
    if END_OF_TEXT.match(line):
      break
    if CHAPTER_HEADING.match(line):
      if paragraph:
        chapter.append(' '.join(paragraph))
      if started and chapter:
        yield chapter
      chapter, paragraph, started = [], [], True
    elif not started or SKIPPED_LINE.match(line):
      continue
    elif line:
      paragraph.append(line)
    elif paragraph:
      chapter.append(' '.join(paragraph))
      paragraph = []
  if paragraph:
    chapter.append(' '.join(paragraph))
  if started and chapter:
    yield chapter


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--input_dir', default='/tmp')
  parser.add_argument('--output_dir',
                      default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                           'demo_corpus'))
  args = parser.parse_args()
  for source, name in NOVELS.items():
    with open(os.path.join(args.input_dir, source), encoding='utf-8') as f:
      lines = f.read().splitlines()
    docs = list(chapters(lines))
    split = 'eval' if name in EVAL_NOVELS else 'train'
    os.makedirs(os.path.join(args.output_dir, split), exist_ok=True)
    with open(os.path.join(args.output_dir, split, name), 'w', encoding='utf-8') as f:
      f.write('\n\n'.join('\n'.join(doc) for doc in docs) + '\n')
    print(f'{split}/{name}: {len(docs)} chapters, {sum(map(len, docs))} paragraphs')


if __name__ == '__main__':
  main()
