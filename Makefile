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

# Canary, not part of `make test` or CI: the newest release of every upstream the tests depend on, in its
# own venv (build/latest-venv): torch and transformers upgraded past requirements.txt's pins, the rest of
# requirements.txt upgraded too (== pins kept). The extension is built against that torch in a fresh copy of
# the working tree (build/latest-tree: tracked and untracked files git does not ignore; built from scratch, as
# a copy's file times cannot tell which objects are stale), installed into the venv as a user would
# (`pip install --no-build-isolation`), then the whole suite runs in the copy. A release shows up here the
# day it appears, while `make test` stays on the pins; a failure says what to support before moving them.
LATEST_VENV  := build/latest-venv
LATEST_PY    := $(CURDIR)/$(LATEST_VENV)/bin/python
LATEST_TREE  := build/latest-tree

test-latest:
	$(PYTHON) -m venv $(LATEST_VENV)
	grep -v -E '^(torch|transformers)([^a-z_-]|$$)' requirements.txt > $(LATEST_VENV)/requirements-unpinned.txt
	$(LATEST_PY) -m pip install -q --upgrade pip
	$(LATEST_PY) -m pip install -q --upgrade torch transformers -r $(LATEST_VENV)/requirements-unpinned.txt
	rm -rf $(LATEST_TREE) && mkdir -p $(LATEST_TREE)
	git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null \
		| tar -xmf - -C $(LATEST_TREE)
	cd $(LATEST_TREE) && $(LATEST_PY) -m pip install -q --no-build-isolation --no-deps .
	cd / && $(LATEST_PY) -c "import torch_ktmoe, torch, transformers; print('canary: torch', torch.__version__, \
		'/ transformers', transformers.__version__, '/ torch_ktmoe', torch_ktmoe.__version__, 'installed')"
	cd $(LATEST_TREE) && $(LATEST_PY) setup.py -q build_ext --inplace
	cd $(LATEST_TREE) && $(LATEST_PY) -m pytest -q -p no:cacheprovider tests --ignore=tests/integration
	@$(LATEST_PY) -c "import torch, transformers; print('canary passed: torch', torch.__version__, \
		'/ transformers', transformers.__version__)"

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
	$(PYTHON) -m benchmarks.model.bench_scale

# Benchmark peers beside the CPU torch (--no-deps: kt-kernel's wheel asks for CUDA packages),
# and llama.cpp's ggml CPU backend with the MoE-layer harness (build/llama_peer/).
peers: deps
	$(PIP) install -q --no-deps kt-kernel==0.7.2
	PYTHON=$(PYTHON) bash benchmarks/baselines/llama/build.sh moe_layer_ggml

# Install into site-packages (builds against the installed torch).
install: deps
	$(PIP) install --no-build-isolation .

clean:
	rm -rf build torch_ktmoe/_C*.so *.egg-info
