"""What the demo, the tests and the benchmarks share to drive torch_ktmoe from outside.

Not part of the installed package (pyproject.toml installs ``torch_ktmoe`` only): it runs
from a source checkout, next to ``tests/`` and ``benchmarks/``.

* ``moe_inputs``  random experts and routings for op- and layer-level tests and benchmarks;
* ``ggml_rows``   random GGML rows (a GGUF tensor's bytes) of any type, for the GGUF tests and benchmarks;
* ``options``     the command-line flags of a model run: which model, where its files go, how it runs;
* ``checkpoint``  a random Qwen3-MoE checkpoint, built offline from a config;
* ``generate``    ``hf.from_pretrained`` timed, a seeded prompt, greedy decoding with a KV cache;
* ``child``       child Python processes that import what this one does; one run per mode, JSON back;
* ``transformers_families``  every transformers ``*Experts`` class, built on the meta device from a tiny config;
* ``memcg``       a child Python process inside a cgroup-v1 memory limit;
* ``demo``        ``python -m torch_ktmoe demo`` (``make demo``): anonymous vs file-backed experts.
"""
