"""Host-neutral checkpoint reading: the experts of a safetensors checkpoint into a KTMoE.

* :mod:`.files` -- :func:`~.files.open_regular`, the one way a checkpoint file is opened (a FIFO is refused, never
  waited on), and the readers over it (JSON, a safetensors header, safetensors' ``safe_open``);
* :mod:`.safetensors_dir` -- :class:`SafetensorsCheckpoint`, a directory of shards read a tensor or a row at a time;
* :mod:`.fused_layout` -- :class:`FusedLayout`, the row order of fused ``gate_up`` / ``down`` tensors;
* one module per reader kind: :mod:`.dense` (fused tensors, :data:`PER_EXPERT_LAYOUTS`),
  :mod:`.mxfp4` (gpt-oss), :mod:`.fp8` (FP8 blocks or rows), :mod:`.fp4` (DeepSeek-V4's FP4), :mod:`.compressed_tensors` (pack-quantized int4)
  and :mod:`.gptq` (GPTQ / AWQ int4) over :mod:`.int4_linear`; :mod:`.experts` -- :func:`find_experts` picks
  one (:data:`READERS`); :mod:`.int4_config` checks an int4 checkpoint's quantization_config;
* :mod:`.fingerprint` -- :func:`checkpoint_fingerprint`, what a checkpoint's packed cache files are checked against;
* :mod:`.load` -- :func:`load_experts`, the recipe each host runs per experts block (cache hit, else pack).

The host wings (``torch_ktmoe.hf``, ``torch_ktmoe.sglang``) import this package and the core; this
package imports the core only.
"""
from .compressed_tensors import CompressedTensorsExperts, read_pack_quantized
from .dense import PER_EXPERT_LAYOUTS, FusedExperts, PerExpertTensors
from .experts import MOE_BLOCK_NAMES, READERS, find_experts
from .fingerprint import checkpoint_fingerprint
from .fp4 import Fp4Experts
from .fp8 import Fp8Experts, dequantize_fp8, group_scales
from .fused_layout import CONCATENATED, FusedLayout
from .gptq import GptqExperts, read_gptq
from .int4_config import INT4_QUANT_METHODS, check_int4_config
from .int4_linear import Int4Experts, Int4Linear
from .load import (as_kernel_input, exact_format, exact_group_size, load_experts, make_ktmoe, reader_experts,
                   utf8_path)
from .mxfp4 import Mxfp4Experts, dequantize_mxfp4, quantize_mxfp4
from .safetensors_dir import SafetensorsCheckpoint

__all__ = [
    "SafetensorsCheckpoint", "FusedLayout", "CONCATENATED", "PER_EXPERT_LAYOUTS", "FusedExperts", "PerExpertTensors",
    "Mxfp4Experts", "dequantize_mxfp4", "quantize_mxfp4", "Fp8Experts", "Fp4Experts", "dequantize_fp8", "group_scales", "READERS",
    "MOE_BLOCK_NAMES",
    "find_experts", "checkpoint_fingerprint", "make_ktmoe", "as_kernel_input", "load_experts", "reader_experts",
    "utf8_path", "Int4Linear", "Int4Experts", "CompressedTensorsExperts", "read_pack_quantized", "GptqExperts",
    "read_gptq", "INT4_QUANT_METHODS", "check_int4_config", "exact_format", "exact_group_size",
]
