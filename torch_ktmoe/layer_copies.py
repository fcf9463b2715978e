"""KTMoE's copies: copy.deepcopy shares the packed experts; pickling sends them by value or by cache file.

A mixin of :class:`torch_ktmoe.layer.KTMoE` (it uses ``_constructor_kwargs``, ``arenas``,
``packed_tensors``, ``biases``, ``try_load_cached``). Packed experts are immutable, so an
in-process copy shares them and their arenas. Another process gets anonymous experts by
value, or file-backed ones by the name of their kept cache files (it maps the same files);
any other case raises a TypeError that says why and what to do instead.
"""
import copy

import torch


class Copies:
    def __deepcopy__(self, memo):
        """A new module sharing the packed experts (immutable) and their arenas; the rest is copied."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for obj in [*self.arenas, *(t for pair in self.packed_tensors() for t in pair)]:
            memo[id(obj)] = obj
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def __reduce__(self):
        kwargs, where = self._constructor_kwargs(), f"KTMoE(layer {self.layer_idx})"
        biases = self.biases()  # small: always by value
        if not self.loaded:
            return (unpickle_ktmoe, (type(self), kwargs, None, biases))
        stats = self.arena_stats()
        if all(s["file_backed_bytes"] == 0 for s in stats):  # anonymous: by value
            data = [(w13.numpy().copy(), w2.numpy().copy()) for w13, w2 in self.packed_tensors()]
            return (unpickle_ktmoe, (type(self), dict(kwargs, mmap_experts_dir=None, cache=None), ("bytes", data), biases))
        if any(s["anon_bytes"] for s in stats):
            raise TypeError(f"cannot pickle {where}: part of its experts fell back to anonymous memory "
                            f"and part is file-backed in {self.mmap_experts_dir}; another process could "
                            "not rebuild that mix. Copy it in-process with copy.deepcopy, or reload it there.")
        if self.cache == "off" or self.cache_fingerprint is None:
            raise TypeError(f"cannot pickle {where}: its file-backed experts live in unnamed files "
                            "(cache='off') that no other process can open, and copying them by value "
                            "would turn them into anonymous memory. Use cache='reuse' (the receiver then "
                            "maps the same cache files), or copy.deepcopy in-process.")
        if not all(a.read_only and not a.cache_refusal for a in self.arenas):  # no kept file to map
            why = "; ".join(dict.fromkeys(a.cache_refusal for a in self.arenas if a.cache_refusal)) or (
                "no cache file was kept")
            raise TypeError(f"cannot pickle {where}: its file-backed experts live in unnamed files that no "
                            f"other process can open: the cache in {self.mmap_experts_dir} kept no file ({why}). "
                            "Use a cache directory that only you can write (or cache_trust_others=True), "
                            "or copy.deepcopy in-process.")
        return (unpickle_ktmoe, (type(self), dict(kwargs, cache="reuse"), ("files", self.cache_fingerprint), biases))


def unpickle_ktmoe(cls, kwargs: dict, weights, biases=(None, None)):
    """The receiving side of Copies.__reduce__: a new ``cls(**kwargs)`` with the experts by value or mapped."""
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
