"""KTMoE: an nn.Module over packed experts, the Hugging Face experts signature: its loading, cache and forward
(its arenas: layer_arenas.py; its reading ahead: the residency package, one LayerReads per layer; copy and pickle:
layer_copies.py)."""
from typing import List, Mapping, Optional, Union

import torch
from torch import nn

from . import cache as _cache
from . import expert_biases, layer_copies, layer_repr, ops
from ._native import _C
from .gguf_experts import GGUFExperts
from .layer_arenas import LayerArenas
from .part_packing import exact_companions, pack_part
from .paths import utf8_path
from .pending_experts import PendingExperts
from .residency.layer_reads import LayerReads
from .residency.layer_view import LayerReadsView

GGUF_FORMAT = "gguf"  # weight_format of a layer whose experts are GGML blocks where a GGUF file holds them


class KTMoE(LayerReadsView, nn.Module):
    """The routed experts of one MoE layer, run by ``torch.ops.ktmoe.moe_forward``.

    Args:
        num_experts, top_k, hidden_size, intermediate_size: the layer's shape (E, k, H, I).
        weight_format: ``"bf16"``, ``"int8"``, ``"int4"``, ``"fp8"``, ``"int4_affine"`` or ``"mxfp4"`` (docs/formats.md),
            or ``"gguf"``: the experts are a GGUF file's blocks where they lie, given to :meth:`load_gguf` (one NUMA
            part; nothing packed, nothing in ``mmap_experts_dir``).
        mmap_experts_dir: ``None`` keeps packed experts in anonymous memory. A directory keeps them in
            ``MAP_SHARED`` files under it, one per (layer, NUMA part), named from ``layer_idx``: clean page cache that
            the kernel can reclaim and refault instead of swapping. Nothing else changes. A directory that cannot hold
            them (missing, unwritable, tmpfs, full) falls back to anonymous memory with a warning.
        layer_idx: names the layer's arena files.
        numa_parts: split the experts along the intermediate dimension into this many parts, one arena per part,
            first-touched on NUMA node ``part % nodes``; partial outputs are summed in fp32. Default: the host's NUMA
            node count.
        group_size: int4 / fp8 / int4_affine group size along the input dimension (default 32 / 128 /
            128); int8: a scale per (row, group of this many inputs; its activations per the same
            groups), default 32, 0: one per row (per channel, as int8 files packed before groups).
            Quantized checkpoints with NUMA parts: each part must start at a multiple of it.
        hugepage: ``MADV_HUGEPAGE`` on the experts' memory: file-backed slices, and anonymous
            allocations of 2 MiB and more (transparent huge pages: fewer TLB misses while decode streams them).
        cache: with ``mmap_experts_dir``, ``"reuse"`` (default) keeps the packed experts in
            ``<dir>/layer{idx:04d}.part{p}.ktmoe`` and, when a valid file for the same weights exists, maps it (copy
            on write) instead of packing; ``"rebuild"`` always packs and replaces the files; ``"off"`` uses unnamed
            files that vanish with the process; ``"map"`` only maps valid kept files, read-only (no lock file, no
            cleanup, nothing created, written or deleted in the directory; :meth:`try_load_cached` is the only load,
            and a missing or invalid file is named in :attr:`cache_events`). Ignored without a directory. See
            :mod:`torch_ktmoe.cache`; :attr:`cache_hit` and :attr:`cache_events` tell what happened at the last load.
        verify: how a kept cache file is checked before it is mapped: ``"header"`` (default, instant: file header,
            size and every expert's packed header) or ``"full"`` (also a checksum of all the data; a mismatch
            rebuilds).
        cache_trust_others: accept cache files and directories owned by another user or writable by others (refused
            by default: the layer then packs into an unnamed file and keeps nothing).
        activation: the gated activation between the projections, a row of ``ops.GATED_ACTIVATIONS``: ``"silu"``
            (``silu(gate) * up``, default), ``"silu_clamp"``, ``"silu_clamp_after"``, ``"swiglu_oai"`` (gpt-oss),
            ``"swiglu_softcap"`` (docs/formats.md lists their formulas).
        activation_params: the row's parameters by name (e.g. ``{"limit": 7.0}``); the ones not given take the row's
            defaults.
        warm, prefetch, residency, next_layer_prefetch: how the layer reads its experts ahead, each ``"auto"``
            by default: while its experts are in files that do not fit in memory
            (:class:`torch_ktmoe.residency.LayerReads` documents the four; outputs are the same whatever they are).

    Expert biases (gpt-oss) are given with :meth:`set_biases` (or to :meth:`load_weights`); they are small fp32
    buffers in anonymous memory, not part of the packed cache files.

    ``forward(hidden_states [T, H] | [B, S, H], topk_ids [T, k], topk_weights [T, k])`` returns the weighted sum of
    the routed experts, shaped and typed like ``hidden_states`` (bf16, fp16 or fp32; fp16 is converted in the kernel's
    activation prep). Ids < 0 are skipped. Inference only: a backward through it raises
    :class:`torch_ktmoe.ops.InferenceOnlyError`.

    Copies (:mod:`torch_ktmoe.layer_copies`). ``copy.deepcopy`` shares the packed experts (immutable) and copies the
    rest. Pickling sends anonymous experts by value and file-backed experts in kept cache files as (directory,
    fingerprint), mapped copy-on-write from the same files; other file-backed experts raise ``TypeError`` saying why.
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
                 weight_format: str = "bf16", mmap_experts_dir: Optional[str] = None,
                 layer_idx: int = 0, numa_parts: Optional[int] = None, group_size: Optional[int] = None,
                 hugepage: bool = True, warm: str = "auto", cache: Optional[str] = None,
                 verify: str = "header", cache_trust_others: bool = False, activation: str = "silu",
                 activation_params: Optional[Mapping[str, float]] = None, prefetch: Union[str, bool] = "auto",
                 residency: Union[str, bool] = "auto", next_layer_prefetch: Union[str, bool] = "auto"):
        super().__init__()
        self.reads = LayerReads(int(layer_idx), int(num_experts), int(top_k), warm=warm, prefetch=prefetch,
                                residency=residency, next_layer_prefetch=next_layer_prefetch,
                                owner=self)  # its reading ahead (ValueError naming a bad switch)
        params = ops.activation_params(activation, activation_params)  # ValueError naming what is wrong
        if weight_format not in ops.WEIGHT_FORMATS and weight_format != GGUF_FORMAT:
            raise ValueError(f"weight_format must be one of {(*ops.WEIGHT_FORMATS, GGUF_FORMAT)}, got {weight_format!r}")
        nodes = _C.numa_node_count()
        gguf = weight_format == GGUF_FORMAT
        parts = (1 if gguf else nodes) if numa_parts is None else int(numa_parts)
        if not 1 <= parts <= intermediate_size:
            raise ValueError(f"numa_parts must be in [1, intermediate_size={intermediate_size}], got {parts}")
        if gguf and parts != 1:
            raise ValueError(f"weight_format='gguf' runs the GGUF file's experts as one part, got numa_parts={parts}")
        self.num_experts, self.top_k = int(num_experts), int(top_k)
        self.hidden_size, self.intermediate_size = int(hidden_size), int(intermediate_size)
        self.weight_format, self.layer_idx = weight_format, int(layer_idx)
        self.group_size = (0 if gguf else ops.default_group_size(weight_format)) if group_size is None else int(group_size)
        self.gguf: Optional[GGUFExperts] = None  # weight_format="gguf": the blocks (load_gguf)
        self.activation = activation
        self.activation_params = dict(zip(ops.GATED_ACTIVATIONS[activation]["params"], params))  # by name, all
        self._activation_args = (activation, list(params))  # the op's (activation, activation_params)
        self.mmap_experts_dir = utf8_path(mmap_experts_dir, "mmap_experts_dir") if mmap_experts_dir is not None else None
        if cache is not None:
            _cache.check_policy(cache)
        self.cache = "off" if self.mmap_experts_dir is None else (cache or "reuse")
        self.verify, self.cache_trust_others = _cache.check_verify(verify), bool(cache_trust_others)
        self.cache_events: List[dict] = []  # last load: {name, hit, reason} per part
        self.cache_fingerprint: Optional[str] = None  # the fingerprint of the last load (pickling by file)
        self._hugepage = hugepage
        # Intermediate columns [bounds[p], bounds[p+1]) belong to part p.
        self._bounds = [intermediate_size * p // parts for p in range(parts + 1)]
        self.arenas = LayerArenas(self.mmap_experts_dir, self.layer_idx, parts, hugepage=hugepage, nodes=nodes,
                                  policy=self.cache, trust_others=self.cache_trust_others,
                                  read_first=warm == "blocking")
        self.reads.arenas = self.arenas
        for p in range(parts):
            self.register_buffer(f"w13_{p}", torch.empty(0, dtype=torch.uint8), persistent=False)
            self.register_buffer(f"w2_{p}", torch.empty(0, dtype=torch.uint8), persistent=False)
            self.register_buffer(f"b13_{p}", None, persistent=False)  # [E, 2 I_p] fp32: part p's gate, up bias
            self.register_buffer(f"b2_{p}", None, persistent=False)   # [E, H] fp32: down bias (part 0 only)
        self._pending = PendingExperts(self.num_experts, f"KTMoE(layer {self.layer_idx})")  # load_expert's

    # ---------------------------------------------------------------- loading
    @property
    def numa_parts(self) -> int:
        return self.arenas.parts

    @property
    def loaded(self) -> bool:
        return self.w13_0.numel() > 0 or self.gguf is not None

    def load_gguf(self, experts: GGUFExperts) -> None:
        """Use a GGUF file's experts where they lie (``weight_format="gguf"``): gate [E, I, .], up [E, I, .],
        down [E, H, .] GGML blocks of any decodable types (:class:`torch_ktmoe.gguf_experts.GGUFExperts`, e.g.
        from :func:`torch_ktmoe.checkpoint.gguf.layer_experts`). Nothing is copied: the tensors are kept as given
        (a mapping of the file stays the file's page cache). Their shape must be the layer's (E, H, I)."""
        where = f"KTMoE(layer {self.layer_idx})"
        if self.weight_format != GGUF_FORMAT:
            raise ValueError(f"{where}: load_gguf needs weight_format='gguf', this layer is {self.weight_format!r} "
                             "(dequantize the GGUF experts and load_weights_separate them to pack them instead)")
        if not isinstance(experts, GGUFExperts):
            raise TypeError(f"{where}: load_gguf takes a GGUFExperts, got {type(experts).__name__}")
        self.gguf = GGUFExperts.of(experts.gate, experts.up, experts.down, experts.ggml_types, experts.source,
                                   mapped=experts.mapped, fits=experts.fits, where=where,
                                   shape=(self.num_experts, self.hidden_size, self.intermediate_size))
        self.reads.gguf = self.gguf
        self.cache_events, self.cache_fingerprint = [], None

    def load_weights(self, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, *,
                     fingerprint: Optional[str] = None, gate_up_bias: Optional[torch.Tensor] = None,
                     down_bias: Optional[torch.Tensor] = None, gate_up_scale: Optional[torch.Tensor] = None,
                     down_scale: Optional[torch.Tensor] = None, gate_up_zero: Optional[torch.Tensor] = None,
                     down_zero: Optional[torch.Tensor] = None) -> None:
        """Pack the Hugging Face layout: gate_up_proj [E, 2I, H], down_proj [E, H, I].

        Quantized checkpoints, packed exactly ("exact codes + scales", one per (row, group of g inputs):
        ``gate_up_scale`` [E, 2I, ceil(H/g)], ``down_scale`` [E, H, ceil(I/g)]), the companions of the format's row
        (:func:`torch_ktmoe.ops.exact_names`, :func:`torch_ktmoe.ops.pack_experts`): ``weight_format="fp8"``:
        float8_e4m3fn weights, fp32 scales (:func:`torch_ktmoe.checkpoint.group_scales`);
        ``weight_format="int4_affine"``: uint8 codes 0..15, fp32 / bf16 / fp16 scales and, optionally, integer zero
        points 0..16 of the scales' shapes ``gate_up_zero`` / ``down_zero`` (``w = s * (q - z)``; None: ``z = 8``);
        ``weight_format="mxfp4"``: uint8 e2m1 codes 0..15, uint8 E8M0 scales.

        ``fingerprint`` names the source of the weights for the cache (e.g.
        :func:`torch_ktmoe.checkpoint.checkpoint_fingerprint`); by default, with a cache, it is a hash of the
        tensors' bytes. A valid cache file skips packing. ``gate_up_bias`` / ``down_bias``: see :meth:`set_biases`.
        """
        inter = self.intermediate_size
        self._check_shape("gate_up_proj", gate_up_proj, (self.num_experts, 2 * inter, self.hidden_size))
        exact = exact_companions(self, gate_up_scale=gate_up_scale, down_scale=down_scale, gate_up_zero=gate_up_zero,
                                 down_zero=down_zero)
        companions = [t for t in (gate_up_scale, down_scale, gate_up_zero, down_zero) if t is not None]
        fingerprint = self._fingerprint(fingerprint, gate_up_proj, down_proj, *companions)
        self._pack(gate_up_proj[:, :inter], gate_up_proj[:, inter:], down_proj, fingerprint, exact)
        if gate_up_bias is not None or down_bias is not None:
            self.set_biases(gate_up_bias, down_bias)

    def set_biases(self, gate_up_bias: Optional[torch.Tensor], down_bias: Optional[torch.Tensor]) -> None:
        """Expert biases: gate_up_bias [E, 2I] (gate columns, then up, as gate_up_proj's rows) is
        added before the activation, down_bias [E, H] to each expert's output; None: no bias.
        Kept as fp32 copies, split like the experts over the NUMA parts."""
        if gate_up_bias is not None:
            self._check_shape("gate_up_bias", gate_up_bias, (self.num_experts, 2 * self.intermediate_size))
        if down_bias is not None:
            self._check_shape("down_bias", down_bias, (self.num_experts, self.hidden_size))
        for p, (b13, b2) in enumerate(expert_biases.split(gate_up_bias, down_bias, self._bounds)):
            self._buffers[f"b13_{p}"], self._buffers[f"b2_{p}"] = b13, b2

    def load_weights_separate(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, *,
                              fingerprint: Optional[str] = None) -> None:
        """Pack separate gate [E, I, H], up [E, I, H], down [E, H, I] (kt-kernel layout)."""
        shape = (self.num_experts, self.intermediate_size, self.hidden_size)
        self._check_shape("gate", gate, shape)
        self._check_shape("up", up, shape)
        self._pack(gate, up, down, self._fingerprint(fingerprint, gate, up, down))

    def load_expert(self, expert: int, gate_up_proj: torch.Tensor, down_proj: torch.Tensor, *,
                    fingerprint: Optional[str] = None, gate_up_scale: Optional[torch.Tensor] = None,
                    down_scale: Optional[torch.Tensor] = None, gate_up_zero: Optional[torch.Tensor] = None,
                    down_zero: Optional[torch.Tensor] = None) -> None:
        """Give one expert (gate_up [2I, H], down [H, I]; a quantized checkpoint's codes: with their scales
        (and zero points), as :meth:`load_weights` takes them without the expert dimension); the layer is
        packed when all E are in.

        Holds at most one layer's dense experts, so a checkpoint can be streamed expert by expert. ``fingerprint``
        (read from the call that completes the layer) is passed to :meth:`load_weights`.
        """
        if not 0 <= expert < self.num_experts:
            raise IndexError(f"expert {expert} out of range [0, {self.num_experts})")
        self._check_shape("gate_up_proj", gate_up_proj, (2 * self.intermediate_size, self.hidden_size))
        self._check_shape("down_proj", down_proj, (self.hidden_size, self.intermediate_size))
        given = {"gate_up": gate_up_proj, "down": down_proj, "gate_up_scale": gate_up_scale, "down_scale": down_scale,
                 "gate_up_zero": gate_up_zero, "down_zero": down_zero}
        layer = self._pending.add(expert, {k: t for k, t in given.items() if t is not None})
        if layer is not None:
            self.load_weights(layer.pop("gate_up"), layer.pop("down"), fingerprint=fingerprint, **layer)

    def try_load_cached(self, fingerprint: str) -> bool:
        """Map every part from valid cache files for ``fingerprint``, without any dense weight.

        True: the layer is loaded (packing skipped). False (no directory, policy not ``"reuse"`` or ``"map"``, or
        some part missing/invalid: its event's reason says why, naming the file under ``"map"``): nothing is loaded;
        load the weights as usual (valid parts are then still reused).
        """
        self.cache_events = []
        if self.cache not in ("reuse", "map"):
            return False
        mapped = []
        for p in range(self.numa_parts):
            w13, w2, hit = self.arenas.load_or_build(p, self._cache_key(p, fingerprint), self.cache, self.verify,
                                                     events=self.cache_events)
            if not hit:
                return False
            mapped.append((w13, w2))
        self._take(mapped, fingerprint)
        return True

    @property
    def cache_hit(self) -> bool:
        """True when the last load mapped every part from valid cache files."""
        return bool(self.cache_events) and all(e["hit"] for e in self.cache_events)

    def _check_shape(self, name, t, shape):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"KTMoE(layer {self.layer_idx}): {name} must have shape {tuple(shape)}, got {got}")

    def _fingerprint(self, given: Optional[str], *tensors: torch.Tensor) -> Optional[str]:
        if self.cache == "off":
            return None
        return given if given is not None else _cache.tensors_fingerprint(tensors)

    def _cache_key(self, p: int, fingerprint: str):
        return _C.packed_cache_key(self.weight_format, self.group_size, self.num_experts, self.hidden_size,
                            self.intermediate_size, self._bounds[p], self._bounds[p + 1], p, fingerprint)

    def _pack(self, gate, up, down, fingerprint: Optional[str] = None, exact=None):
        self._check_shape("down", down, (self.num_experts, self.hidden_size, self.intermediate_size))
        if self.weight_format == GGUF_FORMAT:
            raise ValueError(f"KTMoE(layer {self.layer_idx}): weight_format='gguf' takes a GGUF file's experts "
                             "with load_gguf(); dense weights need a packed format (e.g. 'bf16', 'int8')")
        if self.cache == "map":
            raise ValueError(f"KTMoE(layer {self.layer_idx}): cache='map' only maps kept files "
                             f"(try_load_cached); it never packs weights into {self.mmap_experts_dir}")
        self.cache_events, packed = [], []
        with torch.no_grad():
            for p in range(self.numa_parts):
                lo, hi = self._bounds[p], self._bounds[p + 1]

                def build(arena, lo=lo, hi=hi):
                    return pack_part(self, arena, lo, hi, gate, up, down, exact)

                if self.cache == "off":
                    w13, w2 = build(self.arenas.for_build(p))
                else:
                    w13, w2, _ = self.arenas.load_or_build(p, self._cache_key(p, fingerprint), self.cache,
                                                           self.verify, build, self.cache_events)
                packed.append((w13, w2))
        self._take(packed, fingerprint)

    def _take(self, packed: List[tuple], fingerprint: Optional[str]) -> None:
        """A finished load's [(w13, w2)] per part become the layer's experts (and what its reads read ahead)."""
        for p, (w13, w2) in enumerate(packed):
            setattr(self, f"w13_{p}", w13)
            setattr(self, f"w2_{p}", w2)
        self.cache_fingerprint = fingerprint
        self.reads.loaded(packed)

    def packed_tensors(self) -> List[tuple]:
        """[(w13, w2)] per NUMA part."""
        return [(getattr(self, f"w13_{p}"), getattr(self, f"w2_{p}")) for p in range(self.numa_parts)]

    # ---------------------------------------------------------------- forward
    def forward(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor) -> torch.Tensor:
        plan = self.reads.plan(topk_ids, torch.compiler.is_compiling())  # the one decision (compiled: no counting)
        if plan.stream_next:
            self.reads.stream_next()  # a prefill of a model that does not fit: map the next layer beside it
        if not plan.count:
            return self._forward(hidden_states, topk_ids, topk_weights, plan.prefetch)
        return self.reads.counted(topk_ids, hidden_states.numel() // self.hidden_size,
                                  lambda: self._forward(hidden_states, topk_ids, topk_weights, plan.prefetch))

    def _forward(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 prefetch: bool) -> torch.Tensor:
        buffers = self._buffers  # direct: nn.Module.__getattr__ costs a few us per buffer
        w13, gguf = buffers["w13_0"], self.gguf
        if gguf is None:
            if w13.numel() == 0:
                raise RuntimeError(f"KTMoE(layer {self.layer_idx}): call load_weights() (load_gguf() for "
                                   "weight_format='gguf') before forward()")
            plain = self.activation == "silu" and buffers["b13_0"] is None and buffers["b2_0"] is None
            if plain and not prefetch and self.arenas.parts == 1 and hidden_states.dim() == 2 and topk_ids.dim() == 2:
                # decode's common case: nothing to reshape, straight to the op (it checks the rest)
                return torch.ops.ktmoe.moe_forward(hidden_states, topk_ids, topk_weights, w13, buffers["w2_0"])
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden_size)
        ids = topk_ids.reshape(x.shape[0], -1)
        weights = topk_weights.reshape(x.shape[0], -1)
        act = (*self._activation_args, prefetch)
        if gguf is not None:  # the GGUF file's blocks (one part)
            out = gguf.forward(x, ids, weights, buffers["b13_0"], buffers["b2_0"], *act)
        elif self.numa_parts == 1:  # bf16 / fp16 / fp32 straight to the kernel (it converts per row)
            out = torch.ops.ktmoe.moe_forward(x, ids, weights, w13, buffers["w2_0"], buffers["b13_0"],
                                              buffers["b2_0"], *act)
        else:  # partial outputs of the parts, summed in fp32
            xf = x.float()
            out = sum(torch.ops.ktmoe.moe_forward(xf, ids, weights, w13, w2, buffers[f"b13_{p}"],
                                                  buffers[f"b2_{p}"], *act)
                      for p, (w13, w2) in enumerate(self.packed_tensors())).to(x.dtype)
        return out.reshape(shape)

    def biases(self):
        """(gate_up_bias [E, 2I], down_bias [E, H]) fp32 as given to :meth:`set_biases`, or None each."""
        return expert_biases.joined([self._buffers[f"b13_{p}"] for p in range(self.numa_parts)], self._buffers["b2_0"])

    def __deepcopy__(self, memo):
        return layer_copies.deepcopy_layer(self, memo)

    def __reduce__(self):
        return layer_copies.reduce_layer(self)

    # ---------------------------------------------------------------- reporting
    @property
    def packed_bytes(self) -> int:
        """Bytes of the experts as the kernels read them (a GGUF layer's: its blocks)."""
        if self.gguf is not None:
            return self.gguf.nbytes
        return sum(w13.numel() + w2.numel() for w13, w2 in self.packed_tensors())

    @property
    def file_backed_bytes(self) -> int:
        """Bytes of the experts in files (arena files, or the GGUF file a GGUF layer maps)."""
        if self.gguf is not None:
            return self.gguf.nbytes if self.gguf.mapped else 0
        return self.arenas.file_backed_bytes

    def arena_stats(self) -> List[dict]:
        """Per NUMA part: allocations, file_backed_bytes, anon_bytes, fallbacks, reasons."""
        return self.arenas.stats()

    def extra_repr(self) -> str:
        return layer_repr.describe(self)
