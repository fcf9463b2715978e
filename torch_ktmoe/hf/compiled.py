"""A compiled decode step for a patched Hugging Face model on the CPU (``compile_decode``).

``compile_decode(model)`` sets the model's generation config so that every later ``model.generate``
runs:

* the **prefill eagerly**, as transformers does: a prompt of any length is one eager forward, so no
  prompt length ever compiles anything (no buckets, no dynamic shapes). It runs once per request and
  its time is the experts op's and attention's over T tokens, the same kernels compiled or not;
* each **decode step compiled** with ``torch.compile(fullgraph=True, dynamic=False)``: one token,
  a static KV cache of ``max_cache_len`` positions and the 4-D mask over them, all of fixed shape, so
  one graph serves every token of every call whose prompt plus new tokens fit in ``max_cache_len``.
  The ktmoe ops are ``torch.library`` custom ops with fake kernels: they sit inside that graph.
  A model on transformers' default ``"sdpa"`` attention is switched to ``"ktmoe_decode"``
  (:mod:`.decode_attention`, unless its code tests for ``"sdpa"`` by name): the decode step's attention
  as grouped matmuls over the cache's key/value heads instead of SDPA over a ``repeat_kv`` copy of the
  whole static cache. ``patch_model`` / ``from_pretrained`` have usually switched it already.

Transformers does all of this itself (``cache_implementation="static"``, ``GenerationConfig.
max_cache_len``, ``compile_config``) but compiles only on CUDA-like devices by default; the
``CompileConfig`` flag ``_compile_all_devices`` turns it on for the CPU. A call that needs more than
``max_cache_len`` positions makes transformers size a larger cache (and keep that size), which
compiles one more graph: :attr:`CompiledDecode.graphs` counts the graphs compiled.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .decode_attention import use_decode_attention
from .experts import KTMoEExperts

__all__ = ["compile_decode", "CompiledDecode", "CompileDecodeError"]

DEFAULT_MAX_CACHE_LEN = 1024


class CompileDecodeError(ValueError):
    """The model cannot run a compiled decode step: not patched, no static cache, no full graph."""


class CompiledDecode:
    """What ``compile_decode`` set up on a model (also ``model.ktmoe_compiled``).

    ``graphs`` is the number of graphs the backend has compiled so far: 1 after the first
    ``generate``, and still 1 after any number of tokens and prompts that fit in ``max_cache_len``.
    """

    def __init__(self, backend, max_cache_len: int):
        self.max_cache_len = max_cache_len
        self.graphs = 0
        self.backend_name = backend if isinstance(backend, str) else getattr(backend, "__name__", repr(backend))
        inner = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend

        def counting_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
            self.graphs += 1
            return inner(gm, example_inputs, **kwargs)

        # a function, not a bound method: CompileConfig.to_dict deep-copies its fields, and deepcopy keeps
        # a function as it is but would copy the instance behind a bound method (and count on the copy)
        self.backend = counting_backend

    def __repr__(self) -> str:
        return (f"CompiledDecode(backend={self.backend_name!r}, max_cache_len={self.max_cache_len}, "
                f"graphs={self.graphs})")


def _refusal(model: nn.Module) -> str | None:
    """Why ``model`` cannot get a compiled static-cache decode step, or None."""
    if not any(isinstance(m, KTMoEExperts) for m in model.modules()):
        return (f"{type(model).__name__} has no KTMoE experts: patch it first (torch_ktmoe.hf.patch_model(model)) "
                f"or load it with torch_ktmoe.hf.from_pretrained")
    if not hasattr(model, "generate") or getattr(model, "generation_config", None) is None:
        return f"{type(model).__name__} is not a transformers generation model (no generate / generation_config)"
    if model.config.is_encoder_decoder:
        return f"{type(model).__name__} is an encoder-decoder model: only decoder-only models are supported"
    if not model._supports_default_dynamic_cache():
        return (f"{type(model).__name__} keeps its own cache (no transformers Cache instances), so its KV cache "
                f"cannot be static")
    if not getattr(model, "_can_compile_fullgraph", False):
        return (f"{type(model).__name__} does not support torch.compile(fullgraph=True) "
                f"(transformers marks it _can_compile_fullgraph=False)")
    return None


def compile_decode(model: nn.Module, *, max_cache_len: int = DEFAULT_MAX_CACHE_LEN,
                   backend="inductor") -> CompiledDecode:
    """Make ``model.generate`` run a static KV cache and a compiled decode step on the CPU.

    ``model`` is a patched transformers causal LM (``patch_model`` / ``from_pretrained``).
    ``max_cache_len``: positions of the static cache, i.e. the longest prompt + new tokens one graph
    serves; every decode step attends over all of them (masked), so size it to the calls you expect.
    ``backend``: a ``torch.compile`` backend name or callable (``"aot_eager"`` compiles in seconds,
    ``"inductor"`` generates fused C++ and runs fastest). Compilation happens in the first
    ``generate``. Returns the :class:`CompiledDecode`, also kept as ``model.ktmoe_compiled``.

    Raises :class:`CompileDecodeError` for a model without KTMoE experts, one whose cache cannot be
    static, one transformers does not compile with ``fullgraph=True``, or ``max_cache_len < 1``.
    """
    from transformers import CompileConfig

    reason = _refusal(model)
    if reason is not None:
        raise CompileDecodeError(reason)
    if not isinstance(max_cache_len, int) or max_cache_len < 1:
        raise CompileDecodeError(f"max_cache_len must be a positive int, got {max_cache_len!r}")

    use_decode_attention(model)
    compiled = CompiledDecode(backend, max_cache_len)
    config = CompileConfig(fullgraph=True, dynamic=False, backend=compiled.backend, mode=None)
    config._compile_all_devices = True  # transformers' own switch for compiling off CUDA
    generation = model.generation_config
    generation.cache_implementation = "static"
    generation.max_cache_len = max_cache_len
    generation.compile_config = config
    generation.disable_compile = False
    if "_previous_max_cache_length" in vars(model):  # transformers keeps the largest cache size it has used
        del model._previous_max_cache_length
    model.ktmoe_compiled = compiled
    return compiled
