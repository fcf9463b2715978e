"""``from_pretrained``: a transformers MoE model whose experts stream from safetensors into KTMoE.

transformers' own ``from_pretrained`` builds the model on the meta device; before it loads any
weight, every experts block becomes an empty :class:`~torch_ktmoe.hf.experts.KTMoEExperts`
(:mod:`.load_hook`), so transformers never materializes a dense expert; it loads every other
weight; then each block's experts are read one at a time out of the shards by the readers of
:mod:`torch_ktmoe.checkpoint` (fused, per-expert or MXFP4 keys) into
:func:`torch_ktmoe.checkpoint.load_experts`, which maps the block's valid cache files instead
when ``mmap_experts_dir`` holds them. Peak anonymous memory ~ non-expert weights + one expert's
dense tensors (+ the packed experts when they are not file-backed).

A packed model directory (:mod:`.packed_dir`) loads the same way, its experts mapped from its files.
"""

from __future__ import annotations

import os
import warnings

import torch

from ..checkpoint import (INT4_QUANT_METHODS, MOE_BLOCK_NAMES, SafetensorsCheckpoint, check_int4_config, checkpoint_fingerprint,
                          exact_format, exact_group_size, find_experts, load_experts, reader_experts)
from . import gguf_load, packed_dir
from .experts import experts_dims
from .fast_defaults import check_switches
from .finish import finish_load, mark_config
from .fp8_dense import dequantize_loaded_fp8, is_scale_key
from .int4_dense import dequantize_loaded_int4, int4_modules, is_int4_key
from .load_hook import before_and_after_weight_loading
from .patch import adapter_for, find_experts_blocks, refusal_error
from .vocabulary import PatchReport, RefusedBlock, account, model_dtype, set_submodule

__all__ = ["from_pretrained"]


def candidate_prefixes(name: str, base_model_prefix: str) -> list[str]:
    """Where a checkpoint may keep the experts of module ``name``: with and without the base model prefix,
    and each of the checkpoint names of an ``mlp`` block (``MOE_BLOCK_NAMES``: Mixtral, DeepSeek-V4)."""
    names = [name]
    if ".mlp.experts" in name:
        names += [name.replace(".mlp.experts", f".{block}.experts") for block in MOE_BLOCK_NAMES[1:]]
    out: list[str] = []
    for n in names:
        out.append(n)
        if base_model_prefix:
            bp = base_model_prefix + "."
            out.append(n[len(bp) :] if n.startswith(bp) else bp + n)
    return list(dict.fromkeys(out))


def _resolve_dir(path) -> str:
    path = os.fspath(path)
    if os.path.isdir(path):
        return path
    from huggingface_hub import snapshot_download

    # *.ktmoe: the expert files of a packed model directory (its manifest, ktmoe_packed.json, is a *.json)
    return snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.py", "*.ktmoe"])


QUANT_METHODS = ("fp8", "mxfp4", *INT4_QUANT_METHODS)  # the quantization_config.quant_method values read here


def quant_method(config) -> str | None:
    """``config.quantization_config.quant_method`` as a string (None: not quantized)."""
    qc = getattr(config, "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return None if method is None else str(getattr(method, "value", method))


def _quantization_dict(config) -> dict:
    qc = getattr(config, "quantization_config", None)
    return dict(qc) if isinstance(qc, dict) else qc.to_dict()


def _streaming_config(path: str, hf_kwargs: dict):
    """The config to hand transformers, or None for its own. MXFP4 (gpt-oss): without its
    quantization_config (the experts are dequantized expert by expert here, the rest is bf16);
    FP8: without it too (the experts stream here, the other FP8 weights are dequantized after the
    load by :mod:`.fp8_dense`); compressed-tensors / GPTQ / AWQ int4: the same (checked by
    :func:`~torch_ktmoe.checkpoint.check_int4_config`; the other int4 weights are dequantized by
    :mod:`.int4_dense`); another quant_method: ValueError naming it."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=hf_kwargs.get("trust_remote_code", False))
    method = quant_method(config)
    if method is not None and method not in QUANT_METHODS:
        raise ValueError(f"{path}: quantization_config.quant_method {method!r} is not read by "
                         f"torch_ktmoe.hf.from_pretrained; it reads {QUANT_METHODS[0]!r} (FP8 blocks or rows), "
                         f"{QUANT_METHODS[1]!r}, int4 {list(INT4_QUANT_METHODS)} checkpoints and unquantized ones")
    if method is None:
        return None
    if method in INT4_QUANT_METHODS:
        check_int4_config(_quantization_dict(config), path)
    del config.quantization_config
    return config


def _transformers_kwargs(pretrained_model_name_or_path, dtype, hf_kwargs: dict) -> tuple[str, dict]:
    """Config handling: the local checkpoint directory and the keyword arguments of transformers'
    ``from_pretrained`` (``dtype``; an MXFP4 checkpoint's config without its quantization_config)."""
    hf_kwargs = dict(hf_kwargs)
    if dtype is not None:
        hf_kwargs["dtype"] = dtype
    if hf_kwargs.get("quantization_config") is not None:
        raise ValueError("torch_ktmoe.hf.from_pretrained does not combine with a transformers quantization_config")
    path = _resolve_dir(pretrained_model_name_or_path)
    if "config" not in hf_kwargs:
        config = _streaming_config(path, hf_kwargs)
        if config is not None:
            hf_kwargs["config"] = config
    return path, hf_kwargs


class _EmptyExpertsSwap:
    """The before/after hooks of from_pretrained's transformers load.

    ``before(model)``, on the model built on the meta device: every supported experts block becomes
    an empty :class:`KTMoEExperts` (``entries``: block, E, H, I, adapter), so transformers never
    materializes a dense expert; unsupported ones are refused (``strict``) or listed in ``refused``.
    ``after(model, info)``: the checkpoint's dense expert keys, skipped on purpose, are not
    reported as unexpected; nor are the scales of an FP8 checkpoint's other weights (applied by
    :func:`.fp8_dense.dequantize_loaded_fp8`, which finds them itself), nor the int4 tensors of an int4 checkpoint's
    other linears (``int4_keys``, dequantized by :func:`.int4_dense.dequantize_loaded_int4`, whose
    weights are then not reported missing)."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.entries: list = []
        self.refused: list[RefusedBlock] = []
        self.int4_keys: list[str] = []

    def before(self, model) -> None:
        method = quant_method(model.config)
        if method is not None and method not in QUANT_METHODS:
            raise ValueError(f"{type(model).__name__}: quantization_config.quant_method {method!r} is not supported")
        blocks, refused = find_experts_blocks(model)
        if refused and self.strict:
            raise refusal_error(model, refused)
        if not blocks and not refused:
            raise ValueError(f"{type(model).__name__}: no Mixture-of-Experts experts block found")
        entries = []
        for b in blocks:
            E, H, I = experts_dims(b.module)
            adapter = adapter_for(b, None)
            set_submodule(model, b.name, adapter)
            entries.append((b, E, H, I, adapter))
            b.module = None
        self.entries, self.refused = entries, refused

    def experts_prefixes(self, model) -> tuple[str, ...]:
        """Where the checkpoint may keep the swapped blocks' experts (each ending in ".")."""
        return tuple(sorted({p + "." for b, *_ in self.entries
                             for p in candidate_prefixes(b.name, model.base_model_prefix)}))

    def after(self, model, info) -> None:
        unexpected = getattr(info, "unexpected_keys", None)
        if not unexpected:
            return
        prefixes = self.experts_prefixes(model)
        for k in list(unexpected):
            if k.startswith(prefixes):
                unexpected.discard(k)
            elif is_scale_key(k):  # an FP8 weight's, or a compressed-tensors int4 one's (both read after the load)
                unexpected.discard(k)
            elif is_int4_key(k):
                self.int4_keys.append(k)
                unexpected.discard(k)
        missing = getattr(info, "missing_keys", None)
        if missing:
            for module in int4_modules(self.int4_keys):
                for name in (f"{module}.weight", f"{model.base_model_prefix}.{module}.weight"):
                    missing.discard(name)


def _load_without_experts(model_class, path: str, hf_kwargs: dict, strict: bool):
    """transformers' own ``from_pretrained`` with the experts blocks swapped for empty adapters
    before any weight loads; returns (model, the swap with its entries)."""
    if model_class is None:
        from transformers import AutoModelForCausalLM

        model_class = AutoModelForCausalLM
    swap = _EmptyExpertsSwap(strict)
    with before_and_after_weight_loading(swap.before, swap.after) as fired:
        model = model_class.from_pretrained(path, **hf_kwargs)
    if not fired:
        raise RuntimeError(
            "torch_ktmoe.hf.from_pretrained: transformers did not call PreTrainedModel._load_pretrained_model; "
            "this transformers version is not supported by the streaming loader (use patch_model)"
        )
    return model, swap


def _stream_experts(model, path: str, entries, weight_format: str | None, mmap_experts_dir, ktmoe_kwargs: dict,
                    report: PatchReport, progress: bool) -> None:
    """Per experts block, a KTMoE that maps its valid cache files or is filled expert by expert from the
    safetensors shards (in the model's dtype if fp32/bf16, else fp32; FP8 experts into ``fp8`` and int4
    experts into ``int4_affine`` as they are). ``weight_format`` None: the reader's exact format
    (:func:`~torch_ktmoe.checkpoint.exact_format`), else ``bf16``."""
    dtype = model_dtype(model)
    stream_dtype = dtype if dtype in (torch.float32, torch.bfloat16) else torch.float32
    source = checkpoint_fingerprint(path, f"dtype={stream_dtype}")
    if progress:
        from tqdm.auto import tqdm

        entries = tqdm(entries, desc="ktmoe: streaming experts", unit="layer")
    with SafetensorsCheckpoint(path) as ckpt:
        for b, E, H, I, adapter in entries:
            reader = find_experts(ckpt, candidate_prefixes(b.name, model.base_model_prefix), H, I, num_experts=E,
                                  layout=adapter.layout, what=f"{b.name} ({b.class_name})")
            fmt = weight_format or exact_format(reader) or "bf16"
            group = exact_group_size(reader, fmt, ktmoe_kwargs.get("group_size", 0))
            experts = reader_experts(reader, range(E), fmt, group)
            kwargs = {**adapter.layout.ktmoe_kwargs(), **ktmoe_kwargs, **({"group_size": group} if group else {})}
            ktm = load_experts(E, adapter.top_k, H, I, experts, source=source, key=b.name,
                               dtype=stream_dtype, mmap_experts_dir=mmap_experts_dir, weight_format=fmt,
                               layer_idx=b.layer_idx, **kwargs)
            adapter.ktmoe = ktm
            account(report, b, ktm, 0)


def _from_gguf(path, gguf_file, model_class, dtype, weight_format: str | None, mmap_experts_dir, ktmoe_kwargs: dict,
               strict: bool, progress: bool, hf_kwargs: dict):
    """(model, report) of a GGUF file (:mod:`.gguf_load`): its config, its dense weights dequantized through
    transformers' own load, its experts in place (or packed into ``weight_format``)."""
    for key in ("config", "state_dict", "quantization_config"):
        if hf_kwargs.get(key) is not None:
            raise ValueError(f"torch_ktmoe.hf.from_pretrained(gguf_file=...) reads the model from the GGUF file; "
                             f"{key}= cannot be given with it")
    gguf_path, gguf, config = gguf_load.open_gguf_model(path, gguf_file)
    model_class = model_class or gguf_load.causal_lm_class(config)
    dtype = torch.float32 if dtype is None else dtype
    meta = gguf_load.meta_model(model_class, config)
    state = gguf_load.dense_state_dict(gguf, meta, dtype, progress)
    unread = gguf_load.unread_tensors(gguf, state, meta)
    if unread:
        warnings.warn(f"torch_ktmoe: {len(unread)} tensors of {gguf_path!r} have no place in "
                      f"{model_class.__name__} and are not read, e.g. {unread[:3]}", UserWarning, stacklevel=3)
    del meta
    model, swap = _load_without_experts(model_class, None, {**hf_kwargs, "config": config, "state_dict": state,
                                                            "dtype": dtype}, strict)
    del state
    report = PatchReport(refused=list(swap.refused))
    gguf_load.load_gguf_experts(gguf, gguf_path, swap.entries, weight_format, mmap_experts_dir, ktmoe_kwargs, report,
                                progress)
    return model, report


def from_pretrained(
    pretrained_model_name_or_path,
    *,
    gguf_file: str | os.PathLike | None = None,
    mmap_experts_dir: str | os.PathLike | None = None,
    weight_format: str | None = None,
    dtype=None,
    torch_dtype=None,
    model_class=None,
    strict: bool = True,
    progress: bool = True,
    ktmoe_kwargs: dict | None = None,
    cache: str | None = None,
    pack_linears: bool = True,
    decode_attention: bool = True,
    **hf_kwargs,
):
    """Load a transformers MoE model with its experts packed into KTMoE, streaming them from safetensors.

    ``dtype`` (or its old name ``torch_dtype``) is the dtype of the non-expert weights
    and of the expert tensors handed to KTMoE (fp32 or bf16; anything else -> fp32), as
    with transformers' ``from_pretrained``. ``model_class`` defaults to
    ``AutoModelForCausalLM``; other keyword arguments go to its ``from_pretrained``.
    Equivalent to ``patch_model(model_class.from_pretrained(path, dtype=dtype), ...)``
    without ever holding the dense experts. Returns the model; ``model.ktmoe_report``
    is the :class:`PatchReport`.

    An FP8 checkpoint (``quantization_config.quant_method == "fp8"``: e4m3 weights with
    128 x 128 block or per-row scales, DeepSeek-V3 / Qwen3-FP8) streams its experts into
    ``weight_format="fp8"`` by default, bytes and scales as they are (no dequantized copy
    of an expert ever exists), or dequantizes them expert by expert into another format on
    request; its non-expert FP8 weights are dequantized in place after transformers loads
    them (:mod:`.fp8_dense`). An int4 checkpoint (``quant_method`` ``"compressed-tensors"``
    pack-quantized, ``"gptq"``, ``"awq"``) streams its experts into ``weight_format="int4_affine"``
    the same way (codes, scales and zero points as they are, the checkpoint's group size), or
    dequantized into another format; its other int4 linears are dequantized into the model's
    weights (:mod:`.int4_dense`). An MXFP4 checkpoint (gpt-oss ``_blocks`` / ``_scales``) is
    dequantized into ``bf16`` by default (the same values), or with ``weight_format="mxfp4"`` streams its
    e2m1 codes and E8M0 scales as they are; so do DeepSeek-V4's FP4 experts (``expert_dtype="fp4"``:
    :mod:`torch_ktmoe.checkpoint.fp4`). FP8 scales in UE8M0 (``scale_fmt="ue8m0"``) are read exactly.
    Other ``quant_method`` values are refused by name.

    ``cache`` (``"reuse"`` by default with ``mmap_experts_dir``, ``"rebuild"``, ``"off"``):
    the cache fingerprint of a layer is the checkpoint's (its files' names, sizes, mtimes,
    safetensors headers and content samples: :func:`torch_ktmoe.checkpoint.checkpoint_fingerprint`)
    plus the module name and dtype; a layer with valid cache files is mapped and its
    experts are not even read from the safetensors.

    A packed model directory (written by :func:`save_packed`, it holds ``ktmoe_packed.json``)
    loads without its source checkpoint: every experts layer is mapped read-only from the
    directory's files, never packed; its format, group size and NUMA parts come from the
    manifest, so ``weight_format``, ``mmap_experts_dir`` and ``cache`` must not be given.

    ``pack_linears`` / ``decode_attention``: as :func:`~torch_ktmoe.hf.patch_model`'s, applied after the
    experts (by default, where they keep the outputs within the model dtype's rounding: :mod:`.fast_defaults`).
    Next-layer prefetch is wired as by ``patch_model`` (``ktmoe_kwargs={"next_layer_prefetch": ...}``).
    """
    check_switches(pack_linears=pack_linears, decode_attention=decode_attention)
    ktmoe_kwargs = dict(ktmoe_kwargs or {})
    if cache is not None:
        ktmoe_kwargs["cache"] = cache
    if gguf_file is not None:
        model, report = _from_gguf(pretrained_model_name_or_path, gguf_file, model_class,
                                   torch_dtype if dtype is None else dtype, weight_format, mmap_experts_dir,
                                   ktmoe_kwargs, strict, progress, hf_kwargs)
        return finish_load(model, report, pack_linears=pack_linears, decode_attention=decode_attention)
    path, hf_kwargs = _transformers_kwargs(pretrained_model_name_or_path, torch_dtype if dtype is None else dtype,
                                           hf_kwargs)
    packed = packed_dir.packed_dir_layers(path, weight_format=weight_format, mmap_experts_dir=mmap_experts_dir,
                                          cache=cache)
    model, swap = _load_without_experts(model_class, path, hf_kwargs, strict)
    dequantize_loaded_fp8(model, path, swap.experts_prefixes(model))
    dequantize_loaded_int4(model, path, swap.int4_keys)
    report = PatchReport(refused=list(swap.refused))
    if packed is not None:
        packed_dir.map_packed_layers(path, packed["manifest"], packed["by_module"], swap.entries, ktmoe_kwargs, report)
        mark_config(model)
    else:
        _stream_experts(model, path, swap.entries, weight_format, mmap_experts_dir, ktmoe_kwargs, report, progress)
    return finish_load(model, report, pack_linears=pack_linears, decode_attention=decode_attention)
