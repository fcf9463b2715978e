"""How a KTMoE describes itself in ``repr`` (``extra_repr``): its shape, format, activation, NUMA parts, packed size
and where its experts live."""


def storage(layer) -> str:
    """Where the layer's experts live: a GGUF file in place, anonymous memory, or files (with any fallback)."""
    if layer.gguf is not None:
        source = f" in {layer.gguf.source}" if layer.gguf.source else ""
        return f"GGUF {'/'.join(layer.gguf.type_names)} in place{source}"
    if layer.mmap_experts_dir is None:
        return "anonymous"
    if layer.loaded and layer.file_backed_bytes == layer.packed_bytes:
        return f"file-backed in {layer.mmap_experts_dir}"
    return f"file-backed in {layer.mmap_experts_dir} (with anonymous fallback)"


def describe(layer) -> str:
    """``KTMoE.extra_repr``: ``experts=E, top_k=k, ..., storage=...``."""
    params = ", ".join(f"{k}={v:g}" for k, v in layer.activation_params.items())
    act = "" if layer.activation == "silu" else f"activation={layer.activation}({params}), "
    bias = ", biases" if any(b is not None for b in layer.biases()) else ""
    return (f"experts={layer.num_experts}, top_k={layer.top_k}, hidden={layer.hidden_size}, "
            f"intermediate={layer.intermediate_size}, format={layer.weight_format}, {act}"
            f"numa_parts={layer.numa_parts}, packed={layer.packed_bytes / 2**20:.1f} MiB, "
            f"storage={storage(layer)}{bias}")
