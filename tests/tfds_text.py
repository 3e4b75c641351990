"""A tiny TFDS text builder ({'id', 'text', 'title'}, one document per record), defined once:
TFDS registers builders by name, so two test modules defining it would collide."""
import os

import numpy as np
import tensorflow_datasets as tfds

from electra_jax.data import sources
from tests.conftest import REPO_ROOT

PERSUASION = os.path.join(REPO_ROOT, 'data', 'demo_corpus', 'eval', 'persuasion.txt')
NUM_DOCS = 12


def documents():
  paragraphs = [line for doc in sources.read_documents([PERSUASION]) for line in doc]
  return ['\n'.join(paragraphs[i * 5:i * 5 + 1 + i % 5]) for i in range(NUM_DOCS)]


class ElectraTestText(tfds.core.GeneratorBasedBuilder):
  """NUM_DOCS documents of the bundled eval text, in one 'train' split."""
  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'id': np.int32, 'text': tfds.features.Text(), 'title': tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples()}

  def _generate_examples(self):
    for i, text in enumerate(documents()):
      yield i, {'id': i, 'text': text, 'title': f'doc {i}'}


def prepare(root: str) -> str:
  """The dataset prepared in ArrayRecord under data_dir `root`."""
  ElectraTestText(data_dir=root, file_format='array_record').download_and_prepare()
  return root
