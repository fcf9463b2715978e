"""``from_pretrained(path, gguf_file=...)``: a transformers MoE model from a GGUF file, its experts where they lie.

1. The config from the GGUF's metadata (:mod:`.gguf_config`), the model class from the config.
2. Every tensor that is not a routed expert, dequantized exactly (``ops.ggml_dequantize``: gguf's own values)
   into the model's dtype under its transformers name (gguf's own name table, read backwards from the model's
   parameter names), with the transforms llama.cpp's converter applied undone (a ``llama`` file's q / k rows
   permuted for its rope). transformers builds the model from that state dict (``from_pretrained(None,
   config=..., state_dict=...)``), the experts blocks swapped for empty adapters before any weight loads
   (:mod:`.load_hook`). A parameter the file lacks is an error, never a random initialization.
3. Each layer's routed experts: by default a :class:`~torch_ktmoe.KTMoE` of ``weight_format="gguf"`` over the
   file's blocks where they lie (mapped: the file's page cache, no copy, no pack); with a ``weight_format``,
   dequantized expert by expert and packed (into ``mmap_experts_dir``'s cache, fingerprinted by the GGUF files).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import torch

from .. import ops
from ..checkpoint import load_experts
from ..checkpoint.fingerprint import files_fingerprint
from ..checkpoint.gguf import GGUFError, GGUFModel, expert_layers, layer_experts, open_gguf, split_paths
from ..layer import GGUF_FORMAT, KTMoE
from .gguf_config import gguf_config
from .vocabulary import PatchReport, account

_PERMUTED_ROPE = ("llama",)  # llama.cpp's converter permutes these archs' q / k rows for its rope


def resolve_gguf(path, gguf_file) -> str:
    """The GGUF file: ``gguf_file`` itself when it is a file, else under ``path`` (a directory, or a Hub
    repository whose file, or split parts, are downloaded)."""
    gguf_file = os.fspath(gguf_file)
    if os.path.isfile(gguf_file):
        return gguf_file
    path = os.fspath(path) if path is not None else ""
    local = os.path.join(path, gguf_file)
    if os.path.isfile(local) or os.path.isdir(path):
        return local  # (a missing file is named by open_gguf)
    from huggingface_hub import snapshot_download

    stem = gguf_file.split("-00001-of-")[0].removesuffix(".gguf")
    return os.path.join(snapshot_download(path, allow_patterns=[f"{stem}*.gguf"]), gguf_file)


def gguf_to_hf_names(model: GGUFModel, meta_model) -> Dict[str, str]:
    """GGUF tensor name -> transformers parameter name, for every parameter of ``meta_model`` (on the meta
    device) that gguf's name table knows (the routed experts' it does not: they are read separately)."""
    import gguf

    arch = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == model.architecture), None)
    if arch is None:
        raise GGUFError(f"the gguf package has no tensor names for architecture {model.architecture!r}")
    table = gguf.get_tensor_name_map(arch, meta_model.config.num_hidden_layers)
    names = {}
    for hf_name in meta_model.state_dict():
        if ".experts." in hf_name:
            continue
        base, _, suffix = hf_name.rpartition(".")
        if hf_name.endswith("_bias") and table.get_name(hf_name[:-len("_bias")]) is not None:
            names[f"{table.get_name(hf_name[:-len('_bias')])}.bias"] = hf_name  # e_score_correction_bias
        elif table.get_name(base) is not None:
            names[f"{table.get_name(base)}.{suffix}"] = hf_name
        elif table.get_name(hf_name) is not None:  # a parameter without a .weight suffix (gpt-oss's sinks)
            names[f"{table.get_name(hf_name)}.weight"] = hf_name
    return names


def _kv_b_from_halves(model: GGUFModel, name: str) -> Optional[torch.Tensor]:
    """DeepSeek's ``attn_kv_b`` [heads * (nope + v), kv_lora] when the file holds it split as llama.cpp's converter
    writes it for its absorbed attention: ``attn_k_b`` [heads, kv_lora, nope] (each head's k rows transposed) and
    ``attn_v_b`` [heads, v, kv_lora]; None when it has neither."""
    k_name, v_name = name.replace(".attn_kv_b.", ".attn_k_b."), name.replace(".attn_kv_b.", ".attn_v_b.")
    if not name.endswith(".attn_kv_b.weight") or k_name not in model.tensors or v_name not in model.tensors:
        return None
    k, v = (_dequantized(model, model.tensors[n]) for n in (k_name, v_name))
    return torch.cat([k.transpose(1, 2), v], 1).reshape(-1, k.shape[1])


def _dequantized(model: GGUFModel, t) -> torch.Tensor:
    return ops.ggml_dequantize(model.rows(t), t.ggml_type).reshape(t.shape)


def expert_biases(model: GGUFModel, meta_model) -> Dict[str, torch.Tensor]:
    """The experts' biases (gpt-oss: ``blk.N.ffn_{gate,up,down}_exps.bias``) as the model's experts modules
    hold them (``gate_up_proj_bias`` [E, 2I] in the module's gate / up order, ``down_proj_bias`` [E, H]), fp32."""
    from .experts import layout_of

    state: Dict[str, torch.Tensor] = {}
    for name, module in meta_model.named_modules():
        bias = getattr(module, "gate_up_proj_bias", None)
        if not isinstance(bias, torch.Tensor) or not name.endswith("mlp.experts"):
            continue
        layer = int(name.split(".layers.")[1].split(".")[0])
        found = []
        for role in ("gate", "up", "down"):
            t = model.tensors.get(f"blk.{layer}.ffn_{role}_exps.bias")
            if t is None:
                raise GGUFError(f"GGUF file {model.files[0].path!r} lacks blk.{layer}.ffn_{role}_exps.bias, the "
                                f"expert biases of {name}")
            found.append(_dequantized(model, t))
        gate, up, down = found
        gate_up = torch.stack([gate, up], -1).flatten(-2) if layout_of(module).interleaved else torch.cat([gate, up], -1)
        if tuple(gate_up.shape) != tuple(bias.shape):
            raise GGUFError(f"GGUF file {model.files[0].path!r}: layer {layer}'s expert biases are "
                            f"{list(gate.shape)}, {name} needs [E, I] for gate and up")
        state[f"{name}.gate_up_proj_bias"], state[f"{name}.down_proj_bias"] = gate_up, down
    return state


def _unpermute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter's q / k row permutation: it stores each head's rows [first half, second half]
    interleaved in pairs (row 2j from the first half's j, 2j+1 from the second's), as its rope pairs them."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dense_state_dict(model: GGUFModel, meta_model, dtype: torch.dtype, progress: bool) -> Dict[str, torch.Tensor]:
    """Every non-expert parameter and buffer of ``meta_model`` from the GGUF, dequantized exactly, in ``dtype``
    (fp32 where the model keeps a module in fp32: its ``_keep_in_fp32_modules``, e.g. routers). GGUFError naming
    those the file lacks (a tied ``lm_head`` excepted)."""
    names = gguf_to_hf_names(model, meta_model)
    config = meta_model.config
    tensors = [t for name, t in model.tensors.items() if name in names]
    if progress:
        from tqdm.auto import tqdm

        tensors = tqdm(tensors, desc="ktmoe: GGUF dense weights", unit="tensor")
    state: Dict[str, torch.Tensor] = {}
    cast = _caster(meta_model, dtype)
    for name, hf_name in names.items():  # weights the file holds in another form
        w = _kv_b_from_halves(model, name) if name not in model.tensors else None
        if w is not None:
            state[hf_name] = cast(hf_name, w)
    for t in tensors:
        hf_name = names[t.name]
        w = _dequantized(model, t)
        if model.architecture in _PERMUTED_ROPE and t.name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in t.name else config.num_key_value_heads
            w = _unpermute_rope(w, heads)
        want = tuple(meta_model.get_parameter(hf_name).shape) if _is_parameter(meta_model, hf_name) else None
        if want is not None and tuple(w.shape) != want:
            if w.numel() != torch.Size(want).numel():
                raise GGUFError(f"GGUF file {t.file!r}: {t.name} has shape {list(t.shape)}, but {hf_name} of "
                                f"{type(meta_model).__name__} is {list(want)}")
            w = w.reshape(want)  # e.g. qwen2moe's shared-expert gate, [H] in the file and [1, H] here
        state[hf_name] = cast(hf_name, w)
    state.update({k: cast(k, v) for k, v in expert_biases(model, meta_model).items()})
    expected = {n for n in meta_model.state_dict() if ".experts." not in n or n.endswith("_proj_bias")}
    missing = sorted(expected - set(state))
    if config.tie_word_embeddings:
        missing = [n for n in missing if not n.endswith("lm_head.weight")]
    if missing:
        raise GGUFError(f"GGUF file {model.files[0].path!r} lacks {len(missing)} of {type(meta_model).__name__}'s "
                        f"weights, e.g. {missing[:3]}")
    return state


def _caster(meta_model, dtype: torch.dtype):
    """(name, fp32 tensor) -> the tensor in ``dtype``, or kept fp32 where transformers keeps the module in fp32
    (its ``_keep_in_fp32_modules`` / ``_strict`` names, matched in the parameter name as transformers does)."""
    import re

    keep = [*(getattr(meta_model, "_keep_in_fp32_modules", None) or []),
            *(getattr(meta_model, "_keep_in_fp32_modules_strict", None) or [])]
    fp32 = re.compile("|".join(re.escape(m) for m in keep)) if keep else None
    return lambda name, w: w if fp32 is not None and fp32.search(name) else w.to(dtype)


def _is_parameter(module, name: str) -> bool:
    try:
        module.get_parameter(name)
        return True
    except AttributeError:
        return False


def unread_tensors(model: GGUFModel, state: Dict[str, torch.Tensor], meta_model) -> List[str]:
    """GGUF tensors neither dense weights, routed experts nor their biases read into ``state`` (e.g. llama.cpp's
    ``rope_freqs``)."""
    read = set(gguf_to_hf_names(model, meta_model))
    read |= {n.replace(".attn_kv_b.", half) for n in read for half in (".attn_k_b.", ".attn_v_b.")}
    experts = {t.name for layer in expert_layers(model) for t in (layer.gate, layer.up, layer.down)}
    if any(k.endswith("experts.down_proj_bias") for k in state):
        experts |= {n[:-len(".weight")] + ".bias" for n in experts}
    return sorted(n for n in model.tensors if n not in read and n not in experts)


def load_gguf_experts(model: GGUFModel, gguf_path: str, entries, weight_format: Optional[str], mmap_experts_dir,
                      ktmoe_kwargs: dict, report: PatchReport, progress: bool) -> None:
    """Per swapped experts block (``entries``: block, E, H, I, adapter), its layer's experts from the GGUF: in
    place (``weight_format`` None) or dequantized and packed into ``weight_format``."""
    layers = {layer.layer: layer for layer in expert_layers(model)}
    source = files_fingerprint(split_paths(gguf_path), [os.path.basename(p) for p in split_paths(gguf_path)],
                               "gguf")
    if progress:
        from tqdm.auto import tqdm

        entries = tqdm(entries, desc="ktmoe: GGUF experts", unit="layer")
    for b, E, H, I, adapter in entries:
        layer = layers.get(b.layer_idx)
        if layer is None:
            raise GGUFError(f"GGUF file {gguf_path!r} has no routed experts for layer {b.layer_idx} ({b.name})")
        if layer.shape != (E, H, I):
            raise GGUFError(f"GGUF file {gguf_path!r}: layer {b.layer_idx}'s experts are (E, H, I) = {layer.shape}, "
                            f"the model's {b.name} {(E, H, I)}")
        kwargs = {**adapter.layout.ktmoe_kwargs(), **ktmoe_kwargs}
        if weight_format is None:
            kwargs.pop("cache", None)
            ktm = KTMoE(E, adapter.top_k, H, I, weight_format=GGUF_FORMAT, layer_idx=b.layer_idx, **kwargs)
            ktm.load_gguf(layer_experts(model, layer))
        else:
            experts = _dequantized_experts(model, layer)
            ktm = load_experts(E, adapter.top_k, H, I, experts, source=source, key=b.name, dtype=torch.float32,
                               mmap_experts_dir=mmap_experts_dir, weight_format=weight_format,
                               layer_idx=b.layer_idx, **kwargs)
        adapter.ktmoe = ktm
        account(report, b, ktm, 0)


def _dequantized_experts(model: GGUFModel, layer):
    """Per expert (gate_up [2I, H], down [H, I]) fp32, dequantized when asked for (load_experts' lazy input)."""
    gate, up, down = (model.rows(t) for t in (layer.gate, layer.up, layer.down))
    types = layer.ggml_types
    for e in range(layer.shape[0]):
        yield (torch.cat([ops.ggml_dequantize(gate[e], types[0]), ops.ggml_dequantize(up[e], types[1])]),
               ops.ggml_dequantize(down[e], types[2]))


def open_gguf_model(path, gguf_file):
    """(the GGUF path, its model, the transformers config) for ``from_pretrained(path, gguf_file=...)``."""
    gguf_path = resolve_gguf(path, gguf_file)
    model = open_gguf(gguf_path)
    return gguf_path, model, gguf_config(model)


def meta_model(model_class, config):
    """``model_class`` built from ``config`` on the meta device: its parameter names and shapes."""
    with torch.device("meta"):
        return model_class._from_config(config)


def causal_lm_class(config):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
