#!/usr/bin/env bash
# Builds llama.cpp's ggml CPU backend from the llama-cpp-python sdist (vendor/llama.cpp) and the
# MoE-layer harness benchmarks/llama_peer/moe_layer_ggml.cpp against it. Idempotent.
#   benchmarks/llama_peer/build.sh [OUT_DIR]        (default build/llama_peer)
# Produces OUT_DIR/moe_layer_ggml. GGML_NATIVE=ON: ggml is tuned to this CPU, as a user building
# llama.cpp here would get; OpenMP threads, as in llama.cpp's default build.
# Offline: GGML_SRC=DIR builds from an unpacked ggml source tree (vendor/llama.cpp/ggml) instead of
# downloading the sdist. GGML_CMAKE_ARGS="-D..." are appended to ggml's cmake configure (they win
# over the defaults, e.g. "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF" for an AVX2-only peer).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build/llama_peer}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if [ -n "${GGML_SRC:-}" ]; then
    GGML=$(cd "$GGML_SRC" && pwd)
else
    SDIST="$OUT/llama_cpp_python-$VERSION.tar.gz"
    if [ ! -f "$SDIST" ]; then
        "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT"
    fi
    GGML="$OUT/llama_cpp_python-$VERSION/vendor/llama.cpp/ggml"
    if [ ! -d "$GGML" ]; then
        tar -xzf "$SDIST" -C "$OUT" --wildcards "llama_cpp_python-$VERSION/vendor/llama.cpp/ggml/*"
    fi
fi
touch "$GGML/ggml.pc.in"  # the sdist lacks it; cmake only needs the file to exist

if [ ! -f "$OUT/ggml-build/src/libggml-cpu.a" ]; then
    cmake -S "$GGML" -B "$OUT/ggml-build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON \
        -DBUILD_SHARED_LIBS=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF ${GGML_CMAKE_ARGS:-} \
        > "$OUT/cmake-configure.log"
    echo "building ggml (llama.cpp $VERSION's vendored copy) in $OUT/ggml-build ..."
    cmake --build "$OUT/ggml-build" -j "$(nproc)" > "$OUT/cmake-build.log" 2>&1 || {
        tail -30 "$OUT/cmake-build.log"; exit 1; }
fi

HARNESS=benchmarks/llama_peer/moe_layer_ggml.cpp
if [ ! -x "$OUT/moe_layer_ggml" ] || [ "$HARNESS" -nt "$OUT/moe_layer_ggml" ]; then
    LIBS=$(find "$OUT/ggml-build" -name 'libggml*.a' | sort -r)  # libggml.a, libggml-cpu.a, libggml-base.a
    g++ -O2 -std=c++17 -I "$GGML/include" "$HARNESS" -o "$OUT/moe_layer_ggml" \
        -Wl,--start-group $LIBS -Wl,--end-group -fopenmp -lpthread -ldl -lm
fi
echo "$OUT/moe_layer_ggml"
