# The two commands of the README: `make demo` and `make test`. Both install what
# is missing (idempotent: a second run only rebuilds changed sources).
PYTHON ?= python3
PIP    ?= $(PYTHON) -m pip
STAMP  := build/.deps-stamp

.PHONY: deps build demo test bench peers install clean

$(STAMP): requirements.txt
	$(PIP) install -q -r requirements.txt
	@mkdir -p build && touch $@

deps: $(STAMP)

build: deps
	$(PYTHON) setup.py -q build_ext --inplace

demo: build
	$(PYTHON) -m torch_ktmoe demo

test: build
	$(PYTHON) -m pytest -q tests

bench: build
	$(PYTHON) -m benchmarks.bench_moe

# Benchmark peers beside the CPU torch (--no-deps: kt-kernel's wheel asks for CUDA packages),
# and llama.cpp's ggml CPU backend with the MoE-layer harness (build/llama_peer/).
peers: deps
	$(PIP) install -q --no-deps kt-kernel==0.7.2
	$(PIP) install -q gguf
	PYTHON=$(PYTHON) bash benchmarks/llama_peer/build.sh

# Install into site-packages (builds against the installed torch).
install: deps
	$(PIP) install --no-build-isolation .

clean:
	rm -rf build torch_ktmoe/_C*.so *.egg-info
