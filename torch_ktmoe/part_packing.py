"""How one NUMA part of a KTMoE layer's experts is packed into its arena.

Dense experts (bf16 / fp16 / fp32) are packed by ``ops.pack_experts`` in the layer's format. The experts of a
quantized checkpoint (fp8 blocks, int4 groups with zero points, mxfp4) come with the companions their format's row
names (scales, zero points) and are packed exactly ("exact codes + scales", no re-quantization) by the same
``ops.pack_experts``: :func:`exact_companions` checks and splits those companions once per load, :func:`pack_part`
packs part ``[lo, hi)`` of the intermediate dimension.
"""
from typing import Optional

from . import ops



def _group(layer) -> int:
    return layer.group_size or ops.FORMAT_TRAITS[layer.weight_format]["default_group"]


def _takes() -> str:
    """What each exact format's checkpoint comes with, from the table: "'fp8': float8_e4m3fn codes with
    gate_up_scale, down_scale; ..."."""
    def one(fmt):
        exact = ops.FORMAT_TRAITS[fmt]["exact"]
        names = [n for n in ops.exact_names(fmt) if not n.startswith("up_")]
        return f"{fmt!r}: {' / '.join(exact['codes'])} codes with {', '.join(names)}"
    return "; ".join(one(fmt) for fmt in ops.EXACT_FORMATS)


def exact_companions(layer, **given) -> Optional[dict]:
    """The companions of a quantized checkpoint's experts (``given``: gate_up_<x> / down_<x> by name, None where
    absent), checked against ``layer`` (a :class:`~torch_ktmoe.KTMoE`) and its format's row, split by rows into
    the gate's and the up's: ``ops.pack_experts``'s keywords with ``up=`` (gate_up_scale then holds the gate's
    rows, up_scale the up's, ...), or None for dense experts."""
    given = {k: t for k, t in given.items() if t is not None}
    if not given:
        return None
    fmt, where = layer.weight_format, f"KTMoE(layer {layer.layer_idx})"
    names = ops.exact_names(fmt)
    if not names:
        raise ValueError(f"{where}: {', '.join(given)} come with a quantized checkpoint's exact codes and a "
                         f"weight_format that packs them ({_takes()}), not {fmt!r}")
    for key in given:
        if key not in names:
            raise ValueError(f"{where}: {key} does not come with weight_format={fmt!r}, whose experts come with "
                             f"{', '.join(n for n in names if not n.startswith('up_'))}")
    for i in ops.FORMAT_TRAITS[fmt]["exact"]["inputs"]:
        pair = f"gate_up_{i['name']}", f"down_{i['name']}"
        if not i["optional"] and not all(n in given for n in pair):
            raise ValueError(f"{where}: {fmt} experts come with both {pair[0]} and {pair[1]}")
    E, H, inter, g = layer.num_experts, layer.hidden_size, layer.intermediate_size, _group(layer)
    shapes = {"gate_up": (E, 2 * inter, -(-H // g)), "down": (E, H, -(-inter // g))}
    parts = {}
    for key, t in given.items():
        matrix, kind = key.rsplit("_", 1)
        layer._check_shape(key, t, shapes[matrix])
        if matrix == "gate_up":
            parts[key], parts[f"up_{kind}"] = t[:, :inter], t[:, inter:]
        else:
            parts[key] = t
    bounds = layer._bounds
    bad = [lo for lo in bounds[1:-1] if lo % g]
    if bad:
        raise ValueError(f"{where}: NUMA part bounds {bounds} split a group of {g} inputs of down's "
                         f"{fmt} companions (at {bad}); choose numa_parts (e.g. 1) so that parts start at "
                         f"multiples of {g}")
    return parts


def pack_part(layer, arena, lo: int, hi: int, gate, up, down, exact: Optional[dict]):
    """``(w13, w2)`` of part ``[lo, hi)`` of the intermediate dimension, packed into ``arena``: dense experts in
    ``layer``'s format, or a quantized checkpoint's codes and companions as they are (``exact``)."""
    if exact is None:
        return ops.pack_experts(gate[:, lo:hi], down[:, :, lo:hi], layer.weight_format, up=up[:, lo:hi],
                                group_size=layer.group_size, arena=arena)
    g = _group(layer)
    glo, ghi = lo // g, -(-hi // g)
    part = {key: t[:, :, glo:ghi] if key.startswith("down_") else t[:, lo:hi]  # gate / up: rows; down: groups
            for key, t in exact.items()}
    return ops.pack_experts(gate[:, lo:hi], down[:, :, lo:hi], layer.weight_format, up=up[:, lo:hi], group_size=g,
                            arena=arena, **part)
