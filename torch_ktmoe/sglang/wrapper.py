"""KTMoEWrapper: the CPU experts of sglang's KTransformers path, run by torch_ktmoe.

sglang 0.5.23's ``KTEPWrapperMethod`` (``sglang/srt/layers/moe/kt_ep_wrapper.py``)
drives it unchanged, as it drives ``kt_kernel.KTMoEWrapper``:

* ``KTMoEWrapper(layer_idx, num_experts, num_experts_per_tok, hidden_size,
  moe_intermediate_size, num_gpu_experts, cpuinfer_threads, threadpool_count,
  weight_path, chunked_prefill_size, method=..., ...)`` in ``create_weights``;
* ``load_weights(physical_to_logical_map)`` after sglang loaded the GPU experts;
* per forward ``submit_forward(x, topk_ids, topk_weights, cuda_stream)``, then the
  GPU experts (sglang masks ``topk_ids`` in place and may overwrite ``x``), then
  ``sync_forward(x, cuda_stream)`` whose result sglang adds to the GPU output.

Experts ``[0, G)`` (or those set in ``gpu_experts_mask``) live on the GPU; only the
others are packed, into one :class:`torch_ktmoe.KTMoE` of ``E_cpu`` experts.
``topk_ids`` are mapped to CPU slots through a table (GPU experts -> -1, skipped).
The CPU forward runs on one worker thread; ``torch.ops.ktmoe.moe_forward``
releases the GIL, so the caller's GPU work overlaps it.

Next-layer prefetch (:mod:`torch_ktmoe.residency.predictor`, wired by :mod:`.next_layer`). Before running its experts, a
wrapper applies the next MoE layer's router (read from the checkpoint, once) to the hidden state it was given and
reads the predicted experts that the next wrapper of the same model holds on the CPU ahead (logical ids -> that
wrapper's CPU slots; GPU experts are not read), while that layer asks for it (``next_layer_prefetch``: ``"auto"``,
the default, while its file-backed experts do not fit; ``True`` always, ``False`` never). A failed prediction
switches itself off for the layer with one warning; the forward never changes.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import List, Optional, Sequence

import torch

from .. import ops
from ..checkpoint import (SafetensorsCheckpoint, as_kernel_input, checkpoint_fingerprint, exact_group_size,
                          load_experts, make_ktmoe, reader_experts, utf8_path)
from ..layer import GGUF_FORMAT, KTMoE
from ..residency.predictor import NextLayerPredictor, warn_prefetch_off
from ..ops import GATED_ACTIVATIONS
from ..ops import activation_params as activation_params_of
from .checkpoint import (GPT_OSS_LAYOUT, check_weight_path, checkpoint_config, config_number, is_gpt_oss,
                         layer_biases, layer_experts)
from .gguf_dir import gguf_layer_experts
from .next_layer import join_model, next_router, same_shape

log = logging.getLogger("torch_ktmoe.sglang")

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_NONFINITE_SLOT = re.compile(r"non-finite weight .* in expert (\d+) of ")  # ktmoe::pack_experts' error
MMAP_DIR_ENV = "KTMOE_SGLANG_MMAP_EXPERTS_DIR"  # default of mmap_experts_dir= (set by --kt-mmap-experts-dir)

# kt-kernel / sglang --kt-method names -> our weight formats
METHOD_FORMATS = {
    "BF16": "bf16",
    "INT8": "int8", "AMXINT8": "int8", "MOE_INT8": "int8",
    "INT4": "int4", "AMXINT4": "int4", "MOE_INT4": "int4",
    "FP8": "fp8", "FP8_PERCHANNEL": "fp8",  # e4m3 + 128x128 block / per-row scales, packed exactly
    # int4 codes + group scales (+ zero points), packed exactly: compressed-tensors pack-quantized, GPTQ / AWQ
    "RAWINT4": "int4_affine", "GPTQ_INT4": "int4_affine",
    "MXFP4": "mxfp4",  # e2m1 codes + E8M0 scales per 32 inputs (DeepSeek-V4 fp4 experts, gpt-oss), packed exactly
    "LLAMAFILE": GGUF_FORMAT,  # a GGUF model's experts (--kt-weight-path: its directory), computed where they lie
}


def weight_format_of(method: str) -> str:
    """``--kt-method`` -> ``"bf16" | "int8" | "int4" | "fp8" | "int4_affine" | "mxfp4" | "gguf"``; ValueError
    naming it and the supported ones."""
    fmt = METHOD_FORMATS.get(str(method).upper())
    if fmt is None:
        raise ValueError(f"KTMoEWrapper: method {method!r} is not supported by torch_ktmoe (it packs bf16, int8, "
                         f"int4, fp8, int4_affine and mxfp4 from bf16/fp16/fp32, FP8, compressed-tensors int4, GPTQ / "
                         f"AWQ or MXFP4 safetensors, and runs GGUF files in place; kt-kernel's pre-converted AMX "
                         f"files are not read); supported "
                         f"methods: {sorted(METHOD_FORMATS)}")
    return fmt


def _gpu_mask(num_experts: int, num_gpu_experts, gpu_experts_mask) -> torch.Tensor:
    """bool [E]: True for the experts that run on the GPU."""
    if gpu_experts_mask is not None:
        mask = torch.as_tensor(gpu_experts_mask).detach().to("cpu", torch.bool).reshape(-1)
        if mask.numel() != num_experts:
            raise ValueError(f"KTMoEWrapper: gpu_experts_mask has {mask.numel()} entries, expected num_experts="
                             f"{num_experts}")
        if num_gpu_experts is not None and int(num_gpu_experts) != int(mask.sum()):
            raise ValueError(f"KTMoEWrapper: num_gpu_experts={num_gpu_experts} disagrees with gpu_experts_mask "
                             f"({int(mask.sum())} experts set)")
    else:
        g = 0 if num_gpu_experts is None else int(num_gpu_experts)
        if not 0 <= g < num_experts:
            raise ValueError(f"KTMoEWrapper: num_gpu_experts={g} must be in [0, num_experts={num_experts}): "
                             "the CPU must hold at least one expert")
        mask = torch.arange(num_experts) < g
    if bool(mask.all()):
        raise ValueError(f"KTMoEWrapper: every one of the {num_experts} experts is on the GPU; nothing to run on CPU")
    return mask


class KTMoEWrapper:
    """CPU experts of one sglang MoE layer (see the module docstring for the call sequence).

    Args (kt-kernel's names): ``num_experts`` E (physical ids), ``num_experts_per_tok``
    k, ``hidden_size`` H, ``moe_intermediate_size`` I; ``num_gpu_experts`` G (experts
    ``[0, G)`` on the GPU) or ``gpu_experts_mask`` (bool [E]); ``weight_path`` the
    safetensors directory (``method="LLAMAFILE"``: a directory holding a GGUF model, whose experts run where they
    lie, all E of them mapped and the GPU experts never routed here; ``mmap_experts_dir`` is not used: the GGUF is
    the file); ``method`` (``--kt-method``, see :data:`METHOD_FORMATS`);
    ``mmap_experts_dir`` keeps the packed experts in files there (default: ``$KTMOE_SGLANG_MMAP_EXPERTS_DIR``, set by
    ``--kt-mmap-experts-dir``; ``""``: anonymous memory; with a directory, the packed cache is reused across
    restarts); ``activation`` / ``activation_params`` the experts' gated activation, a row of
    ``ops.GATED_ACTIVATIONS`` (sglang 0.5.23's KT path passes none: then the checkpoint's, gpt-oss's clamped SwiGLU
    ``"swiglu_oai"`` with its config's ``swiglu_alpha`` / ``swiglu_limit`` for a gpt-oss checkpoint, else
    ``"silu"``, decided at the load; a gpt-oss checkpoint's interleaved gate/up and expert biases are read too:
    :func:`~torch_ktmoe.sglang.checkpoint.is_gpt_oss` recognises it from config.json or its tensors);
    ``next_layer_prefetch``
    (``"auto"`` default, ``True``, ``False``): KTMoE's, whether the previous layer's wrapper reads this layer's
    predicted experts ahead (module docstring). Threads come from ATen's pool (``torch.set_num_threads``). Other
    kt-kernel arguments (``cpuinfer_threads``, ``threadpool_count``, ``chunked_prefill_size``,
    ``max_deferred_experts_per_token``, ``cpu_save``, and any unknown keyword) are accepted and not used.
    """

    _capture_batch_sizes: List[int] = []
    _buffer_cache: dict = {}  # (shape, dtype) -> pinned host tensor for device -> CPU copies
    _executor: Optional[ThreadPoolExecutor] = None
    _executor_lock = threading.Lock()

    def __init__(self, layer_idx: int, num_experts: int, num_experts_per_tok: int, hidden_size: int,
                 moe_intermediate_size: int, num_gpu_experts: Optional[int] = None,
                 cpuinfer_threads: Optional[int] = None, threadpool_count: int = 1,
                 weight_path: Optional[str] = None, chunked_prefill_size: Optional[int] = None,
                 method: str = "AMXINT4", max_deferred_experts_per_token: Optional[int] = None,
                 cpu_save: bool = False, *, gpu_experts_mask=None, mmap_experts_dir: Optional[str] = None,
                 activation: Optional[str] = None, activation_params: Optional[dict] = None,
                 next_layer_prefetch="auto", **unused):
        if unused:
            log.debug("KTMoEWrapper(layer %d): ignoring arguments %s", layer_idx, sorted(unused))
        if max_deferred_experts_per_token:
            log.debug("KTMoEWrapper(layer %d): max_deferred_experts_per_token=%s is not implemented; every CPU "
                      "expert is computed in the same forward", layer_idx, max_deferred_experts_per_token)
        self.layer_idx, self.num_experts, self.top_k = int(layer_idx), int(num_experts), int(num_experts_per_tok)
        if self.top_k < 1:
            raise ValueError(f"KTMoEWrapper(layer {self.layer_idx}): num_experts_per_tok={self.top_k} must be >= 1 "
                             "(sglang routes every token to its top-k experts)")
        self.hidden_size, self.intermediate_size = int(hidden_size), int(moe_intermediate_size)
        self.method, self.weight_format = method, weight_format_of(method)
        check_weight_path(weight_path)
        self.weight_path = utf8_path(weight_path, "KTMoEWrapper: weight_path (--kt-weight-path)")
        # the experts' gated activation (a row of ops.GATED_ACTIVATIONS; sglang 0.5.23 passes none: the checkpoint's,
        # decided with the checkpoint's form at the load, _read_form)
        self.gpt_oss: Optional[bool] = None  # None: not read yet
        self.activation: Optional[str] = None
        self.activation_params: Optional[dict] = None
        self._given_activation_params = activation_params
        if activation is not None:
            self._set_activation(activation, activation_params)
        self.gpu_mask = _gpu_mask(self.num_experts, num_gpu_experts, gpu_experts_mask)
        self.cpu_physical = torch.nonzero(~self.gpu_mask).reshape(-1)  # CPU slot j holds physical expert cpu_physical[j]
        self.num_cpu_experts = int(self.cpu_physical.numel())
        # physical id -> CPU slot (-1: GPU expert); one extra entry maps id -1 to -1
        table = torch.full((self.num_experts + 1,), -1, dtype=torch.int32)
        table[self.cpu_physical] = torch.arange(self.num_cpu_experts, dtype=torch.int32)
        self._id_table = table
        mmap_dir = mmap_experts_dir if mmap_experts_dir is not None else os.environ.get(MMAP_DIR_ENV)
        # "": anonymous, whatever the env says
        self.mmap_experts_dir = utf8_path(mmap_dir, "KTMoEWrapper: mmap_experts_dir") if mmap_dir else None
        self.moe: Optional[KTMoE] = None
        self._pending: Optional[Future] = None
        self.next_layer_prefetch = next_layer_prefetch
        self._slot_of_logical: Optional[torch.Tensor] = None  # [E] int64: CPU slot of each logical expert, or -1
        self._predictor = None  # the next layer's NextLayerPredictor; None: not made yet, False: none
        self._following = None  # weakref to the next layer's wrapper, once found loaded
        self._model = join_model(self)  # this model's wrappers, where the next layer is found
        log.info("KTMoEWrapper(layer %d): torch_ktmoe %s, %d of %d experts on CPU, %s", self.layer_idx,
                 self.weight_format, self.num_cpu_experts, self.num_experts,
                 f"file-backed in {self.mmap_experts_dir}" if self.mmap_experts_dir else "anonymous memory")

    # ---------------------------------------------------------------- loading
    def _set_activation(self, activation: str, params) -> None:
        values = activation_params_of(activation, params)  # ValueError naming a bad name, parameter or value
        self.activation = activation
        self.activation_params = dict(zip(GATED_ACTIVATIONS[activation]["params"], values))

    def _read_form(self, ckpt: Optional[SafetensorsCheckpoint]) -> None:
        """Once, before the first load: whether the layer's experts are gpt-oss's (config.json, else the tensors of
        ``ckpt``; a GGUF directory: config.json alone) and, unless one was given, the gated activation: gpt-oss's
        clamped SwiGLU with its config.json's constants (``activation_params`` given win), else SiLU."""
        if self.gpt_oss is not None:
            return
        config = checkpoint_config(self.weight_path)
        gpt_oss = (is_gpt_oss(ckpt, self.layer_idx, config) if ckpt is not None
                   else config.get("model_type") == "gpt_oss")
        if self.activation is None:
            given = self._given_activation_params
            if not gpt_oss:
                self._set_activation("silu", given)
            else:
                constants = {"alpha": config_number(self.weight_path, config, "swiglu_alpha", 1.702),
                             "limit": config_number(self.weight_path, config, "swiglu_limit", 7.0)}
                self._set_activation("swiglu_oai", {**constants, **given} if isinstance(given, Mapping) else
                                     given if given is not None else constants)
        self.gpt_oss = gpt_oss

    def _logical_ids(self, physical_to_logical_map) -> List[int]:
        """The logical (checkpoint) expert of each CPU slot; clear errors for a map that is not 1-D integer
        ids with every CPU slot's id in [0, num_experts)."""
        if physical_to_logical_map is None:
            return self.cpu_physical.tolist()
        where = f"KTMoEWrapper(layer {self.layer_idx}): physical_to_logical_map"
        p2l = torch.as_tensor(physical_to_logical_map).detach().to("cpu")
        if p2l.dtype.is_floating_point or p2l.dtype.is_complex or p2l.dtype == torch.bool:
            raise TypeError(f"{where} must hold integer expert ids, got dtype {p2l.dtype}")
        if p2l.dim() != 1:
            raise ValueError(f"{where} must be 1-D [num_physical_experts], got shape {tuple(p2l.shape)}")
        if p2l.numel() < self.num_experts:
            raise ValueError(f"{where} has {p2l.numel()} entries, fewer than num_experts={self.num_experts}")
        ids = p2l[self.cpu_physical].tolist()
        bad = [(slot, logical) for slot, logical in enumerate(ids) if not 0 <= logical < self.num_experts]
        if bad:
            slot, logical = bad[0]
            more = f" ({len(bad) - 1} more CPU slots are out of range)" if len(bad) > 1 else ""
            raise ValueError(f"{where}: CPU slot {slot} (physical expert {int(self.cpu_physical[slot])}) maps to "
                             f"logical expert {logical}, outside [0, num_experts={self.num_experts}){more}")
        return ids

    def _ktmoe_args(self, group_size: int = 0) -> tuple[tuple, dict]:
        """The positional and keyword arguments of this layer's KTMoE (``group_size`` 0: the format's default)."""
        return ((self.num_cpu_experts, self.top_k, self.hidden_size, self.intermediate_size),
                dict(mmap_experts_dir=self.mmap_experts_dir, weight_format=self.weight_format,
                     layer_idx=self.layer_idx, activation=self.activation, activation_params=self.activation_params,
                     next_layer_prefetch=self.next_layer_prefetch,
                     **({"group_size": group_size} if group_size else {})))

    def _map_slots(self, ids: List[int]) -> None:
        """Remembers the CPU slot of each logical expert (``ids[slot]`` is the slot's logical expert)."""
        slots = torch.full((self.num_experts,), -1, dtype=torch.int64)
        slots[torch.tensor(ids, dtype=torch.int64)] = torch.arange(len(ids), dtype=torch.int64)
        self._slot_of_logical = slots

    def load_weights(self, physical_to_logical_map=None) -> None:
        """Read this layer's CPU experts from ``weight_path`` and pack them, one expert at a time.

        ``physical_to_logical_map`` [>= E] (sglang's expert-location metadata for
        this layer, integer ids): CPU slot j holds logical expert ``map[cpu_physical[j]]``,
        which must be in [0, E).
        With ``mmap_experts_dir`` a valid packed cache is mapped instead. An int4 checkpoint's experts
        (``RAWINT4`` / ``GPTQ_INT4``: ``int4_affine``) are packed with the checkpoint's group size.
        """
        ids = self._logical_ids(physical_to_logical_map)
        if self.weight_format == GGUF_FORMAT:
            return self._load_gguf(ids)
        with SafetensorsCheckpoint(self.weight_path) as ckpt, self._naming_bad_expert(ids, f"in {self.weight_path}"):
            self._read_form(ckpt)
            reader = layer_experts(ckpt, self.layer_idx, self.hidden_size, self.intermediate_size,
                                   **({"layout": GPT_OSS_LAYOUT} if self.gpt_oss else {}))
            source = checkpoint_fingerprint(self.weight_path, f"sglang layer={self.layer_idx}")
            experts = hashlib.blake2b(repr(ids).encode(), digest_size=12).hexdigest()
            group = exact_group_size(reader, self.weight_format)
            args, kwargs = self._ktmoe_args(group)
            self.moe = load_experts(*args, reader_experts(reader, ids, self.weight_format, group), source=source,
                                    key=f"experts:{experts}", **kwargs)
            self._set_checkpoint_biases(ckpt, ids)
        self._map_slots(ids)

    def _load_gguf(self, ids: List[int]) -> None:
        """LLAMAFILE: every expert of the layer where the GGUF holds it (a KTMoE of E, not E_cpu, experts); the
        physical ids of CPU slots map to their logical experts (``ids``), the GPU experts' to -1 (skipped)."""
        self._read_form(None)
        experts = gguf_layer_experts(self.weight_path, self.layer_idx, self.hidden_size, self.intermediate_size,
                                     self.num_experts)
        (_, *shape), kwargs = self._ktmoe_args()
        kwargs.update(mmap_experts_dir=None)
        moe = KTMoE(self.num_experts, *shape, **kwargs)
        moe.load_gguf(experts)
        logical = torch.tensor(ids, dtype=torch.int32)
        table = torch.full((self.num_experts + 1,), -1, dtype=torch.int32)
        table[self.cpu_physical] = logical
        self.moe, self._id_table = moe, table
        slots = torch.full((self.num_experts,), -1, dtype=torch.int64)
        slots[logical.long()] = logical.long()
        self._slot_of_logical = slots

    def _set_checkpoint_biases(self, ckpt: SafetensorsCheckpoint, ids: List[int]) -> None:
        """gpt-oss: the expert biases of the logical experts ``ids`` (one per CPU slot) from the checkpoint onto
        ``self.moe`` (fp32 buffers beside the packed experts, never in the cache files); others have none."""
        if self.gpt_oss:
            rows = torch.tensor(ids, dtype=torch.int64)
            biases = layer_biases(ckpt, self.layer_idx, self.num_experts, self.hidden_size, self.intermediate_size)
            self.moe.set_biases(*(b[rows] for b in biases))

    def load_weights_from_tensors(self, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor,
                                  physical_to_logical_map=None) -> None:
        """Pack from tensors: gate/up [N, I, H], down [N, H, I] with N = E (logical ids, the CPU
        experts are picked through ``physical_to_logical_map``) or N = E_cpu (already the CPU
        experts, in slot order). A gpt-oss checkpoint's expert biases are read from ``weight_path``."""
        n = gate_proj.shape[0]
        if n == self.num_cpu_experts and n != self.num_experts:
            sel, ids = slice(None), list(range(n))
        elif n >= self.num_experts:
            ids = self._logical_ids(physical_to_logical_map)
            sel = torch.tensor(ids, dtype=torch.long)
        else:
            raise ValueError(f"KTMoEWrapper(layer {self.layer_idx}): gate_proj has {n} experts; expected "
                             f"num_experts={self.num_experts} or the {self.num_cpu_experts} CPU experts")
        if any(n.endswith(".safetensors") for n in os.listdir(self.weight_path)):
            with SafetensorsCheckpoint(self.weight_path) as ckpt:
                self._read_form(ckpt)
        else:  # no tensors to recognise the form from: config.json's word
            self._read_form(None)
        args, kwargs = self._ktmoe_args()
        moe = make_ktmoe(*args, **kwargs)
        with torch.no_grad(), self._naming_bad_expert(ids, "in the given tensors"):
            moe.load_weights_separate(as_kernel_input(gate_proj[sel], name="gate_proj"),
                                      as_kernel_input(up_proj[sel], name="up_proj"),
                                      as_kernel_input(down_proj[sel], name="down_proj"))
        self.moe = moe
        logical = ids if n >= self.num_experts else self.cpu_physical.tolist()
        if self.gpt_oss:  # the tensors carry no biases: the checkpoint's
            with SafetensorsCheckpoint(self.weight_path) as ckpt:
                self._set_checkpoint_biases(ckpt, logical)
        self._map_slots(logical)

    @contextlib.contextmanager
    def _naming_bad_expert(self, ids: List[int], where: str):
        """Re-raises the packer's non-finite-weight error (which counts CPU slots) naming the logical expert."""
        try:
            yield
        except RuntimeError as e:
            found = _NONFINITE_SLOT.search(str(e))
            if found is None or not 0 <= int(found[1]) < len(ids):
                raise
            slot = int(found[1])
            raise RuntimeError(f"KTMoEWrapper: logical expert {ids[slot]} of layer {self.layer_idx} (CPU slot {slot}, "
                               f"physical expert {int(self.cpu_physical[slot])}) {where} has a non-finite weight: "
                               f"{e}") from e

    # ---------------------------------------------------------------- forward
    def submit_forward(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                       cuda_stream=None) -> None:
        """Start the CPU experts on ``hidden_states`` [T, H], ``topk_ids`` [T, k] (physical ids),
        ``topk_weights`` [T, k]. The inputs are copied before this returns (sglang masks
        ``topk_ids`` in place next and may overwrite ``hidden_states``)."""
        if self.moe is None:
            raise RuntimeError(f"KTMoEWrapper(layer {self.layer_idx}): call load_weights() before submit_forward()")
        if self._pending is not None:
            raise RuntimeError(f"KTMoEWrapper(layer {self.layer_idx}): submit_forward() called again before "
                               "sync_forward()")
        x, ids, weights, ready = self._copy_inputs(hidden_states, topk_ids, topk_weights)
        self._pending = self._worker().submit(self._run, x, ids, weights, ready)

    def sync_forward(self, hidden_states: torch.Tensor, cuda_stream=None) -> torch.Tensor:
        """Wait for the submitted forward: [T, H] on ``hidden_states``' device, in its dtype,
        not multiplied by ``routed_scaling_factor`` (the model applies it)."""
        if self._pending is None:
            raise RuntimeError(f"KTMoEWrapper(layer {self.layer_idx}): sync_forward() without submit_forward()")
        pending, self._pending = self._pending, None
        out = pending.result()
        return out.to(device=hidden_states.device, dtype=hidden_states.dtype, non_blocking=False)

    def forward(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                cuda_stream=None) -> torch.Tensor:
        """``submit_forward`` then ``sync_forward``."""
        self.submit_forward(hidden_states, topk_ids, topk_weights, cuda_stream)
        return self.sync_forward(hidden_states, cuda_stream)

    def _copy_inputs(self, hidden_states, topk_ids, topk_weights):
        if hidden_states.dim() != 2 or hidden_states.shape[1] != self.hidden_size:
            raise ValueError(f"KTMoEWrapper(layer {self.layer_idx}): hidden_states must be [T, "
                             f"{self.hidden_size}], got {tuple(hidden_states.shape)}")
        T = hidden_states.shape[0]
        if topk_ids.shape[0] != T or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"KTMoEWrapper(layer {self.layer_idx}): topk_ids {tuple(topk_ids.shape)} and "
                             f"topk_weights {tuple(topk_weights.shape)} must both be [T={T}, k]")
        # The op takes bf16 / fp16 / fp32 as they are (converted per row in the kernel).
        dtype = hidden_states.dtype if hidden_states.dtype in _KERNEL_DTYPES else torch.float32
        ready = None
        if hidden_states.device.type == "cpu":
            x = hidden_states.detach().to(dtype, copy=True)
        else:  # device -> pinned host, ordered on the current stream before sglang's in-place writes
            x = self._host_buffer(hidden_states.shape, hidden_states.dtype)
            x.copy_(hidden_states.detach(), non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        ids = topk_ids.detach().to("cpu", torch.int64)  # a copy (sync for a device tensor)
        if ids.numel() and int(ids.max()) >= self.num_experts:  # k = 0 routes nothing: the output is zeros
            raise ValueError(f"KTMoEWrapper(layer {self.layer_idx}): expert id {int(ids.max())} >= num_experts="
                             f"{self.num_experts}")
        slots = self._id_table[ids.clamp(min=-1)]  # id -1 reads the table's last entry, -1
        weights = topk_weights.detach().to("cpu", torch.float32, copy=True)
        return x, slots, weights, ready

    @classmethod
    def _host_buffer(cls, shape, dtype) -> torch.Tensor:
        key = (tuple(shape), dtype)
        buf = cls._buffer_cache.get(key)
        if buf is None:
            buf = torch.empty(shape, dtype=dtype, pin_memory=True)
            cls._buffer_cache[key] = buf
        return buf

    def _run(self, x, ids, weights, ready):
        if ready is not None:
            ready.synchronize()
            x = x if x.dtype in _KERNEL_DTYPES else x.float()
        with torch.no_grad():
            predictor = self._next_layer_predictor()
            if predictor is not None:
                predictor(x)  # the next layer's likely experts, read ahead while these compute
                if predictor.off is not None:  # it failed, warned and switched itself off
                    self._predictor = False
            return self.moe(x, ids, weights)

    # ---------------------------------------------------------------- next-layer prefetch
    def _next_layer_predictor(self) -> Optional[NextLayerPredictor]:
        """The next layer's predictor, made the first time that layer reads ahead (module docstring); a router
        that cannot be read switches prediction off for this layer with one warning."""
        if self._predictor is None:
            following = self._following() if self._following is not None else None
            if following is None:
                following = self._model.following(self.layer_idx)
                if following is None or following.moe is None or following._slot_of_logical is None:
                    return None  # not loaded yet: asked again next forward
                self._following = weakref.ref(following)
            self.moe.reads.link(following.moe.reads)  # this model's next layer (a prefill streams it too)
            if not following.moe.next_layer_prefetching:
                if following.moe.next_layer_prefetch_mode is False:
                    self._predictor = False
                return None
            try:
                router, reason = next_router(following)
                reason = reason or same_shape(self, following)
            except Exception as e:  # noqa: BLE001 - an optimisation never fails the forward
                warn_prefetch_off(self.layer_idx, following.layer_idx, e, stacklevel=2)
                self._predictor = False
                return None
            if reason:
                log.info("KTMoEWrapper(layer %d): no next-layer prefetch of layer %d: %s", self.layer_idx,
                         following.layer_idx, reason)
                self._predictor = False
            else:
                self._predictor = NextLayerPredictor(router, self.moe.reads.next, id_map=following._slot_of_logical,
                                                     layer_idx=self.layer_idx)
        return self._predictor or None

    @classmethod
    def _worker(cls) -> ThreadPoolExecutor:
        with cls._executor_lock:
            if cls._executor is None:
                cls._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ktmoe-cpu-experts")
            return cls._executor

    # ---------------------------------------------------------------- kt-kernel's static helpers
    @staticmethod
    def set_capture_batch_sizes(capture_bs: Sequence[int]) -> None:
        """The CUDA-graph capture batch sizes sglang will use (kept; the CPU path needs no per-size buffers)."""
        KTMoEWrapper._capture_batch_sizes = [int(b) for b in capture_bs]

    @staticmethod
    def get_capture_batch_sizes() -> List[int]:
        return list(KTMoEWrapper._capture_batch_sizes)

    @staticmethod
    def clear_buffer_cache() -> None:
        """Frees the pinned host staging buffers of device inputs."""
        KTMoEWrapper._buffer_cache.clear()

    def __repr__(self) -> str:
        return (f"KTMoEWrapper(layer={self.layer_idx}, method={self.method!r} -> {self.weight_format}, "
                f"cpu_experts={self.num_cpu_experts}/{self.num_experts}, moe={self.moe!r})")

