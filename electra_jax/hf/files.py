"""Reading and writing transformers checkpoint directories (config.json + weights).

Weights are read from model.safetensors; a pickle-based pytorch_model.bin only through
torch.load(weights_only=True), so a downloaded checkpoint cannot run code.
"""

import ml_dtypes
import numpy as np

from electra_jax import atomic
from electra_jax import paths
from electra_jax.data import tokenizer as tokenizer_lib
from electra_jax.errors import UserError, first_line
from electra_jax.hf import configs
from electra_jax.hf import weights

SAFETENSORS_FILE = 'model.safetensors'
TORCH_FILE = 'pytorch_model.bin'
EXTRA_HINT = "install the transformers extra: pip install -e '.[hf]'"
# safetensors' dtype names -> NumPy's; bfloat16 (save_pretrained of a model in torch.bfloat16),
# which safetensors.numpy cannot read, from ml_dtypes (JAX's). Read as float32.
_SAFETENSORS_DTYPES = {
    'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'BF16': ml_dtypes.bfloat16,
    'I64': np.int64, 'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8,
    'BOOL': np.bool_}


def is_hf_dir(path) -> bool:
  """A transformers model directory: config.json naming a model_type (a workdir's never
  does). One this reader cannot take (another model type, sharded or TF/Flax-only weights) is
  a one-line error saying so here: treated as no transformers directory, it was refused as a
  workdir "not written by train", with advice to pass what the user had passed."""
  directory = paths.get(path)
  config_file = directory / 'config.json'
  try:
    record = paths.read_json(config_file)
  except OSError:  # No config.json; a damaged one is read_json's one-line error.
    return False
  if 'model_type' not in record:
    return False
  configs.check_hf_config(record, f"'{config_file}'")
  if not any((directory / name).exists() for name in (SAFETENSORS_FILE, TORCH_FILE)):
    raise _no_weights(path)
  return True


def _no_weights(directory) -> UserError:
  return UserError(f"'{directory}' has neither {SAFETENSORS_FILE} nor {TORCH_FILE} (sharded "
                   'checkpoints and TF/Flax-only weights are not read); re-save it in one file '
                   'with save_pretrained(..., max_shard_size="100GB")')


def read_config(directory) -> dict:
  """An HF directory's config.json as a dict, or a UserError saying what the directory lacks."""
  path = paths.get(directory) / 'config.json'
  if not path.exists():
    raise UserError(f"'{directory}' has no config.json; pass a transformers checkpoint "
                    f'directory (config.json + {SAFETENSORS_FILE} or {TORCH_FILE})')
  return paths.read_json(path)


_LFS_POINTER = b'version https://git-lfs.github.com/spec/'


def _check_not_lfs_pointer(weights_file):
  """A clone made without git-lfs holds ~130-byte pointer files where the weights belong."""
  with weights_file.open('rb') as f:
    if f.read(len(_LFS_POINTER)) == _LFS_POINTER:
      raise UserError(f"'{weights_file}' is a Git LFS pointer, not the weights; fetch them "
                      '(git lfs install, then git lfs pull in that clone) and run again')


def read_dir(directory) -> tuple[dict, dict[str, np.ndarray]]:
  """(config.json as a dict, float32 numpy state dict) of a transformers checkpoint directory."""
  hf_config = read_config(directory)
  safetensors_file = paths.get(directory) / SAFETENSORS_FILE
  torch_file = paths.get(directory) / TORCH_FILE
  if safetensors_file.exists():
    _check_not_lfs_pointer(safetensors_file)
    try:
      # pylint: disable-next=import-outside-toplevel
      from safetensors import SafetensorError, deserialize
    except ImportError as e:
      raise UserError(f'reading {safetensors_file} needs safetensors; {EXTRA_HINT}') from e
    try:
      tensors = deserialize(safetensors_file.read_bytes())
    except SafetensorError as e:
      raise UserError(f"'{safetensors_file}' is not a readable safetensors file "
                      f'({first_line(e)}; cut short?); copy or save it again') from None
    state = {}
    for name, tensor in tensors:
      dtype = _SAFETENSORS_DTYPES.get(tensor['dtype'])
      if dtype is None:
        raise UserError(f"{safetensors_file}: tensor {name} is {tensor['dtype']}, which this "
                        'reader does not take; re-save the model in float32, float16 or '
                        'bfloat16')
      state[name] = np.frombuffer(tensor['data'], dtype).reshape(tensor['shape']).astype(
          np.float32)
    return hf_config, state
  if torch_file.exists():
    _check_not_lfs_pointer(torch_file)
    try:
      import torch  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise UserError(f'reading {torch_file} needs torch; {EXTRA_HINT}') from e
    with torch_file.open('rb') as f:
      try:
        loaded = torch.load(f, map_location='cpu', weights_only=True)
      except Exception as e:  # pylint: disable=broad-except
        raise UserError(f'{torch_file} does not load as plain tensors ({type(e).__name__}); '
                        'only weights are read from pickles, never code: convert it to '
                        f'{SAFETENSORS_FILE} with a tool you trust') from None
    if not (isinstance(loaded, dict) and all(isinstance(v, torch.Tensor)
                                             for v in loaded.values())):
      raise UserError(f"'{torch_file}' holds a {type(loaded).__name__}, not a state dict (names "
                      'to tensors); save the model with save_pretrained')
    return hf_config, {k: v.float().numpy() for k, v in loaded.items()}
  raise _no_weights(directory)


def write_dir(directory, hf_config: dict, state: dict):
  """config.json + model.safetensors into `directory` (created)."""
  directory = paths.get(directory)
  directory.mkdir(parents=True, exist_ok=True)
  atomic.write_json(directory / 'config.json', hf_config, sort_keys=True)
  try:
    from safetensors.numpy import save  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise UserError(f'writing safetensors needs safetensors; {EXTRA_HINT}') from e
  (directory / SAFETENSORS_FILE).write_bytes(save(state, metadata={'format': 'pt'}))


def write_model(params, config, network: str, directory,
                pad_token_id: int = tokenizer_lib.PAD_ID):
  """One pretraining network (ElectraForPreTraining or ElectraForMaskedLM) into `directory`."""
  write_dir(directory, configs.hf_config_dict(config, network, pad_token_id),
            weights.params_to_hf(params, config, network))
