"""Typed Python wrappers of the ktmoe ops, with the fake (meta) kernel of each.

The fake kernels let ``torch.compile`` and ``opcheck`` trace the ops without
running them: they only compute output shapes and dtypes.

The ops are inference-only. Each has an autograd formula that raises
:class:`InferenceOnlyError` when a backward reaches it, so a gradient through the
experts is never silently zero or missing (the forward itself runs fine on inputs
that require grad, e.g. a model called outside ``torch.no_grad``).
"""
import collections.abc
import hashlib
import numbers
from typing import Mapping, Optional, Sequence, Tuple

import torch

from ._native import _C

__all__ = ["moe_forward", "pack_experts", "InferenceOnlyError",
           "WEIGHT_FORMATS", "FORMAT_TRAITS", "EXACT_FORMATS", "ACTIVATIONS", "GATED_ACTIVATIONS", "ACTIVATION_DTYPES",
           "default_group_size", "exact_names", "activation_params"]

# The weight format traits table of the native kernels (csrc/kernels/weight_formats.h), by name, in id order:
# each a dict (code_bits, bits_per_weight, group, scales, gemm, codes, accuracy_bound, exact, ...).
FORMAT_TRAITS = {row["name"]: row for row in _C.weight_formats()}
WEIGHT_FORMATS = tuple(FORMAT_TRAITS)
# The formats that also pack a checkpoint's exact codes with their companions (a row's ``exact``: its codes' dtypes
# and companion inputs, e.g. scales and zero points).
EXACT_FORMATS = tuple(name for name, row in FORMAT_TRAITS.items() if row["exact"] is not None)
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The gated activations between the projections (csrc/kernels/gated_activation.h), by name: each a dict
# (formula, params: their names in the op's order, defaults, models).
GATED_ACTIVATIONS = {row["name"]: row for row in _C.gated_activations()}
ACTIVATIONS = tuple(GATED_ACTIVATIONS)


def _tag_compile_caches() -> None:
    """Adds the ktmoe ops' schemas to torch.compile's cache key (``torch.compiler.config.cache_key_tag``).

    Inductor's on-disk FX graph cache keys a graph by its code and config, not by a C++ op's schema: code
    compiled against another build of this library (another ``moe_forward`` signature) would be loaded
    from the cache and fail when called. A user's own tag is kept; ours is appended once.
    """
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("ktmoe::"))
    schemas = "\n".join(str(s) for n in names for s in torch._C._jit_get_schemas_for_operator(n))
    tag = "ktmoe:" + hashlib.sha256(schemas.encode()).hexdigest()[:16]
    config = torch.compiler.config
    if tag not in config.cache_key_tag:
        config.cache_key_tag = f"{config.cache_key_tag}|{tag}" if config.cache_key_tag else tag


_tag_compile_caches()


def activation_params(activation: str, params: Optional[Mapping[str, float]] = None) -> Tuple[float, ...]:
    """The op's ``activation_params`` of ``activation`` from named values (the rest: the row's defaults).

    Raises ValueError naming the activation and what is wrong: an unknown activation or parameter, ``params`` that
    is no mapping, a value that is no real number (a string, a bool, a tensor), or one the kernels refuse (not
    finite in fp32; a limit or softcap <= 0), printed as given.
    """
    row = GATED_ACTIVATIONS.get(activation) if isinstance(activation, str) else None
    if row is None:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if params is None:
        params = {}
    if not isinstance(params, collections.abc.Mapping):
        raise ValueError(f"activation {activation!r}: activation_params must be a mapping of parameter name -> "
                         f"number ({row['params']}), got {type(params).__name__} {_short(params)}")
    unknown = [k for k in params if k not in row["params"]]
    if unknown:
        raise ValueError(f"activation {activation!r} takes {row['params'] or 'no parameters'}, got "
                         f"{sorted(unknown, key=repr)}")
    for name, value in params.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):  # "7", True, a tensor: not numbers
            raise ValueError(f"activation {activation!r}: parameter {name!r} must be a real number, got "
                             f"{type(value).__name__} {_short(value)}")
    values = tuple(float(params.get(name, default)) for name, default in zip(row["params"], row["defaults"]))
    error = _C.gated_activation_error(activation, list(values))
    if error:
        raise ValueError(error)
    return values


def _short(value) -> str:
    """``repr(value)``, cut to one short line."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def default_group_size(weight_format: str) -> int:
    """The ``group_size`` dense weights are packed with when none is given: int8's table default (32:
    a scale per row and 32 inputs, as accurate as q8_0), since int8's ``group_size=0`` means one scale
    per row (per-channel files, and the manifests and cache keys written for them); 0 for the other
    formats, which the kernels resolve to their own default."""
    row = FORMAT_TRAITS[weight_format]
    return row["default_group"] if row["group"] == "row" else 0


def exact_names(weight_format: str) -> Tuple[str, ...]:
    """The companions of ``weight_format``'s exact codes, in the order of the op's ``exact`` list: per input of its
    row, ``gate_up_<name>``, ``up_<name>``, ``down_<name>`` (fp8: the three scales; int4_affine: the scales, then
    the zero points). Empty for a format that packs dense weights only."""
    inputs = (FORMAT_TRAITS[weight_format]["exact"] or {"inputs": ()})["inputs"]
    return tuple(f"{matrix}_{i['name']}" for i in inputs for matrix in ("gate_up", "up", "down"))


class InferenceOnlyError(RuntimeError):
    """A backward pass reached a ktmoe op: the packed experts have no gradient."""


def moe_forward(hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                w13: torch.Tensor, w2: torch.Tensor, *, w13_bias: Optional[torch.Tensor] = None,
                w2_bias: Optional[torch.Tensor] = None, activation: str = "silu",
                activation_params: Sequence[float] = (), prefetch: bool = False) -> torch.Tensor:
    """Fused MoE forward over packed experts.

    hidden_states [T, H] bf16|fp16|fp32, topk_ids [T, k] int32|int64 (< 0: skip),
    topk_weights [T, k] fp32|bf16|fp16, w13 / w2 from :func:`pack_experts`
    -> [T, H] in the dtype of hidden_states.

    ``out[t] = Σ_j w[t,j] · (down_e(act(gate_e x + bg_e, up_e x + bu_e)) + bd_e)``:
    ``w13_bias`` [E, 2I] holds bg (columns [0, I)) then bu, ``w2_bias`` [E, H] is bd
    (both optional, read as fp32). ``activation``: a row of :data:`GATED_ACTIVATIONS` (``"silu"``:
    silu(gate) · up), ``activation_params`` its parameters in the row's order (empty: its defaults;
    :func:`activation_params` builds them from names). ``prefetch=True`` first starts the reads of
    the routed experts' packed rows (``MADV_WILLNEED``), for file-backed experts
    that may not be in RAM, unless they are at least 3/4 of the experts (then the gemms'
    faults read them faster); the output is the same.
    """
    return torch.ops.ktmoe.moe_forward(hidden_states, topk_ids, topk_weights, w13, w2, w13_bias, w2_bias,
                                       activation, list(activation_params), prefetch)


def _check_same_device(op: str, first: str, tensor: torch.Tensor, **others) -> None:
    """Every tensor of ``others`` (None: absent) is on ``tensor``'s device.

    The fake kernels are also the ops' Meta kernels: a call mixing CPU and meta tensors
    dispatches to them, and must fail here instead of returning uninitialized memory.
    """
    for name, other in others.items():
        if other is not None:
            torch._check(other.device == tensor.device, lambda name=name, other=other: (
                f"ktmoe::{op}: {name} is on {other.device} but {first} is on {tensor.device}; "
                "every tensor argument must be on the same device"))


@torch.library.register_fake("ktmoe::moe_forward")
def _moe_forward_fake(hidden_states, topk_ids, topk_weights, w13, w2, w13_bias=None, w2_bias=None,
                      activation="silu", activation_params=(), prefetch=False):
    _check_same_device("moe_forward", "hidden_states", hidden_states, topk_ids=topk_ids, topk_weights=topk_weights,
                       w13=w13, w2=w2, w13_bias=w13_bias, w2_bias=w2_bias)
    torch._check(hidden_states.dim() == 2, lambda: "hidden_states must be [T, H]")
    torch._check(hidden_states.dtype in ACTIVATION_DTYPES,
                 lambda: "hidden_states must be bfloat16, float16 or float32")
    torch._check(topk_ids.dim() == 2 and topk_ids.shape == topk_weights.shape,
                 lambda: "topk_ids and topk_weights must be [T, k]")
    torch._check(activation in ACTIVATIONS, lambda: f"activation must be one of {ACTIVATIONS}")
    return hidden_states.new_empty(hidden_states.shape)


def pack_experts(gate_up: torch.Tensor, down: torch.Tensor, weight_format: str = "bf16", *,
                 up: Optional[torch.Tensor] = None, group_size: Optional[int] = None,
                 arena: Optional[_C.WeightArena] = None,
                 **exact: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pack experts into the kernel layout: dense weights quantized by ``weight_format``, or a quantized
    checkpoint's own codes and companions (``exact``) as they are.

    gate_up [E, 2I, H] (HF: gate rows then up rows) — or gate [E, I, H] with
    ``up=`` [E, I, H] (kt-kernel) — and down [E, H, I]
    -> (w13 [E, B13], w2 [E, B2]) uint8, allocated from ``arena`` (default: new
    memory, on transparent huge pages from 2 MiB up).

    Dense weights (fp32|bf16|fp16, no ``exact``): ``group_size`` is the int4 / fp8 / int4_affine / mxfp4 group
    along the input dimension (None or 0: the format's default, 32 / 128 / 128 / 32). int8: a scale per (row,
    group of ``group_size`` inputs; None: 32, :func:`default_group_size`), 0: one per row (per channel); its
    activations are quantized per the same groups. ``"int4_affine"`` quantizes with GPTQ's min/max per (row,
    group); ``"fp8"`` with a scale max|w| / 448 per (row, group), e4m3 rounded to nearest even; ``"mxfp4"`` as
    OCP MX: an E8M0 scale 2^(floor(log2 max|w|) - 2) per (row, group of 32) and the nearest e2m1 code.

    A checkpoint's exact codes (a format of :data:`EXACT_FORMATS`): gate_up / up / down are its codes in the
    shapes above and the keywords its companions, named by :func:`exact_names`, each [E, rows, ceil(k/g)] (one
    per row and k-group of ``group_size`` inputs; 0 or None: the format's default); with ``up=``, ``gate_up_<x>``
    is the gate's and ``up_<x>`` the up's:

    * ``"fp8"``: float8_e4m3fn weights; ``gate_up_scale``, ``down_scale`` fp32
      (:func:`torch_ktmoe.checkpoint.fp8.group_scales` makes them from a checkpoint's block or per-row scales).
    * ``"int4_affine"``: uint8 codes, one 4-bit code 0..15 per byte; ``gate_up_scale``, ``down_scale`` fp32 |
      bf16 | fp16; ``gate_up_zero``, ``down_zero`` integer zero points 0..16 (``w = s * (q - z)``; GPTQ v1
      checkpoints store z - 1), or None: symmetric, ``w = s * (q - 8)`` (compressed-tensors pack-quantized).
    * ``"mxfp4"``: uint8 e2m1 codes, one 0..15 per byte (a checkpoint's ``_blocks`` nibbles split, low nibble
      first: :func:`torch_ktmoe.checkpoint.mxfp4.split_nibbles`); ``gate_up_scale``, ``down_scale`` uint8 E8M0
      bytes (``2^(e - 127)``; 0xff, NaN, is refused), group 32 (the MX block).

    With an arena the outputs are taken from it (after every argument check) and filled by
    ``ktmoe::pack_experts_out``; then the arena's file starts writing back, so
    packing more than RAM does not pile up dirty page cache.
    """
    if group_size is None:
        group_size = default_group_size(weight_format) if weight_format in FORMAT_TRAITS else 0  # the op names a bad one
    companions = _exact_list(weight_format, exact)
    if arena is None:
        return torch.ops.ktmoe.pack_experts(gate_up, up, down, weight_format, group_size, companions)
    shape13, shape2 = _C.packed_sizes(gate_up, up, down, weight_format, group_size, companions)  # checks the arguments
    w13, w2 = arena.empty(shape13), arena.empty(shape2)
    torch.ops.ktmoe.pack_experts_out(gate_up, up, down, weight_format, group_size, companions, w13, w2)
    try:
        arena.writeback(False)  # only starts writeback: pages turn clean (reclaimable) early
    except RuntimeError:
        pass  # best effort: the data is in the page cache either way
    return w13, w2


def _exact_list(weight_format: str, exact: Mapping[str, Optional[torch.Tensor]]) -> list:
    """The op's ``exact`` list from the companions by name, None where absent ([]: none given, dense weights)."""
    unknown = sorted(exact.keys() - {n for fmt in EXACT_FORMATS for n in exact_names(fmt)})
    if unknown:
        raise TypeError(f"pack_experts() got unexpected keyword arguments {unknown}")
    given = sorted(name for name, t in exact.items() if t is not None)
    if not given or weight_format not in FORMAT_TRAITS:  # the op names a bad format
        return []
    names = exact_names(weight_format)
    if not names:
        raise ValueError(f"weight_format {weight_format!r} packs dense weights only, got {given}; a checkpoint's "
                         f"exact codes are packed as one of {EXACT_FORMATS}")
    if not set(given) <= set(names):
        raise ValueError(f"weight_format {weight_format!r} takes the companions {names}, got {given}")
    return [exact.get(name) for name in names]


@torch.library.register_fake("ktmoe::pack_experts")
def _pack_experts_fake(gate_up, up, down, weight_format, group_size, exact):
    _check_same_device("pack_experts", "gate_up", gate_up, up=up, down=down, **_named(weight_format, exact))
    shape13, shape2 = _packed_shapes(gate_up, up, down, weight_format, group_size)
    return gate_up.new_empty(shape13, dtype=torch.uint8), gate_up.new_empty(shape2, dtype=torch.uint8)


@torch.library.register_fake("ktmoe::pack_experts_out")
def _pack_experts_out_fake(gate_up, up, down, weight_format, group_size, exact, w13, w2):
    _check_same_device("pack_experts_out", "gate_up", gate_up, up=up, down=down, w13=w13, w2=w2,
                       **_named(weight_format, exact))
    return None


def _named(weight_format, exact) -> dict:
    """The ``exact`` list by its names (for messages; the op checks its length)."""
    names = exact_names(weight_format) if weight_format in FORMAT_TRAITS else ()
    return {names[i] if i < len(names) else f"exact[{i}]": t for i, t in enumerate(exact)}


def _packed_shapes(gate_up, up, down, weight_format, group_size):
    """The shapes [E, B13], [E, B2] of the packed outputs (from gate_up's shape)."""
    experts, hidden = gate_up.shape[0], gate_up.shape[2]
    inter = gate_up.shape[1] if up is not None else gate_up.shape[1] // 2
    b13 = _C.packed_matrix_bytes(weight_format, "gate_up", 2 * inter, hidden, group_size)
    b2 = _C.packed_matrix_bytes(weight_format, "down", hidden, inter, group_size)
    return (experts, b13), (experts, b2)


def _inference_only(op: str, what: str = "packed experts (KTMoE, and models patched by torch_ktmoe.hf)",
                    dense: str = "the dense (unpatched) experts"):
    def backward(ctx, *grads):
        raise InferenceOnlyError(
            f"ktmoe::{op} is inference-only: torch_ktmoe's {what} have no backward, so no gradient can flow "
            f"through them. Run the model under torch.no_grad() / torch.inference_mode(), or train with {dense}.")
    return backward


torch.library.register_autograd("ktmoe::moe_forward", _inference_only("moe_forward"))
torch.library.register_autograd("ktmoe::pack_experts", _inference_only("pack_experts"))


# ---------------------------------------------------------------- dense linears (ops/linear.cpp)
__all__ += ["pack_linear", "linear"]


def pack_linear(weight: torch.Tensor) -> torch.Tensor:
    """Pack a dense ``nn.Linear`` weight [N, K] fp32|bf16|fp16 -> uint8 [B]: one bf16 matrix, header first,
    for :func:`linear` (bf16-rounded weights; a NaN / Inf weight is an error naming its row and column)."""
    return torch.ops.ktmoe.pack_linear(weight)


def linear(x: torch.Tensor, w_packed: torch.Tensor, out_features: int,
           bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.linear`` over a weight packed by :func:`pack_linear`, with the experts' bf16 gemm.

    x [..., K] bf16|fp16|fp32, ``out_features`` = N (checked against the packed header), bias [N] or None
    -> [..., N] in x's dtype: x and the weight rounded to bf16, products summed in fp32, + bias.
    """
    return torch.ops.ktmoe.linear(x, w_packed, out_features, bias)


@torch.library.register_fake("ktmoe::pack_linear")
def _pack_linear_fake(weight):
    torch._check(weight.dim() == 2, lambda: "ktmoe::pack_linear: weight must be 2-D [N, K]")
    n, k = weight.shape
    return weight.new_empty((_C.packed_matrix_bytes("bf16", "plain", n, k, 0),), dtype=torch.uint8)


@torch.library.register_fake("ktmoe::linear")
def _linear_fake(x, w_packed, out_features, bias=None):
    _check_same_device("linear", "x", x, w_packed=w_packed, bias=bias)
    torch._check(x.dim() >= 1 and x.dtype in ACTIVATION_DTYPES,
                 lambda: "ktmoe::linear: x must be [..., K] bfloat16, float16 or float32")
    torch._check(w_packed.dim() == 1 and w_packed.dtype == torch.uint8,
                 lambda: "ktmoe::linear: w_packed must be the 1-D uint8 tensor of ktmoe::pack_linear")
    return x.new_empty((*x.shape[:-1], out_features))


torch.library.register_autograd("ktmoe::linear", _inference_only(
    "linear", "packed linears (KTLinear, hf.pack_linears)", "the model's nn.Linear layers (before pack_linears)"))


# ---------------------------------------------------------------- GGML blocks (ops/ggml_dequantize.cpp)
__all__ += ["GGML_TYPES", "ggml_dequantize", "moe_forward_ggml"]

# The GGML type table (csrc/kernels/ggml/ggml_types.h), by id: every type ggml defines, each a dict (name,
# block_elems, block_bytes, decodable: whether this library reads its blocks).
GGML_TYPES = {row["id"]: row for row in _C.ggml_types()}


def ggml_dequantize(blocks: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """Rows of GGML blocks -> their fp32 weights, bit for bit ``gguf.quants.dequantize``.

    blocks uint8 [..., B] (each row B bytes of whole blocks, as a GGUF tensor stores its rows), ``ggml_type``
    a GGML type id (:data:`GGML_TYPES`) this library reads -> float32 [..., B / block_bytes * block_elems].
    """
    return torch.ops.ktmoe.ggml_dequantize(blocks, ggml_type)


@torch.library.register_fake("ktmoe::ggml_dequantize")
def _ggml_dequantize_fake(blocks, ggml_type):
    row = GGML_TYPES.get(ggml_type)
    torch._check(row is not None and row["decodable"],
                 lambda: f"ktmoe::ggml_dequantize: GGML type id {ggml_type} is not read by torch_ktmoe")
    torch._check(blocks.dim() >= 1 and blocks.dtype == torch.uint8,
                 lambda: "ktmoe::ggml_dequantize: blocks must be uint8 [..., row bytes]")
    row_bytes = blocks.shape[-1]
    torch._check(row_bytes % row["block_bytes"] == 0,
                 lambda: f"ktmoe::ggml_dequantize: a row is not whole {row['name']} blocks")
    return blocks.new_empty((*blocks.shape[:-1], row_bytes // row["block_bytes"] * row["block_elems"]),
                            dtype=torch.float32)


def moe_forward_ggml(hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, ggml_types: Sequence[int], *,
                     w13_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
                     activation: str = "silu", activation_params: Sequence[float] = (),
                     prefetch: bool = False) -> torch.Tensor:
    """:func:`moe_forward` over GGML experts where they lie: a GGUF file's rows, each role of its own type.

    gate / up uint8 [E, I, row bytes], down uint8 [E, H, row bytes] (each row whole blocks of its type, rows
    contiguous: a GGUF expert tensor's bytes, e.g. mapped from the file), ``ggml_types`` their GGML type ids
    (gate, up, down), decodable (:data:`GGML_TYPES`); I and H multiples of 16. Activations are bf16 rows; the
    weights are the types' exact values (:func:`ggml_dequantize`), summed in fp32. The rest as
    :func:`moe_forward` -> [T, H] in the dtype of hidden_states.
    """
    return torch.ops.ktmoe.moe_forward_ggml(hidden_states, topk_ids, topk_weights, gate, up, down,
                                            [int(t) for t in ggml_types], w13_bias, w2_bias, activation,
                                            list(activation_params), prefetch)


@torch.library.register_fake("ktmoe::moe_forward_ggml")
def _moe_forward_ggml_fake(hidden_states, topk_ids, topk_weights, gate, up, down, ggml_types, w13_bias=None,
                           w2_bias=None, activation="silu", activation_params=(), prefetch=False):
    _check_same_device("moe_forward_ggml", "hidden_states", hidden_states, topk_ids=topk_ids,
                       topk_weights=topk_weights, gate=gate, up=up, down=down, w13_bias=w13_bias, w2_bias=w2_bias)
    torch._check(hidden_states.dim() == 2, lambda: "hidden_states must be [T, H]")
    torch._check(hidden_states.dtype in ACTIVATION_DTYPES,
                 lambda: "hidden_states must be bfloat16, float16 or float32")
    torch._check(topk_ids.dim() == 2 and topk_ids.shape == topk_weights.shape,
                 lambda: "topk_ids and topk_weights must be [T, k]")
    torch._check(len(ggml_types) == 3, lambda: "ggml_types must be [gate, up, down] type ids")
    torch._check(activation in ACTIVATIONS, lambda: f"activation must be one of {ACTIVATIONS}")
    return hidden_states.new_empty(hidden_states.shape)


torch.library.register_autograd("ktmoe::moe_forward_ggml", _inference_only(
    "moe_forward_ggml", "GGUF experts", "dense experts"))
