"""How one NUMA part of a KTMoE layer's experts is packed into its arena.

Dense experts (bf16 / fp16 / fp32) are packed by ``ops.pack_experts`` in the layer's format. The experts of a
quantized checkpoint (fp8 blocks, int4 groups with zero points) come with their scales and are packed exactly
("exact codes + scales", no re-quantization) by their format's packer: :func:`exact_companions` checks and splits
those companions once per load, :func:`pack_part` packs part ``[lo, hi)`` of the intermediate dimension.
"""
from typing import Optional

from . import ops

# The formats a quantized checkpoint's experts are packed into exactly (codes + scales [+ zero points]).
EXACT_PACKERS = {"fp8": ops.pack_fp8_experts, "int4_affine": ops.pack_int4_affine_experts,
                 "mxfp4": ops.pack_mxfp4_experts}


def _group(layer) -> int:
    return layer.group_size or ops.FORMAT_TRAITS[layer.weight_format]["default_group"]


def exact_companions(layer, gate_up_scale, down_scale, gate_up_zero, down_zero) -> Optional[dict]:
    """The scales (and int4_affine's zero points) of a quantized checkpoint's experts, checked against ``layer``
    (a :class:`~torch_ktmoe.KTMoE`) and split as gate / up / down: {"gate_scale", "up_scale", "down_scale"[,
    "gate_zero", "up_zero", "down_zero"]}, or None for dense experts."""
    if all(t is None for t in (gate_up_scale, down_scale, gate_up_zero, down_zero)):
        return None
    fmt, where = layer.weight_format, f"KTMoE(layer {layer.layer_idx})"
    if fmt not in EXACT_PACKERS:
        raise ValueError(f"{where}: gate_up_scale and down_scale (both) come with float8_e4m3fn experts and "
                         f"weight_format='fp8', not {fmt!r}, or with uint8 int4 codes and "
                         f"weight_format='int4_affine' (or e2m1 codes with E8M0 scales and 'mxfp4')")
    if gate_up_scale is None or down_scale is None:
        raise ValueError(f"{where}: {fmt} experts come with both gate_up_scale and down_scale")
    if fmt != "int4_affine" and (gate_up_zero is not None or down_zero is not None):
        raise ValueError(f"{where}: zero points (gate_up_zero / down_zero) come with weight_format='int4_affine', "
                         f"not {fmt!r}")
    E, H, inter, g = layer.num_experts, layer.hidden_size, layer.intermediate_size, _group(layer)
    given = {"gate_up_scale": gate_up_scale, "down_scale": down_scale, "gate_up_zero": gate_up_zero,
             "down_zero": down_zero}
    shapes = {"gate_up": (E, 2 * inter, -(-H // g)), "down": (E, H, -(-inter // g))}
    parts = {}
    for key, t in given.items():
        name, kind = key.rsplit("_", 1)
        if t is not None:
            layer._check_shape(key, t, shapes[name])
        if name == "gate_up":
            parts[f"gate_{kind}"], parts[f"up_{kind}"] = (None, None) if t is None else (t[:, :inter], t[:, inter:])
        else:
            parts[key] = t
    bounds = layer._bounds
    bad = [lo for lo in bounds[1:-1] if lo % g]
    if bad:
        raise ValueError(f"{where}: NUMA part bounds {bounds} split a group of {g} inputs of down's "
                         f"{fmt} scales (at {bad}); choose numa_parts (e.g. 1) so that parts start at "
                         f"multiples of {g}")
    return parts


def pack_part(layer, arena, lo: int, hi: int, gate, up, down, exact: Optional[dict]):
    """``(w13, w2)`` of part ``[lo, hi)`` of the intermediate dimension, packed into ``arena``: dense experts in
    ``layer``'s format, or a quantized checkpoint's codes, scales (and zeros) as they are (``exact``)."""
    if exact is None:
        return ops.pack_experts(gate[:, lo:hi], down[:, :, lo:hi], layer.weight_format, up=up[:, lo:hi],
                                group_size=layer.group_size, arena=arena)
    g = _group(layer)
    glo, ghi = lo // g, -(-hi // g)

    def rows(t):  # gate / up companions: rows [lo, hi); down's: groups [glo, ghi)
        return None if t is None else t[:, lo:hi]

    def down_groups(t):
        return None if t is None else t[:, :, glo:ghi]

    kwargs = dict(up=up[:, lo:hi], up_scale=rows(exact["up_scale"]), group_size=g, arena=arena)
    args = [gate[:, lo:hi], down[:, :, lo:hi], rows(exact["gate_scale"]), down_groups(exact["down_scale"])]
    if layer.weight_format == "int4_affine":
        args += [rows(exact["gate_zero"]), down_groups(exact["down_zero"])]
        kwargs["up_zero"] = rows(exact["up_zero"])
    return EXACT_PACKERS[layer.weight_format](*args, **kwargs)
