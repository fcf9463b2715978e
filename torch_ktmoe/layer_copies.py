"""KTMoE's copies: copy.deepcopy shares the packed experts; pickling sends them by value or by cache file.

Functions that :class:`torch_ktmoe.layer.KTMoE`'s ``__deepcopy__`` and ``__reduce__`` call
(they use its constructor's arguments, ``arenas``, ``packed_tensors``, ``biases``,
``try_load_cached``). Packed experts are immutable, so an
in-process copy shares them and their arenas. Another process gets anonymous experts by
value, or file-backed ones by the name of their kept cache files (it maps the same files);
any other case raises a TypeError that says why and what to do instead.
"""
import copy

import torch


def deepcopy_layer(layer, memo):
    """A new module sharing the packed experts (immutable) and their arenas (and, by its own ``__deepcopy__``, the
    experts directory's object); the rest is copied."""
    new = layer.__class__.__new__(layer.__class__)
    memo[id(layer)] = new
    shared = [*layer.arenas, *(t for pair in layer.packed_tensors() for t in pair)]
    for obj in shared:
        memo[id(obj)] = obj
    new.__dict__.update(copy.deepcopy(layer.__dict__, memo))
    new.reads.owned_by(new)  # (a predictor of the copied model may have copied them first)
    return new


def constructor_kwargs(layer) -> dict:
    """The keyword arguments that construct a layer like ``layer`` (before any weight is loaded)."""
    return dict(num_experts=layer.num_experts, top_k=layer.top_k, hidden_size=layer.hidden_size,
                intermediate_size=layer.intermediate_size, weight_format=layer.weight_format,
                mmap_experts_dir=layer.mmap_experts_dir, layer_idx=layer.layer_idx,
                numa_parts=layer.numa_parts, group_size=layer.group_size, hugepage=layer._hugepage,
                cache=layer.cache if layer.mmap_experts_dir is not None else None,
                verify=layer.verify, cache_trust_others=layer.cache_trust_others,
                activation=layer.activation, activation_params=layer.activation_params, **layer.reads.modes())


def reduce_layer(layer):
    """``__reduce__``: the experts by value (anonymous) or by the names of their kept cache files."""
    kwargs, where = constructor_kwargs(layer), f"KTMoE(layer {layer.layer_idx})"
    biases = layer.biases()  # small: always by value
    if not layer.loaded:
        return (unpickle_ktmoe, (type(layer), kwargs, None, biases))
    if layer.gguf is not None:
        raise TypeError(f"cannot pickle {where}: its experts are a GGUF file's blocks where they lie "
                        f"({layer.gguf!r}); copying them by value would turn them into anonymous memory. Load the "
                        "GGUF in the receiver (it maps the same file), or copy.deepcopy in-process.")
    stats = layer.arena_stats()
    if all(s["file_backed_bytes"] == 0 for s in stats):  # anonymous: by value
        data = [(w13.numpy().copy(), w2.numpy().copy()) for w13, w2 in layer.packed_tensors()]
        return (unpickle_ktmoe, (type(layer), dict(kwargs, mmap_experts_dir=None, cache=None), ("bytes", data), biases))
    if any(s["anon_bytes"] for s in stats):
        raise TypeError(f"cannot pickle {where}: part of its experts fell back to anonymous memory "
                        f"and part is file-backed in {layer.mmap_experts_dir}; another process could "
                        "not rebuild that mix. Copy it in-process with copy.deepcopy, or reload it there.")
    if layer.cache == "off" or layer.cache_fingerprint is None:
        raise TypeError(f"cannot pickle {where}: its file-backed experts live in unnamed files "
                        "(cache='off') that no other process can open, and copying them by value "
                        "would turn them into anonymous memory. Use cache='reuse' (the receiver then "
                        "maps the same cache files), or copy.deepcopy in-process.")
    if not layer.arenas.kept:  # no kept file to map
        why = layer.arenas.refusals() or "no cache file was kept"
        raise TypeError(f"cannot pickle {where}: its file-backed experts live in unnamed files that no "
                        f"other process can open: the cache in {layer.mmap_experts_dir} kept no file ({why}). "
                        "Use a cache directory that only you can write (or cache_trust_others=True), "
                        "or copy.deepcopy in-process.")
    return (unpickle_ktmoe, (type(layer), dict(kwargs, cache="map" if layer.cache == "map" else "reuse"), ("files", layer.cache_fingerprint), biases))


def unpickle_ktmoe(cls, kwargs: dict, weights, biases=(None, None)):
    """The receiving side of reduce_layer: a new ``cls(**kwargs)`` with the experts by value or mapped."""
    m = cls(**kwargs)
    m.set_biases(*biases)
    if weights is None:
        return m
    kind, payload = weights
    if kind == "bytes":
        for p, (w13, w2) in enumerate(payload):  # into the new layer's (anonymous) arenas: 64-byte aligned
            setattr(m, f"w13_{p}", m.arenas[p].empty(w13.shape).copy_(torch.from_numpy(w13)))
            setattr(m, f"w2_{p}", m.arenas[p].empty(w2.shape).copy_(torch.from_numpy(w2)))
        return m
    if not m.try_load_cached(payload):
        reasons = "; ".join(f"{e['name']}: {e['reason']}" for e in m.cache_events) or "no cache"
        raise RuntimeError(f"unpickling KTMoE(layer {m.layer_idx}): the packed cache files in "
                           f"{m.mmap_experts_dir} are missing or no longer valid ({reasons})")
    return m
