"""The ``quantization_config`` of an int4-group checkpoint, checked against what :mod:`.compressed_tensors` and
:mod:`.gptq` read: ValueError naming the field for anything else (bits other than 4, another packing format,
GPTQ v2 zeros, AWQ's GEMV layout, quantized activations); and the group sizes it names
(:func:`config_group_sizes`), which the readers check each weight's scales against."""
from __future__ import annotations

INT4_QUANT_METHODS = ("compressed-tensors", "gptq", "awq")


def _refuse(where: str, field: str, value, want: str) -> ValueError:
    return ValueError(f"{where}: quantization_config.{field} = {value!r}; torch_ktmoe reads {want}")


def check_int4_config(qc: dict, where: str) -> None:
    """``qc`` (a checkpoint's quantization_config as a dict) names an int4 encoding torch_ktmoe reads."""
    method = str(qc.get("quant_method"))
    if method == "compressed-tensors":
        fmt = qc.get("format")
        groups = qc.get("config_groups") or {}
        if not groups:
            raise _refuse(where, "config_groups", groups, "compressed-tensors checkpoints with config_groups")
        for name, scheme in groups.items():
            field = f"config_groups.{name}"
            if not isinstance(scheme, dict):
                raise _refuse(where, field, scheme, "compressed-tensors schemes given in full (dicts)")
            scheme_fmt = scheme.get("format") or fmt
            if scheme_fmt != "pack-quantized":
                raise _refuse(where, f"{field}.format" if scheme.get("format") else "format", scheme_fmt,
                              "compressed-tensors format 'pack-quantized' (int4 codes in int32)")
            weights = scheme.get("weights") or {}
            checks = (("num_bits", weights.get("num_bits"), (4,)), ("type", weights.get("type"), ("int",)),
                      ("strategy", weights.get("strategy"), ("group", "channel")))
            for key, value, allowed in checks:
                if value not in allowed:
                    raise _refuse(where, f"{field}.weights.{key}", value, f"{key} in {list(allowed)}")
            if scheme.get("input_activations") is not None:
                raise _refuse(where, f"{field}.input_activations", scheme["input_activations"],
                              "weight-only schemes (W4A16: input_activations null)")
    elif method == "gptq":
        if qc.get("bits") != 4:
            raise _refuse(where, "bits", qc.get("bits"), "4-bit GPTQ")
        if qc.get("checkpoint_format", "gptq") != "gptq":
            raise _refuse(where, "checkpoint_format", qc.get("checkpoint_format"),
                          "GPTQ checkpoint_format 'gptq' (v1: zeros stored minus one)")
    elif method == "awq":
        bits = qc.get("bits", qc.get("w_bit"))
        if bits != 4:
            raise _refuse(where, "bits", bits, "4-bit AWQ")
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise _refuse(where, "version", qc.get("version"), "AWQ version 'gemm'")
    else:
        raise _refuse(where, "quant_method", method, f"int4 checkpoints of {list(INT4_QUANT_METHODS)}")
    config_group_sizes(qc, where)  # each a positive integer (or -1)


def _group_size(value, where: str, field: str) -> tuple[int, ...]:
    """(value,) for a positive group size, () for none (-1 / absent: one group per row); else ValueError."""
    if value is None or value == -1:
        return ()
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _refuse(where, field, value, "a positive integer group size (or -1: one group per row)")
    return (value,)


def config_group_sizes(qc: dict, where: str) -> tuple[int, ...]:
    """The int4 group sizes ``qc`` names, sorted: compressed-tensors' ``config_groups.*.weights.group_size``
    (strategy ``group``), GPTQ's / AWQ's ``group_size`` (AWQ's older ``q_group_size``); () when it names none
    or is not an int4 config."""
    method = str(qc.get("quant_method"))
    sizes: tuple[int, ...] = ()
    if method == "compressed-tensors":
        for name, scheme in (qc.get("config_groups") or {}).items():
            weights = scheme.get("weights") or {} if isinstance(scheme, dict) else {}
            if weights.get("strategy") == "group":
                sizes += _group_size(weights.get("group_size"), where, f"config_groups.{name}.weights.group_size")
    elif method in ("gptq", "awq"):
        field = "q_group_size" if "group_size" not in qc and "q_group_size" in qc else "group_size"
        sizes = _group_size(qc.get(field), where, field)
    return tuple(sorted(set(sizes)))
