# The two commands of the README: `make demo` and `make test`. Both install what
# is missing (idempotent: a second run only rebuilds changed sources).
PYTHON ?= python3
PIP    ?= $(PYTHON) -m pip
STAMP  := build/.deps-stamp

.PHONY: deps build demo test test-latest test-sglang bench bench-scale peers install clean

$(STAMP): requirements.txt
	$(PIP) install -q -r requirements.txt
	@mkdir -p build && touch $@

deps: $(STAMP)

build: deps
	$(PYTHON) setup.py -q build_ext --inplace

demo: build
	$(PYTHON) -m torch_ktmoe demo

test: build
	$(PYTHON) -m pytest -q tests --ignore=tests/integration

# Canary, not part of `make test` or CI: the newest transformers release in its own venv
# (requirements.txt, then transformers upgraded), the Hugging Face tests against the in-tree build
# (same torch pin, so the same extension). A new release shows up here the day it appears, while
# `make test` stays on the pinned version; a failure here says what to support before moving the pin.
LATEST_VENV  := build/latest-venv
LATEST_PY    := $(LATEST_VENV)/bin/python

test-latest: build
	$(PYTHON) -m venv $(LATEST_VENV)
	$(LATEST_PY) -m pip install -q -r requirements.txt
	$(LATEST_PY) -m pip install -q --upgrade transformers
	@$(LATEST_PY) -c "import transformers; print('canary: transformers', transformers.__version__)"
	$(LATEST_PY) -m pytest -q -p no:cacheprovider tests/test_hf.py tests/test_hf_families.py \
		tests/test_hf_gpt_oss.py tests/test_hf_dropin.py tests/test_docs_models.py

# sglang drop-in: its own venv (sglang 0.5.23 + its torch 2.14.1, requirements-sglang.txt),
# the project pip-installed there (built against that torch, objects in
# build/temp-torch-<version>), then tests/integration. -P, --import-mode=importlib and
# --confcutdir keep the in-tree package (built against this machine's torch) off sys.path.
SGL_VENV  := build/sglang-venv
SGL_PY    := $(SGL_VENV)/bin/python
SGL_STAMP := $(SGL_VENV)/.deps-stamp

$(SGL_STAMP): requirements-sglang.txt
	$(PYTHON) -m venv $(SGL_VENV)
	$(SGL_PY) -m pip install -q -r requirements-sglang.txt
	$(SGL_PY) -m pip install -q --no-deps sglang==0.5.23
	touch $@

test-sglang: $(SGL_STAMP)
	$(SGL_PY) -m pip install -q --no-build-isolation --no-deps .
	TORCHDYNAMO_DISABLE=1 $(SGL_PY) -P -m pytest -q -p no:cacheprovider --import-mode=importlib \
		--confcutdir=tests/integration tests/integration

bench: build
	$(PYTHON) -m benchmarks.layer.bench_moe

# a 30B-class MoE (int8, ~29 GB) against llama.cpp's mmap under memory cgroups: ~60 GB of disk, tens of
# minutes, root; builds libllama from the llama-cpp-python sdist (benchmarks/model/bench_scale.py)
bench-scale: build
	$(PIP) install -q gguf
	$(PYTHON) -m benchmarks.model.bench_scale

# Benchmark peers beside the CPU torch (--no-deps: kt-kernel's wheel asks for CUDA packages),
# and llama.cpp's ggml CPU backend with the MoE-layer harness (build/llama_peer/).
peers: deps
	$(PIP) install -q --no-deps kt-kernel==0.7.2
	$(PIP) install -q gguf
	PYTHON=$(PYTHON) bash benchmarks/baselines/llama/build.sh moe_layer_ggml

# Install into site-packages (builds against the installed torch).
install: deps
	$(PIP) install --no-build-isolation .

clean:
	rm -rf build torch_ktmoe/_C*.so *.egg-info
