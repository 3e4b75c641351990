"""A TFDS text dataset (wikipedia, c4, a user's builder) as documents, without TensorFlow.

Reads by random access through `tfds` data sources, which need the dataset prepared in the
ArrayRecord format (`tfds build NAME --file_format=array_record`). Each record is one document;
its text splits into lines on newlines, like a paragraph-per-line text file.
"""
import dataclasses
from typing import Iterator

import numpy as np

from electra_jax import paths
from electra_jax.data import sources
from electra_jax.errors import UserError, first_line


def _build_hint(name: str, data_dir: str | None) -> str:
  where = f' --data_dir={data_dir}' if data_dir else ''
  return (f'prepare it with `tfds build {name} --file_format=array_record{where}` (or point '
          '--config.tfds_data_dir at the directory that holds it)')


@dataclasses.dataclass
class TfdsTextSource:
  """Random access to one split's text feature; `len` records, each one document."""
  name: str
  split: str
  text_key: str
  data_source: object

  @property
  def description(self) -> str:
    return f"TFDS '{self.name}' split '{self.split}'"

  def __len__(self) -> int:
    return len(self.data_source)

  def texts(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
    """The text of records [start, stop) (bytes from real data, str from tfds mocks)."""
    stop = len(self) if stop is None else min(stop, len(self))
    for i in range(start, stop):
      text = self.data_source[i][self.text_key]
      yield text.decode('utf-8', errors='replace') if isinstance(text, bytes) else str(text)

  def records(self) -> Iterator[list[list[str]]]:
    """Each record's documents, in the split's stored order: its non-empty stripped lines as
    one document, or none if it has no text."""
    for text in self.texts():
      lines = sources.text_lines(text)
      yield [lines] if lines else []


def dataset_dir_name(name: str) -> str:
  """Where TFDS keeps dataset `name` under its data_dir: `builder[/config]`, without the
  version (a pattern such as 1.* may pick any) or a community namespace (`huggingface:ag_news`
  is stored as `ag_news`)."""
  from tensorflow_datasets.core import naming  # pylint: disable=import-outside-toplevel
  from tensorflow_datasets.core.utils import conversion_utils  # pylint: disable=import-outside-toplevel
  try:
    dataset, kwargs = naming.parse_builder_name_kwargs(name)
  except ValueError:
    raise UserError(f'config.tfds_name={name!r} is not a TFDS name; write it as '
                    'dataset[/config][:version], e.g. wikipedia/20230601.en') from None
  builder = dataset.name
  if dataset.namespace == 'huggingface':
    builder = conversion_utils.to_tfds_name(builder)
  config = kwargs.get('config')
  return f'{builder}/{config}' if config else builder


def local_data_dir(data_dir: str | None, name: str) -> str | None:
  """The TFDS data directory to open: `data_dir` itself, or for a remote one (gs://) a local
  copy of the dataset's directory (ArrayRecord reads local files only; copied once into
  paths.CACHE_DIR). A remote dataset must be prepared already."""
  if not data_dir or not paths.is_remote(data_dir):
    return data_dir or None
  relative = dataset_dir_name(name)
  source = paths.join(data_dir, relative)
  if not paths.is_dir(source):
    raise UserError(f"TFDS dataset '{name}' is not prepared in {data_dir} ({source} does not "
                    f'exist); {_build_hint(name, data_dir)}')
  local = paths.local_copy(source)
  return local[:-len(relative)].rstrip('/')


def _is_text(feature) -> bool:
  """A feature holding one string a record (tfds Text, or a scalar string Tensor)."""
  try:
    return np.dtype(feature.np_dtype).kind in 'OSU' and tuple(feature.shape) == ()
  except (AttributeError, TypeError):  # A FeaturesDict, or no single dtype.
    return False


def open_text_source(name: str, split: str, text_key: str,
                     data_dir: str | None = None) -> TfdsTextSource:
  """Opens a prepared TFDS split, or a UserError saying what is missing and how to fix it."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise UserError("config.tfds_name is set but tensorflow_datasets is not installed; "
                    "pip install 'tensorflow-datasets>=4.9.10' array-record") from None
  try:
    builder = tfds.builder(name, data_dir=local_data_dir(data_dir, name))
  except tfds.core.registered.DatasetNotFoundError:
    raise UserError(f"TFDS dataset '{name}' not found (data_dir={data_dir or 'default'}); "
                    f'check --config.tfds_name, or {_build_hint(name, data_dir)}') from None
  except Exception as e:  # pylint: disable=broad-except  # Builder code that cannot load.
    raise UserError(f"cannot load TFDS dataset '{name}': {type(e).__name__}: "
                    f'{first_line(e)}; {_build_hint(name, data_dir)}') from None
  features = sorted(builder.info.features.keys())
  if text_key not in features:
    raise UserError(f"config.text_key={text_key!r} is not a feature of TFDS dataset "
                    f"'{name}'; its features are {features}")
  if not _is_text(builder.info.features[text_key]):  # str() of a number would be read as text.
    texts = [k for k in features if _is_text(builder.info.features[k])]
    raise UserError(f"config.text_key={text_key!r} is not a text feature of TFDS dataset "
                    f"'{name}'; its text features are {texts}")
  try:
    data_source = builder.as_data_source(split=split)
  except Exception as e:  # pylint: disable=broad-except
    if not builder.is_prepared():
      raise UserError(f"TFDS dataset '{name}' is not prepared in {builder.data_dir}; "
                      f'{_build_hint(name, data_dir)}') from None
    file_format = getattr(builder.info.file_format, 'value', builder.info.file_format)
    if file_format != 'array_record':
      raise UserError(f"TFDS dataset '{name}' in {builder.data_dir} is stored as "
                      f'{file_format}, which has no random access without TensorFlow; rebuild '
                      f'it with `tfds build {name} --file_format=array_record`') from None
    raise UserError(f"config.tfds_split={split!r} does not work for TFDS dataset '{name}' "
                    f'({first_line(e)}); its splits are {sorted(builder.info.splits)}'
                    ) from None
  return TfdsTextSource(name, split, text_key, data_source)
