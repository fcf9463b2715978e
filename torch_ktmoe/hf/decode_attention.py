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
to it; :func:`torch_ktmoe.hf.compile_decode` does so itself.
"""
from __future__ import annotations

import torch
from torch import nn

NAME = "ktmoe_decode"
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


def use_decode_attention(model: nn.Module) -> bool:
    """Switch ``model`` (a transformers model) from ``"sdpa"`` attention to ``"ktmoe_decode"``: the same
    results, single-token decode as grouped matmuls. Returns whether it switched; a model on another
    attention (eager, flash, flex, a kernel) or one that cannot switch dynamically is left as it is."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == NAME:
        return True
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    register()
    model.set_attn_implementation(NAME)
    return config._attn_implementation == NAME
