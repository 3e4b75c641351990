"""What each accelerator chip offers: HBM, peak FLOP/s, HBM bandwidth (the one table of them).

TPU figures per chip from the Cloud TPU system architecture pages (read 2026-11-23):
  v4   https://cloud.google.com/tpu/docs/v4   275 TFLOP/s bf16, HBM2 32 GiB, 1200 GB/s
  v5e  https://cloud.google.com/tpu/docs/v5e  197 TFLOP/s bf16, HBM2 16 GB, 819 GB/s
  v5p  https://cloud.google.com/tpu/docs/v5p  459 TFLOP/s bf16, HBM2e 95 GB, 2765 GB/s
  v6e  https://cloud.google.com/tpu/docs/v6e  918 TFLOP/s bf16, HBM 32 GB, 1638 GB/s
`usable_hbm_bytes` is what the TPU compiler itself lets one program use (its out-of-memory
message, "exceeds available HBM (30.75G)", in GiB, with libtpu 0.0.42): a step that compiles
for a topology fits under it. The pages' "GB" of HBM are GiB: the compiler lets a program use
more than the decimal figure (15.75 GiB of v5e's "16 GB"); v5p's "95 GB" is below its usable
95.74 GiB, so `hbm_bytes` counts the whole 96 GiB that holds it.

GPU entries carry only dense peaks: half the datasheets' "with sparsity" figures (NVIDIA's H100,
H200 and A100 datasheets; H100 SXM from the Hopper whitepaper). JAX's default matmul precision
runs float32 matmuls on these GPUs' TF32 tensor cores (jax.lax.Precision.DEFAULT: "On GPU: uses
tensorfloat32 if available"), so float32's peak is TF32's; at jax_default_matmul_precision
'highest' ('float32') they run without tensor cores, at the FP32 peak.
  TFLOP/s      bf16    TF32    FP32
  H100 SXM     989     494.7   67     (H200 the same)
  H100 PCIe    756     378     51     (datasheet: 1,513 / 756 with sparsity)
  H100 NVL     835.5   417.5   60     (datasheet: 1,671 / 835 with sparsity; H200 NVL the same)
  A100         312     156     19.5
"""
import dataclasses

import jax

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class TpuChip:
  """One TPU generation. `cores_per_chip`: the N of a `v4-N` / `v5p-N` name counts
  TensorCores (2 per chip, one JAX device per chip in megacore mode); v5e/v6e names count
  chips."""
  name: str                 # the generation as libtpu topology names spell it: v4, v5p, ...
  device_kind: str          # jax.Device.device_kind
  slice_prefix: str         # the Cloud accelerator-type prefix: v4-N, v5p-N, v5litepod-N, v6e-N
  cores_per_chip: int
  hbm_bytes: int            # physical (the documented figure, in GiB)
  usable_hbm_bytes: int     # what one compiled program may use
  peak_bf16_flops: float    # dense, per chip
  hbm_bytes_per_sec: float


TPU_CHIPS = {c.name: c for c in (
    TpuChip('v4', 'TPU v4', 'v4', 2, 32 * GiB, int(30.75 * GiB), 275e12, 1200e9),
    TpuChip('v5e', 'TPU v5 lite', 'v5litepod', 1, 16 * GiB, int(15.75 * GiB), 197e12, 819e9),
    TpuChip('v5p', 'TPU v5', 'v5p', 2, 96 * GiB, int(95.74 * GiB), 459e12, 2765e9),
    TpuChip('v6e', 'TPU v6 lite', 'v6e', 1, 32 * GiB, int(31.25 * GiB), 918e12, 1638e9),
)}

# Dense peak TFLOP/s per device by device-kind substring, per compute dtype (the MFU of the
# benchmark and of the training log); float32 on GPU: TF32 tensor cores, JAX's default.
PEAK_TFLOPS = {
    'bfloat16': {**{c.device_kind: c.peak_bf16_flops / 1e12 for c in TPU_CHIPS.values()},
                 **{f'TPU {c.name}': c.peak_bf16_flops / 1e12 for c in TPU_CHIPS.values()},
                 'H100': 989, 'H100 PCIe': 756, 'H100 NVL': 835.5, 'H200': 989,
                 'H200 NVL': 835.5, 'A100': 312},
    'float32': {'H100': 494.7, 'H100 PCIe': 378, 'H100 NVL': 417.5, 'H200': 494.7,
                'H200 NVL': 417.5, 'A100': 156},
}
# float32 without tensor cores, where jax_default_matmul_precision asks for full float32.
FP32_TFLOPS = {'H100': 67, 'H100 PCIe': 51, 'H100 NVL': 60, 'H200': 67, 'H200 NVL': 60,
               'A100': 19.5}
FULL_FLOAT32 = ('highest', 'float32', 'F32_F32_F32')


def peak_tflops(device_kind: str, dtype: str, override: float | None) -> tuple[float | None, str]:
  """(peak TFLOP/s per device, where it came from); the longest matching table name wins.
  float32 reads jax_default_matmul_precision: TF32 tensor cores unless it asks for float32."""
  if override is not None:
    return override, '--peak_tflops'
  table, units = PEAK_TFLOPS.get(dtype, {}), ''
  if dtype == 'float32':
    full = jax.config.jax_default_matmul_precision in FULL_FLOAT32
    table, units = (FP32_TFLOPS, ' (FP32)') if full else (table, ' (TF32 tensor cores)')
  matches = [name for name in table if name.lower() in device_kind.lower()]
  if not matches:
    return None, f'no {dtype} peak known for {device_kind!r}; pass --peak_tflops'
  name = max(matches, key=len)
  return float(table[name]), f'table: {name} {dtype} dense{units}'
