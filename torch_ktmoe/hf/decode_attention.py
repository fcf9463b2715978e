"""``"ktmoe_decode"``: transformers' SDPA attention with single-token decode done as grouped matmuls.

At decode (one query token) torch's CPU ``scaled_dot_product_attention`` costs ~0.2 ms per layer over a
handful of cached positions and ~0.7 ms over a 130-position static cache (its flash kernel is built for
long queries; under ``torch.compile`` transformers also materialises ``repeat_kv`` of the whole cache).
A 48-layer model pays that per token. Here a one-token query attends per key/value head:

    q [B, H, 1, D] -> [B, KV, H/KV, D];  s = q·kᵀ·scale [B, KV, H/KV, N] (fp32);  mask;  p = softmax(s);
    out = p·v -> [B, 1, H, Dv]

three small fp32 ops that inductor fuses, with no copy of the cache. Everything else (prefill,
dropout, soft-capping, position bias, attention sinks, returned weights) goes to transformers' own
``sdpa_attention_forward`` unchanged, and masks are built as for ``"sdpa"``.

``use_decode_attention(model)`` switches a model whose attention is ``"sdpa"`` (transformers' default)
to it; :func:`torch_ktmoe.hf.compile_decode` and, by default, ``patch_model`` / ``from_pretrained`` do so
themselves. A model whose modeling code tests for ``"sdpa"`` by name stays on SDPA
(:func:`decode_attention_refusal`): the sparse indexers of DeepSeek-V3.2, ``glm_moe_dsa`` and AXK-2, for
one, fold their selection into the mask only under ``"eager"`` / ``"sdpa"`` and hand it to any other
attention as ``indices``, which neither this function nor SDPA reads.
"""
from __future__ import annotations

import functools
import inspect
import re
import sys

import torch
from torch import nn

NAME = "ktmoe_decode"
# a test of the attention implementation's name against "sdpa" (==, !=, in, not in), on one line
_TESTS_FOR_SDPA = re.compile(r"""_attn_implementation\s*(?:[!=]=|(?:not\s+)?in\b)\s*[^\n]*["']sdpa["']""")
# keyword arguments that change the attention itself (SDPA handles them or refuses them by name); others
# (sliding_window, is_causal, position_ids, ...) are already in the mask or mean nothing for one query
_SDPA_ONLY = ("softcap", "position_bias", "s_aux", "sinks", "output_attentions")


def _given(option) -> bool:
    return option is not None and option is not False


def decode_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs):
    """transformers' attention-function signature: query [B, H, Q, D], key / value [B, KV, N, D(v)], mask
    [B, 1 or H, Q, N] (bool: True attends; float: added) or None -> ([B, Q, H, Dv], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, h, q_len, d = query.shape
    kv = key.shape[1]
    if q_len != 1 or dropout or h % kv or any(_given(kwargs.get(k)) for k in _SDPA_ONLY):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    g = h // kv
    n, dv = key.shape[2], value.shape[-1]
    scale = d ** -0.5 if scaling is None else scaling
    q = query.reshape(b, kv, g, d).float()
    s = torch.matmul(q, key.float().transpose(-1, -2)) * scale  # [B, KV, G, N]
    if attention_mask is not None:
        m = attention_mask.reshape(b if attention_mask.shape[0] == b else 1,
                                             kv if attention_mask.shape[1] == h else 1, -1, n)
        s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m.float()
    p = torch.softmax(s, dim=-1)
    out = torch.matmul(p, value.float())  # [B, KV, G, Dv]
    return out.to(query.dtype).reshape(b, 1, h, dv), None


def register() -> None:
    """Registers NAME in transformers' attention and mask interfaces (masks: SDPA's). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, decode_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@functools.cache
def _tests_for_sdpa(module_name: str) -> bool:
    try:
        source = inspect.getsource(sys.modules[module_name])
    except (KeyError, OSError, TypeError):
        return False
    return _TESTS_FOR_SDPA.search(source) is not None


def decode_attention_refusal(model: nn.Module) -> str | None:
    """Why :func:`use_decode_attention` leaves ``model`` as it is, or None (it switches, or has switched)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl == NAME:
        return None
    if impl != "sdpa":
        return f"attention {impl!r} left as it is ({NAME!r} replaces 'sdpa' only)"
    if not hasattr(model, "set_attn_implementation"):
        return f"{type(model).__name__} cannot switch its attention (no set_attn_implementation)"
    modules = sorted({type(m).__module__ for m in model.modules()} - {None})
    testing = [m for m in modules if not m.startswith(("torch.", "torch_ktmoe.")) and _tests_for_sdpa(m)]
    if testing:
        return (f"attention left 'sdpa': {testing[0]} tests for 'sdpa' by name, so under {NAME!r} its attention "
                f"would compute something else")
    return None


def use_decode_attention(model: nn.Module) -> bool:
    """Switch ``model`` (a transformers model) from ``"sdpa"`` attention to ``"ktmoe_decode"``: the same
    results, single-token decode as grouped matmuls. Returns whether it switched (or already had); a model
    on another attention (eager, flash, flex, a kernel), one that cannot switch dynamically and one whose
    code tests for ``"sdpa"`` by name are left as they are (:func:`decode_attention_refusal` says why)."""
    if decode_attention_refusal(model) is not None:
        return False
    if model.config._attn_implementation == NAME:
        return True
    register()
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME
