"""Independent fp32 references: the MoE forward and each weight format's rounding.

Written from the format definitions in csrc/kernels/packed_format.h with plain
torch ops (no native code), so kernel tests compare against something that
shares nothing with the kernels but the specification.
"""
import functools

import torch
import torch.nn.functional as F


def moe_reference(x, topk_ids, topk_weights, gate_up, down, activations="fp32", *, gate_up_bias=None,
                  down_bias=None, activation="silu", activation_params=None):
    """out[t] = Σ_j w[t,j] · (down_e(act(gate_e x_t + bg_e, up_e x_t + bu_e)) + bd_e), in fp32.

    x [T, H], topk_ids [T, k] (< 0 skipped), topk_weights [T, k],
    gate_up [E, 2I, H], down [E, H, I] -> [T, H] float32.
    activations: how the inputs of both matmuls are rounded first: "fp32"
    (not at all), "bf16", or "int8" (per row, symmetric: int4, per-channel int8), or a
    function of a [rows, n] fp32 tensor (:func:`format_activations` of int8 with groups,
    another library's rounding).
    gate_up_bias [E, 2I] (gate then up) and down_bias [E, H] are optional;
    activation, activation_params: the gated activation (see :func:`gated_activation`).
    """
    round_act = activations if callable(activations) else \
        {"fp32": lambda a: a, "bf16": _bf16, "int8": quantize_rows_int8}[activations]
    x = x.float()
    inter = gate_up.shape[1] // 2
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
    ids = topk_ids.long()
    for e in ids.unique().tolist():
        if e < 0:
            continue
        tok, slot = (ids == e).nonzero(as_tuple=True)
        gu = round_act(x[tok]) @ gate_up[e].float().T
        if gate_up_bias is not None:
            gu = gu + gate_up_bias[e].float()
        h = gated_activation(gu[:, :inter], gu[:, inter:], activation, activation_params)
        y = round_act(h) @ down[e].float().T
        if down_bias is not None:
            y = y + down_bias[e].float()
        out.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
    return out


def gated_activation(gate, up, activation="silu", params=None):
    """The rows of the gated activation table in torch fp32 ops, written from their formulas
    (csrc/kernels/gated_activation.h), independently of the kernels. ``params`` by name; missing
    ones take the defaults of the table (for the gpt-oss / swiglu rows too)."""
    p = {"limit": 7.0, "alpha": 1.702, "gate_softcap": 30.0, "up_softcap": 30.0, **(params or {})}
    gate, up = gate.float(), up.float()
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "silu_clamp":
        return F.silu(gate.clamp(max=p["limit"])) * up.clamp(-p["limit"], p["limit"])
    if activation == "silu_clamp_after":
        return F.silu(gate).clamp(max=p["limit"]) * up.clamp(-p["limit"], p["limit"])
    if activation == "swiglu_oai":
        g = gate.clamp(max=p["limit"])
        return g * torch.sigmoid(p["alpha"] * g) * (up.clamp(-p["limit"], p["limit"]) + 1)
    if activation == "swiglu_softcap":
        cg, cu = p["gate_softcap"], p["up_softcap"]
        return torch.tanh(gate / cg) * cg * torch.sigmoid(gate) * torch.tanh(up / cu) * cu
    raise ValueError(f"unknown activation {activation!r}")


def quantize_rows_int8(x, group=None):
    """Symmetric int8 of activations x [..., k], dequantized: scale = max|x| / 127 per row
    (``group`` None or 0) or per (row, group of ``group`` columns, the last one partial),
    1 where that is 0; q = x / scale rounded half away from zero, clamped to ±127."""
    *lead, k = x.shape
    g = group or k
    pad = (-k) % g
    xg = F.pad(x, (0, pad)).reshape(*lead, (k + pad) // g, g)
    scale = xg.abs().amax(-1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, 1)
    return (_round_half_away(xg / scale).clamp(-127, 127) * scale).reshape(*lead, k + pad)[..., :k]


def format_activations(weight_format, group=None):
    """How a format's kernels round the activations they multiply: "bf16", "int8" (a scale per
    row: int4, and int8 with ``group`` 0, per channel), or for int8 with groups (``group`` None:
    the default 32) the function that quantizes per (row, group) as its weights are."""
    if weight_format in ("bf16", "fp8", "int4_affine", "mxfp4"):
        return "bf16"
    group = INT8_DEFAULT_GROUP if weight_format == "int8" and group is None else group
    if weight_format == "int8" and group:
        return functools.partial(quantize_rows_int8, group=group)
    return "int8"


def _bf16(t):
    return t.to(torch.bfloat16).float()


INT8_DEFAULT_GROUP = 32  # the group dense weights are packed with when none is given


def quantize_int8(w, group=None):
    """Symmetric int8 of w [..., n, k], dequantized (fp32): a scale s = max|w| / 127 per output
    channel (``group`` None or 0), or per (channel, group of ``group`` inputs, the last one
    partial); q = w / s rounded half away from zero, clamped to ±127, 0 where s = 0."""
    w = w.float()
    *lead, n, k = w.shape
    g = group or k
    pad = (-k) % g
    x = F.pad(w, (0, pad)).reshape(*lead, n, (k + pad) // g, g)
    scale = x.abs().amax(-1, keepdim=True) / 127
    q = torch.where(scale > 0, _round_half_away(x / torch.where(scale > 0, scale, 1)), 0).clamp(-127, 127)
    return (q * scale).reshape(*lead, n, k + pad)[..., :k]


def _round_half_away(x):
    """std::round: x - trunc(x) is exact, so no sum rounds up a value just below a half."""
    t = torch.trunc(x)
    return t + torch.sign(x) * ((x - t).abs() >= 0.5)


INT4_LEVELS = (-64, -46, -35, -27, -20, -14, -8, -3, 2, 8, 14, 20, 27, 35, 45, 56)
INT4_SCALE_FACTORS = (1.05, 1.0, 0.95, 0.9)


def _int4_assign(g, d, valid, levels, mids):
    """Nearest level (ties to the lower) of g / d (0 where not valid), and the squared error per group (double)."""
    inv = torch.where(d != 0, 1 / torch.where(d != 0, d, 1), 0)
    lv = levels[(g.mul(inv).unsqueeze(-1) > mids).sum(-1)] * valid
    return lv, (((g.double() - d.double() * lv.double()) ** 2) * valid).sum(-1, keepdim=True)


def quantize_int4(w, group=32):
    """Group-wise codebook int4 of w [..., n, k] along k, dequantized (fp32).

    Per group of `group` valid columns (the signed scale search of
    csrc/kernels/pack.cpp): two bases, d+ = max(-min / 64, max / 56) and
    d- = -max(max / 64, -min / 56); for each, for each scale factor f,
    d = bf16(base * f) and its refit d' = bf16(Σ w·L / Σ L²) over d's levels L;
    each assigns every weight its nearest level of INT4_LEVELS (w / d); the
    candidate with the least squared error (the first on ties) is kept. A trailing
    partial group uses only its valid columns.
    """
    w = w.float()
    *lead, n, k = w.shape
    pad = (-k) % group
    valid = F.pad(torch.ones(k), (0, pad)).reshape((k + pad) // group, group)
    g = F.pad(w, (0, pad)).reshape(*lead, n, (k + pad) // group, group)
    levels = torch.tensor(INT4_LEVELS, dtype=torch.float32)
    mids = (levels[:-1] + levels[1:]) / 2
    lo, hi = -levels[0], levels[-1]
    vmin, vmax = g.amin(-1, keepdim=True).clamp(max=0), g.amax(-1, keepdim=True).clamp(min=0)
    best, best_err = torch.zeros_like(g), torch.full_like(vmax, torch.inf, dtype=torch.float64)

    def consider(cand):
        nonlocal best, best_err
        lv, err = _int4_assign(g, cand, valid, levels, mids)
        better = (cand != 0) & (err < best_err)
        best = torch.where(better, lv * cand, best)
        best_err = torch.where(better, err, best_err)
        return lv

    for base in (torch.maximum(-vmin / lo, vmax / hi), -torch.maximum(vmax / lo, -vmin / hi)):
        for f in INT4_SCALE_FACTORS:
            lv = consider(_bf16(base * torch.tensor(f, dtype=torch.float32)))  # d's levels feed its refit
            consider(_bf16(((g.double() * lv).sum(-1, keepdim=True) / (lv.double() ** 2).sum(-1, keepdim=True)).float()))
    return best.reshape(*lead, n, k + pad)[..., :k]


def quantize_fp8(w, group=128):
    """e4m3 with a scale per (row, group of ``group`` inputs) of w [..., n, k], dequantized (fp32):
    s = max|w| / 448 over the group's valid columns, q = e4m3(clamp(w / s, ±448)) rounded to
    nearest even (torch's float8_e4m3fn cast), 0 where s = 0."""
    w = w.float()
    *lead, n, k = w.shape
    pad = (-k) % group
    g = F.pad(w, (0, pad)).reshape(*lead, n, (k + pad) // group, group)
    s = g.abs().amax(-1, keepdim=True) / 448
    q = (g / torch.where(s > 0, s, 1)).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    return torch.where(s > 0, q * s, 0).reshape(*lead, n, k + pad)[..., :k]


def quantize_int4_affine(w, group=128):
    """GPTQ-style min/max int4 with a scale and a zero point per (row, group of ``group`` inputs)
    of w [..., n, k], dequantized (fp32): over the group's valid columns lo = min(w, 0),
    hi = max(w, 0), s = bf16((hi - lo) / 15), z = clamp(round(-lo / s), 0, 15),
    q = clamp(round(w / s) + z, 0, 15) (round half to even), value s * q + (-(s * z)); 0 where s = 0."""
    w = w.float()
    *lead, n, k = w.shape
    pad = (-k) % group
    g = F.pad(w, (0, pad)).reshape(*lead, n, (k + pad) // group, group)  # padding 0 moves neither lo nor hi
    lo, hi = g.amin(-1, keepdim=True).clamp(max=0), g.amax(-1, keepdim=True).clamp(min=0)
    s = _bf16((hi - lo) / 15)
    ok = s > 0
    sd = torch.where(ok, s, 1)
    z = torch.where(ok, torch.round(-lo / sd).clamp(0, 15), 0)
    q = torch.where(ok, (torch.round(g / sd) + z).clamp(0, 15), 0)
    s = torch.where(ok, s, 0)
    return (q * s + (-(s * z))).reshape(*lead, n, k + pad)[..., :k]


def dequantize_int4_affine(codes, scale, zero=None, group=128):
    """The weights w = s * (q - z) an int4 checkpoint stores, as int4_affine represents them (fp32):
    codes [..., n, k] (0..15), scale [..., n, ceil(k/group)], zero of the scale's shape (integers
    0..16) or None (symmetric: z = 8); computed as s * q + (-(s * z)), exact for bf16 / fp16 s."""
    k = codes.shape[-1]
    s = scale.float().repeat_interleave(group, -1)[..., :k]
    z = torch.full_like(s, 8.0) if zero is None else zero.float().repeat_interleave(group, -1)[..., :k]
    return codes.float() * s + (-(s * z))


E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _pow2(n):
    """2^n (fp32, exact) of an integer tensor n in [-127, 127], by its bits (2^-127 is subnormal)."""
    e = n.to(torch.int32) + 127
    return torch.where(e == 0, 0x00400000, e << 23).view(torch.float32)


def quantize_mxfp4(w, group=32):
    """OCP MXFP4 of w [..., n, k], dequantized (fp32): per (row, group of ``group`` inputs) over the valid
    columns amax = max|w|, E = floor(log2 amax) - 2 (at least -127; amax = 0: E = 0), and each weight the
    e2m1 value nearest to w / 2^E (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negated, with w's sign; ties to the even
    code, beyond 6 saturating), times 2^E."""
    w = w.float()
    *lead, n, k = w.shape
    pad = (-k) % group
    g = F.pad(w, (0, pad)).reshape(*lead, n, (k + pad) // group, group)
    amax = g.abs().amax(-1, keepdim=True)
    exp = torch.where(amax > 0, (torch.frexp(amax).exponent - 3).clamp(min=-127), 0)  # amax = f * 2^x, f in [.5, 1)
    x = g * _pow2(-exp)
    a = x.abs()
    code = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() + (a > 2.5).int()
            + (a >= 3.5).int() + (a > 5).int())
    mag = torch.tensor(E2M1_MAGNITUDES)[code.long()]
    return (torch.where(torch.signbit(x), -mag, mag) * _pow2(exp)).reshape(*lead, n, k + pad)[..., :k]


def quantize_weights(w, weight_format, group=None):
    """The dense weights a format's kernel actually multiplies by (fp32); ``group`` None: the
    format's default (int8 32, int4 32, fp8 128, int4_affine 128, mxfp4 32); int8 with ``group`` 0: per
    output channel."""
    if weight_format == "bf16":
        return _bf16(w)
    if weight_format == "int8":
        return quantize_int8(w, INT8_DEFAULT_GROUP if group is None else group)
    if weight_format == "int4":
        return quantize_int4(w, group or 32)
    if weight_format == "fp8":
        return quantize_fp8(w, group or 128)
    if weight_format == "int4_affine":
        return quantize_int4_affine(w, group or 128)
    if weight_format == "mxfp4":
        return quantize_mxfp4(w, group or 32)
    raise ValueError(f"unknown weight_format {weight_format!r}")


def relative_error(out, ref):
    """mean|out - ref| / mean|ref|: the accuracy metric of the formats."""
    out, ref = out.float(), ref.float()
    return ((out - ref).abs().mean() / ref.abs().mean().clamp_min(1e-30)).item()
