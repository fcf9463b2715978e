"""Hugging Face transformers 5.x drop-in: run a model's routed experts with KTMoE.

Three entry points:

``patch_model(model, *, mmap_experts_dir=None, weight_format="bf16", ...) -> PatchReport``
    Finds every experts block of a loaded model, packs its weights into a
    :class:`torch_ktmoe.KTMoE` (``layer_idx`` = decoder layer index), puts a
    :class:`~torch_ktmoe.integrations.transformers_experts.KTMoEExperts` in its place
    and frees the dense ``gate_up_proj``/``down_proj`` parameters. Routers, shared
    experts (Qwen2-MoE ``shared_expert`` + ``shared_expert_gate``, DeepSeek-V3
    ``shared_experts``) and dense MLP layers (DeepSeek-V3 ``first_k_dense_replace``)
    stay as they are.

``from_pretrained(path, *, mmap_experts_dir=None, weight_format="bf16", dtype=None, ...)``
    Builds the model on the meta device (transformers' own ``from_pretrained``),
    swaps the experts modules for empty ``KTMoEExperts`` *before* transformers loads
    any weight -- so transformers never materializes a dense expert --, lets
    transformers load every other weight, then streams each layer's expert tensors
    out of the safetensors shards (``safe_open``, per-expert or fused keys), one
    expert at a time, into ``KTMoE.load_expert``. Peak anonymous memory ~ non-expert
    weights + one expert's dense tensors (+ the packed experts when they are not
    file-backed).

experts implementation ``"ktmoe"``
    Importing this module registers ``"ktmoe"`` in transformers' ``ExpertsInterface``,
    so ``model.set_experts_implementation("ktmoe")`` and
    ``AutoModelForCausalLM.from_pretrained(..., experts_implementation="ktmoe")`` work.
    Each experts module is packed on its first call, then its dense parameters are
    released (``keep_dense`` keeps them). Options:
    :func:`torch_ktmoe.integrations.transformers_experts.configure_experts_implementation`
    or the ``KTMOE_WEIGHT_FORMAT`` / ``KTMOE_MMAP_EXPERTS_DIR`` / ``KTMOE_CACHE`` /
    ``KTMOE_KEEP_DENSE`` environment variables.

``save_packed(model, DIR)`` / ``from_pretrained(DIR)``
    A packed model directory: config, non-expert safetensors and the packed experts as
    cache files, loaded without the source checkpoint (:mod:`torch_ktmoe.hf_packed`).

Supported experts classes: :data:`SUPPORTED_EXPERTS_CLASSES` (each validated against its
unpatched model). gpt-oss and every other experts block are refused with
:class:`UnsupportedExpertsError` naming the class and the reason (``strict=False`` leaves
them dense and lists them in the report).

A patched model's ``state_dict()``/``save_pretrained`` write the experts back as dense
tensors under the replaced class's keys (bf16 exact; int8/int4 dequantized, with a
warning), ``copy.deepcopy`` shares the packed experts, and a backward raises
:class:`torch_ktmoe.ops.InferenceOnlyError`.
``KTMoEExperts`` does not dispatch on ``config._experts_implementation`` (patching sets
it to ``"ktmoe"`` so ``model.get_experts_implementation()`` tells the truth; switching it
afterwards changes nothing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import threading
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from . import hf_packed
from .cache import checkpoint_fingerprint, layer_fingerprint
from .memory import release_free_heap
from .integrations.experts_layout import SILU_CONCATENATED
from .integrations.transformers_experts import (
    SUPPORTED_EXPERTS_CLASSES,
    KTMoEExperts,
    UnsupportedExpertsError,
    _ktmoe_cls,
    experts_dims,
    layout_of,
    looks_like_experts,
    pack_dense_experts,
    register_experts_implementation,
    unsupported_reason,
)

__all__ = [
    "patch_model",
    "from_pretrained",
    "save_packed",
    "find_experts_blocks",
    "PatchReport",
    "RefusedBlock",
    "ExpertsBlock",
    "UnsupportedExpertsError",
    "SUPPORTED_EXPERTS_CLASSES",
]

register_experts_implementation("ktmoe")


# ---------------------------------------------------------------------------------------------
# discovery
# ---------------------------------------------------------------------------------------------


@dataclass
class ExpertsBlock:
    name: str  # dotted module path, e.g. "model.layers.3.mlp.experts"
    module: nn.Module
    layer_idx: int
    class_name: str


@dataclass
class RefusedBlock:
    name: str
    class_name: str
    reason: str


@dataclass
class PatchReport:
    layers_patched: list[int] = field(default_factory=list)  # layer_idx of each replaced experts block
    module_names: list[str] = field(default_factory=list)
    replaced_classes: dict[str, int] = field(default_factory=dict)  # class name -> count
    packed_bytes: int = 0  # sum of KTMoE.packed_bytes
    file_backed_bytes: int = 0  # sum of KTMoE.file_backed_bytes
    dense_bytes_freed: int = 0  # bytes of the dense expert parameters dropped (0 for from_pretrained)
    refused: list[RefusedBlock] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return len(self.layers_patched)


_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def find_experts_blocks(model: nn.Module) -> tuple[list[ExpertsBlock], list[RefusedBlock]]:
    """Supported and refused experts blocks of ``model``, in module order."""
    found: list[ExpertsBlock] = []
    refused: list[RefusedBlock] = []
    used: set[int] = set()
    skip_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(p) for p in skip_prefixes):
            continue
        if not looks_like_experts(name, module):
            continue
        skip_prefixes.append(name + ".")
        cls_name = type(module).__name__
        reason = (
            f"{cls_name} is a list of per-expert modules, not a fused transformers 5 experts module"
            if isinstance(module, nn.ModuleList)
            else unsupported_reason(module)
        )
        if reason is not None:
            refused.append(RefusedBlock(name, cls_name, reason))
            continue
        matches = _LAYER_RE.findall(name)
        idx = int(matches[-1]) if matches else None
        if idx is None or idx in used:
            idx = max(used, default=-1) + 1
        used.add(idx)
        found.append(ExpertsBlock(name, module, idx, cls_name))
    return found, refused


def _refusal_error(model: nn.Module, refused: list[RefusedBlock]) -> UnsupportedExpertsError:
    lines = "\n".join(f"  {r.name}: {r.class_name}: {r.reason}" for r in refused)
    return UnsupportedExpertsError(
        f"torch_ktmoe cannot replace {len(refused)} experts block(s) of {type(model).__name__}:\n{lines}\n"
        "(pass strict=False to patch the supported blocks and leave these dense)"
    )


def _set_submodule(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)


def _make_ktmoe(E, top_k, H, I, layer_idx, weight_format, mmap_experts_dir, ktmoe_kwargs, layout=None):
    if layout is not None:  # the replaced class's activation (gpt-oss: swiglu_oai)
        ktmoe_kwargs = {**layout.ktmoe_kwargs(), **ktmoe_kwargs}
    if mmap_experts_dir is not None:
        os.makedirs(mmap_experts_dir, exist_ok=True)  # KTMoE itself falls back to anonymous memory if it is missing
    return _ktmoe_cls()(
        E,
        top_k,
        H,
        I,
        weight_format=weight_format,
        mmap_experts_dir=None if mmap_experts_dir is None else os.fspath(mmap_experts_dir),
        layer_idx=layer_idx,
        **ktmoe_kwargs,
    )


def _adapter_for(block: ExpertsBlock, ktmoe) -> KTMoEExperts:
    E, H, I = experts_dims(block.module)
    layout = layout_of(block.module)
    dtype = block.module.gate_up_proj.dtype
    adapter = KTMoEExperts(
        ktmoe,
        num_experts=E,
        hidden_dim=H,
        intermediate_dim=I,
        top_k=int(block.module.config.num_experts_per_tok),
        layer_idx=block.layer_idx,
        replaced_class=block.class_name,
        layout=layout,
        dtype=dtype,
    )
    if layout.biases:  # the replaced module's values (meta while from_pretrained builds the model)
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            src = getattr(block.module, name)
            if src.is_meta:
                setattr(adapter, name, nn.Parameter(torch.empty_like(src, device="meta"), requires_grad=False))
            else:
                getattr(adapter, name).data.copy_(src.detach())
    adapter.dense_dtype = dtype
    return adapter


def _mark_config(model: nn.Module) -> None:
    # Report "ktmoe" from model.get_experts_implementation(); KTMoEExperts itself does not dispatch on it.
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_experts_implementation_internal"):
            cfg._experts_implementation_internal = "ktmoe"


# ---------------------------------------------------------------------------------------------
# patch_model
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def patch_model(
    model: nn.Module,
    *,
    mmap_experts_dir: str | os.PathLike | None = None,
    weight_format: str = "bf16",
    strict: bool = True,
    free_dense: bool = True,
    progress: bool = False,
    cache: str | None = None,
    **ktmoe_kwargs,
) -> PatchReport:
    """Replace every experts block of a loaded transformers model by KTMoE, in place.

    ``ktmoe_kwargs`` (``numa_parts=``, ``group_size=``) go to the ``KTMoE`` constructor,
    and so does ``cache`` (``"reuse"``, ``"rebuild"``, ``"off"``; see :mod:`torch_ktmoe.cache`:
    with a valid cache, a layer maps its packed experts instead of packing them; the
    fingerprint is a hash of the dense weights).
    With ``free_dense`` the replaced ``gate_up_proj``/``down_proj`` Parameters get an
    empty ``.data``, so their memory is released even if something else still holds
    the Parameter objects. Raises :class:`UnsupportedExpertsError` (naming the class)
    for unsupported blocks unless ``strict=False``. The report is also stored as
    ``model.ktmoe_report``.
    """
    blocks, refused = find_experts_blocks(model)
    if refused and strict:
        raise _refusal_error(model, refused)
    if not blocks and not refused:
        raise ValueError(f"{type(model).__name__}: no Mixture-of-Experts experts block found")
    for b in blocks:
        for pname in ("gate_up_proj", "down_proj"):
            if getattr(b.module, pname).is_meta:
                raise ValueError(
                    f"{b.name}.{pname} is on the meta device; load the weights first "
                    "(or use torch_ktmoe.hf.from_pretrained)"
                )
    report = PatchReport(refused=list(refused))
    if cache is not None:
        ktmoe_kwargs["cache"] = cache
    it = blocks
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(blocks, desc="ktmoe: packing experts", unit="layer")
    for b in it:
        E, H, I = experts_dims(b.module)
        top_k = int(b.module.config.num_experts_per_tok)
        layout = layout_of(b.module)
        ktm = _make_ktmoe(E, top_k, H, I, b.layer_idx, weight_format, mmap_experts_dir, ktmoe_kwargs, layout)
        pack_dense_experts(ktm, layout, b.module.gate_up_proj.detach(), b.module.down_proj.detach())
        _set_submodule(model, b.name, _adapter_for(b, ktm))
        dense = sum(p.numel() * p.element_size() for p in b.module.parameters(recurse=True))
        if free_dense:
            for p in b.module.parameters(recurse=True):
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        _account(report, b, ktm, dense)
        b.module = None  # drop our reference to the old module
    if not refused:
        _mark_config(model)
    model.ktmoe_report = report
    return report


def _account(report: PatchReport, b: ExpertsBlock, ktm, dense_bytes: int) -> None:
    report.layers_patched.append(b.layer_idx)
    report.module_names.append(b.name)
    report.replaced_classes[b.class_name] = report.replaced_classes.get(b.class_name, 0) + 1
    report.packed_bytes += int(ktm.packed_bytes)
    report.file_backed_bytes += int(ktm.file_backed_bytes)
    report.dense_bytes_freed += dense_bytes


# ---------------------------------------------------------------------------------------------
# from_pretrained: transformers loads the non-expert weights, we stream the experts
# ---------------------------------------------------------------------------------------------


class _Checkpoint:
    """Key -> shard index over a directory of safetensors files, with lazily opened handles."""

    def __init__(self, path: str):
        from safetensors import safe_open

        self._safe_open = safe_open
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, object] = {}
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
            self.key_to_file = {k: os.path.join(path, v) for k, v in weight_map.items()}
        else:
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors file in {path}")
            self.key_to_file = {}
            for fn in files:
                full = os.path.join(path, fn)
                for k in self._open(full).keys():
                    self.key_to_file[k] = full

    def _open(self, file: str):
        h = self._handles.get(file)
        if h is None:
            h = self._stack.enter_context(self._safe_open(file, framework="pt", device="cpu"))
            self._handles[file] = h
        return h

    def __contains__(self, key: str) -> bool:
        return key in self.key_to_file

    def get(self, key: str) -> torch.Tensor:
        return self._open(self.key_to_file[key]).get_tensor(key)

    def get_row(self, key: str, i: int) -> torch.Tensor:
        """``tensor[i]`` of a stacked tensor, reading only that slice."""
        return self._open(self.key_to_file[key]).get_slice(key)[i]

    def shape(self, key: str) -> list[int]:
        return list(self._open(self.key_to_file[key]).get_slice(key).get_shape())

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()


# per-expert key layouts: (gate, up, down) suffixes under "<prefix>.<e>."
_PER_EXPERT_LAYOUTS = (
    ("gate_proj.weight", "up_proj.weight", "down_proj.weight"),  # Qwen2/3-MoE, OLMoE, DeepSeek-V3
    ("w1.weight", "w3.weight", "w2.weight"),  # Mixtral
)


def _candidate_prefixes(name: str, base_model_prefix: str) -> list[str]:
    names = [name]
    if ".mlp.experts" in name:  # Mixtral checkpoints: block_sparse_moe
        names.append(name.replace(".mlp.experts", ".block_sparse_moe.experts"))
    out: list[str] = []
    for n in names:
        out.append(n)
        if base_model_prefix:
            bp = base_model_prefix + "."
            out.append(n[len(bp) :] if n.startswith(bp) else bp + n)
    return list(dict.fromkeys(out))


def _stream_block(ckpt: _Checkpoint, b: ExpertsBlock, E: int, H: int, I: int, ktm, dtype, base_model_prefix,
                  fingerprint=None, layout=None):
    """Read block ``b``'s experts out of the checkpoint into ``ktm.load_expert``, one expert at a time.

    Fused keys are in the replaced class's ``layout`` (gpt-oss: transposed, gate/up interleaved)."""
    layout = layout or SILU_CONCATENATED
    shapes = layout.shapes(E, H, I)
    tried = []
    for p in _candidate_prefixes(b.name, base_model_prefix):
        fused = [(f"{p}.gate_up_proj", f"{p}.down_proj")]
        if p.endswith(".experts"):  # Granite-MoE checkpoints: <block>.input_linear / output_linear, [E,2I,H] / [E,H,I]
            parent = p[: -len(".experts")]
            fused.append((f"{parent}.input_linear.weight", f"{parent}.output_linear.weight"))
        gu_key, dn_key = next(((g, d) for g, d in fused if g in ckpt and d in ckpt), fused[0])
        tried.extend(g for g, _ in fused)
        if gu_key in ckpt and dn_key in ckpt:
            if ckpt.shape(gu_key) != list(shapes["gate_up_proj"]) or ckpt.shape(dn_key) != list(shapes["down_proj"]):
                raise ValueError(
                    f"{gu_key}: shapes {ckpt.shape(gu_key)} / {ckpt.shape(dn_key)}, "
                    f"expected {list(shapes['gate_up_proj'])} / {list(shapes['down_proj'])}"
                )
            for e in range(E):
                gate, up = layout.split_gate_up(ckpt.get_row(gu_key, e))
                ktm.load_expert(e, torch.cat([gate, up]).to(dtype), layout.down(ckpt.get_row(dn_key, e)).to(dtype),
                                fingerprint=fingerprint)
            return
        blocks_key = f"{p}.gate_up_proj_blocks"
        tried.append(blocks_key)
        if blocks_key in ckpt:  # MXFP4 (gpt-oss checkpoints): dequantized expert by expert
            _stream_mxfp4(ckpt, p, E, H, I, ktm, dtype, layout, fingerprint)
            return
        for g_sfx, u_sfx, d_sfx in _PER_EXPERT_LAYOUTS:
            first = f"{p}.0.{g_sfx}"
            tried.append(first)
            if first not in ckpt:
                continue
            for e in range(E):
                g = ckpt.get(f"{p}.{e}.{g_sfx}")
                u = ckpt.get(f"{p}.{e}.{u_sfx}")
                d = ckpt.get(f"{p}.{e}.{d_sfx}")
                if list(g.shape) != [I, H] or list(u.shape) != [I, H] or list(d.shape) != [H, I]:
                    raise ValueError(f"{p}.{e}: shapes {list(g.shape)}, {list(u.shape)}, {list(d.shape)}")
                ktm.load_expert(e, torch.cat([g, u], 0).to(dtype), d.to(dtype), fingerprint=fingerprint)
                del g, u, d
            return
    raise KeyError(f"{b.name} ({b.class_name}): no expert weights in the checkpoint; looked for {tried}")


def _stream_mxfp4(ckpt: _Checkpoint, p: str, E: int, H: int, I: int, ktm, dtype, layout, fingerprint) -> None:
    """gpt-oss MXFP4 experts: ``<p>.gate_up_proj_blocks`` [E, 2I, H/32, 16] + ``_scales`` [E, 2I, H/32]
    and the same for down_proj ([E, H, I/32, 16]); rows are output features (not transposed)."""
    from .mxfp4 import dequantize_mxfp4

    rows = dataclasses.replace(layout, transposed=False)  # stored output-major
    want = {"gate_up_proj": [E, 2 * I, H // 32, 16], "down_proj": [E, H, I // 32, 16]}
    for name, shape in want.items():
        got = ckpt.shape(f"{p}.{name}_blocks")
        if got != shape or ckpt.shape(f"{p}.{name}_scales") != shape[:3]:
            raise ValueError(f"{p}.{name}_blocks / _scales: shapes {got} / {ckpt.shape(f'{p}.{name}_scales')}, "
                             f"expected {shape} / {shape[:3]}")
    for e in range(E):
        gate_up = dequantize_mxfp4(ckpt.get_row(f"{p}.gate_up_proj_blocks", e),
                                   ckpt.get_row(f"{p}.gate_up_proj_scales", e))  # [2I, H]
        down = dequantize_mxfp4(ckpt.get_row(f"{p}.down_proj_blocks", e), ckpt.get_row(f"{p}.down_proj_scales", e))
        gate, up = rows.split_gate_up(gate_up)
        ktm.load_expert(e, torch.cat([gate, up]).to(dtype), down.to(dtype), fingerprint=fingerprint)


_LOAD_HOOK_LOCK = threading.Lock()


@contextlib.contextmanager
def _before_and_after_weight_loading(before, after):
    """Run ``before(model)`` after transformers built the (meta) model and before it loads weights,
    and ``after(model, loading_info)`` right after; both through ``PreTrainedModel._load_pretrained_model``.

    The one place torch_ktmoe touches a private transformers function. Checked against
    transformers 5.19.0 (sglang 0.5.23's pin) and 5.24.0: a staticmethod
    ``(model, state_dict, checkpoint_files, load_config, expected_keys=None)`` returning
    ``(LoadStateDictInfo, dict)``. We found no public hook between building the model and
    loading its weights that can swap modules (``key_mapping`` and the weight conversions
    rename and transform tensors only). ``tests/test_hf.py::test_private_load_hook_still_fits``
    fails when that function changes shape; ``from_pretrained`` raises when it is not called.
    """
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__["_load_pretrained_model"]
    fn = original.__func__ if isinstance(original, staticmethod) else original
    fired: list[bool] = []

    def hooked(model, *args, **kwargs):
        before(model)
        fired.append(True)
        out = fn(model, *args, **kwargs)
        info = out[0] if isinstance(out, tuple) else out
        after(model, info)
        return out

    with _LOAD_HOOK_LOCK:
        PreTrainedModel._load_pretrained_model = staticmethod(hooked)
        try:
            yield fired
        finally:
            PreTrainedModel._load_pretrained_model = original


def _map_packed_layers(path, manifest, by_module, entries, ktmoe_kwargs, report) -> None:
    """from_pretrained of a packed model directory: every experts layer mapped from its files."""
    missing = [b.name for b, *_ in entries if b.name not in by_module]
    if missing or len(entries) != len(by_module):
        raise hf_packed.PackedDirError(
            f"from_pretrained({path}): the model's experts blocks and {hf_packed.MANIFEST} disagree "
            f"(not in the manifest: {missing}; manifest: {sorted(by_module)})"
        )
    for b, E, H, I, adapter in entries:
        entry = by_module[b.name]
        if (entry["num_experts"], entry["hidden_size"], entry["intermediate_size"], entry["top_k"]) != (E, H, I, adapter.top_k):
            raise hf_packed.PackedDirError(
                f"from_pretrained({path}): {b.name}: the config says E, H, I, top_k = {(E, H, I, adapter.top_k)}, "
                f"the manifest {(entry['num_experts'], entry['hidden_size'], entry['intermediate_size'], entry['top_k'])}"
            )
        ktm = hf_packed.load_layer(entry, path, manifest["experts_dir"], {**adapter.layout.ktmoe_kwargs(), **ktmoe_kwargs})
        adapter.ktmoe = ktm
        adapter.layer_idx = ktm.layer_idx
        _account(report, b, ktm, 0)


def save_packed(model: nn.Module, directory, **kwargs) -> dict:
    """Write a patched model as a packed model directory (see :mod:`torch_ktmoe.hf_packed`); returns the manifest.

    ``from_pretrained(directory)`` then loads it without the source checkpoint, mapping the experts.
    """
    return hf_packed.save_packed(model, directory, **kwargs)


def _resolve_dir(path) -> str:
    path = os.fspath(path)
    if os.path.isdir(path):
        return path
    from huggingface_hub import snapshot_download

    return snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.py"])


def _config_without_mxfp4(path: str, hf_kwargs: dict):
    """The config of an MXFP4 checkpoint (gpt-oss) without its quantization_config, else None.

    Its experts are dequantized expert by expert by the streaming loader; everything else in
    such a checkpoint is plain bf16, so transformers must not set up its own MXFP4 quantizer."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=hf_kwargs.get("trust_remote_code", False))
    qc = getattr(config, "quantization_config", None)
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    if str(getattr(method, "value", method)) != "mxfp4":
        return None
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
        config = _config_without_mxfp4(path, hf_kwargs)
        if config is not None:
            hf_kwargs["config"] = config
    return path, hf_kwargs


def _packed_dir_layers(path: str, **fixed) -> dict | None:
    """A packed model directory's layers by module name (None for a checkpoint). Such a directory
    fixes the options in ``fixed`` (weight_format, mmap_experts_dir, cache): giving one is an error."""
    if not hf_packed.is_packed_dir(path):
        return None
    given = [k for k, v in fixed.items() if v is not None]
    if given:
        raise hf_packed.PackedDirError(
            f"from_pretrained({path}): a packed model directory fixes {', '.join(given)} (see its {hf_packed.MANIFEST})"
        )
    manifest = hf_packed.read_manifest(path)
    return {"manifest": manifest, "by_module": {e["module"]: e for e in manifest["layers"]}}


class _EmptyExpertsSwap:
    """The before/after hooks of from_pretrained's transformers load.

    ``before(model)``, on the model built on the meta device: every supported experts block becomes
    an empty :class:`KTMoEExperts` (``entries``: block, E, H, I, adapter), so transformers never
    materializes a dense expert; unsupported ones are refused (``strict``) or listed in ``refused``.
    ``after(model, info)``: the checkpoint's dense expert keys, skipped on purpose, are not
    reported as unexpected."""

    def __init__(self, strict: bool):
        self.strict = strict
        self.entries: list = []
        self.refused: list[RefusedBlock] = []

    def before(self, model) -> None:
        if getattr(model, "hf_quantizer", None) is not None or getattr(model.config, "quantization_config", None):
            raise ValueError(
                f"{type(model).__name__}: quantized checkpoints (config.quantization_config) are not supported; "
                "dequantize the checkpoint to bf16 first"
            )
        blocks, refused = find_experts_blocks(model)
        if refused and self.strict:
            raise _refusal_error(model, refused)
        if not blocks and not refused:
            raise ValueError(f"{type(model).__name__}: no Mixture-of-Experts experts block found")
        entries = []
        for b in blocks:
            E, H, I = experts_dims(b.module)
            adapter = _adapter_for(b, None)
            _set_submodule(model, b.name, adapter)
            entries.append((b, E, H, I, adapter))
            b.module = None
        self.entries, self.refused = entries, refused

    def after(self, model, info) -> None:
        unexpected = getattr(info, "unexpected_keys", None)
        if not unexpected:
            return
        prefixes = set()
        for b, *_ in self.entries:
            prefixes.update(p + "." for p in _candidate_prefixes(b.name, model.base_model_prefix))
        for k in list(unexpected):
            if any(k.startswith(p) for p in prefixes):
                unexpected.discard(k)


def _load_without_experts(model_class, path: str, hf_kwargs: dict, strict: bool):
    """transformers' own ``from_pretrained`` with the experts blocks swapped for empty adapters
    before any weight loads; returns (model, the swap with its entries)."""
    if model_class is None:
        from transformers import AutoModelForCausalLM

        model_class = AutoModelForCausalLM
    swap = _EmptyExpertsSwap(strict)
    with _before_and_after_weight_loading(swap.before, swap.after) as fired:
        model = model_class.from_pretrained(path, **hf_kwargs)
    if not fired:
        raise RuntimeError(
            "torch_ktmoe.hf.from_pretrained: transformers did not call PreTrainedModel._load_pretrained_model; "
            "this transformers version is not supported by the streaming loader (use patch_model)"
        )
    return model, swap


def _stream_experts(model, path: str, entries, weight_format: str, mmap_experts_dir, ktmoe_kwargs: dict,
                    report: PatchReport, progress: bool) -> None:
    """Streaming: per experts block, a KTMoE that maps its valid cache files or is filled expert by
    expert from the safetensors shards (in the model's dtype if fp32/bf16, else fp32)."""
    model_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    stream_dtype = model_dtype if model_dtype in (torch.float32, torch.bfloat16) else torch.float32
    source = checkpoint_fingerprint(path, f"dtype={stream_dtype}")
    ckpt = _Checkpoint(path)
    try:
        if progress:
            from tqdm.auto import tqdm

            entries = tqdm(entries, desc="ktmoe: streaming experts", unit="layer")
        with torch.no_grad():
            for b, E, H, I, adapter in entries:
                ktm = _make_ktmoe(E, adapter.top_k, H, I, b.layer_idx, weight_format, mmap_experts_dir, ktmoe_kwargs,
                                  adapter.layout)
                fingerprint = layer_fingerprint(source, b.name)
                if not ktm.try_load_cached(fingerprint):
                    _stream_block(ckpt, b, E, H, I, ktm, stream_dtype, model.base_model_prefix, fingerprint,
                                  adapter.layout)
                adapter.ktmoe = ktm
                _account(report, b, ktm, 0)
    finally:
        ckpt.close()


def from_pretrained(
    pretrained_model_name_or_path,
    *,
    mmap_experts_dir: str | os.PathLike | None = None,
    weight_format: str | None = None,
    dtype=None,
    torch_dtype=None,
    model_class=None,
    strict: bool = True,
    progress: bool = True,
    ktmoe_kwargs: dict | None = None,
    cache: str | None = None,
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

    ``cache`` (``"reuse"`` by default with ``mmap_experts_dir``, ``"rebuild"``, ``"off"``):
    the cache fingerprint of a layer is the checkpoint files' names, sizes and mtimes
    plus the module name and dtype; a layer with valid cache files is mapped and its
    experts are not even read from the safetensors.

    A packed model directory (written by :func:`save_packed`, it holds ``ktmoe_packed.json``)
    loads without its source checkpoint: every experts layer is mapped read-only from the
    directory's files, never packed; its format, group size and NUMA parts come from the
    manifest, so ``weight_format``, ``mmap_experts_dir`` and ``cache`` must not be given.
    """
    path, hf_kwargs = _transformers_kwargs(pretrained_model_name_or_path, torch_dtype if dtype is None else dtype,
                                           hf_kwargs)
    packed = _packed_dir_layers(path, weight_format=weight_format, mmap_experts_dir=mmap_experts_dir, cache=cache)
    ktmoe_kwargs = dict(ktmoe_kwargs or {})
    if cache is not None:
        ktmoe_kwargs["cache"] = cache
    model, swap = _load_without_experts(model_class, path, hf_kwargs, strict)
    report = PatchReport(refused=list(swap.refused))
    if packed is not None:
        _map_packed_layers(path, packed["manifest"], packed["by_module"], swap.entries, ktmoe_kwargs, report)
        model.ktmoe_report = report
        _mark_config(model)
        return model
    _stream_experts(model, path, swap.entries, weight_format or "bf16", mmap_experts_dir, ktmoe_kwargs, report,
                    progress)
    if not report.refused:
        _mark_config(model)
    release_free_heap()  # the dense staging buffers of the stream, back to the OS
    model.ktmoe_report = report
    return model
