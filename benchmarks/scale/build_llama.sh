#!/usr/bin/env bash
# Builds libllama (llama.cpp vendored in the llama-cpp-python sdist, as benchmarks/llama_peer/build.sh)
# and the decode harness benchmarks/scale/llama_decode.cpp against it. Idempotent.
#   benchmarks/scale/build_llama.sh [OUT_DIR]      (default build/llama_scale) -> OUT_DIR/llama_decode
# GGML_NATIVE=ON, OpenMP: what a user building llama.cpp on this machine gets.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-build/llama_scale}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SDIST="$OUT/llama_cpp_python-$VERSION.tar.gz"
for cand in "$SDIST" build/llama_peer/llama_cpp_python-$VERSION.tar.gz; do
    [ -f "$cand" ] && [ "$cand" != "$SDIST" ] && cp "$cand" "$SDIST"
done
[ -f "$SDIST" ] || "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT"
SRC="$OUT/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -d "$SRC/src" ] || tar -xzf "$SDIST" -C "$OUT" "llama_cpp_python-$VERSION/vendor/llama.cpp"
touch "$SRC/ggml/ggml.pc.in"  # the sdist lacks it; cmake only needs the file to exist
if [ ! -f "$SRC/build/src/libllama.a" ]; then
    cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF > "$OUT/cmake-configure.log"
    echo "building libllama ($VERSION's vendored llama.cpp) in $SRC/build ..." >&2
    cmake --build "$SRC/build" --target llama -j "$(nproc)" > "$OUT/cmake-build.log" 2>&1 || {
        tail -30 "$OUT/cmake-build.log"; exit 1; }
fi
H=benchmarks/scale/llama_decode.cpp
if [ ! -x "$OUT/llama_decode" ] || [ "$H" -nt "$OUT/llama_decode" ]; then
    LIBS=$(find "$SRC/build" -name 'libllama.a' -o -name 'libggml*.a' | sort -r)
    g++ -O2 -std=c++17 -I "$SRC/include" -I "$SRC/ggml/include" "$H" -o "$OUT/llama_decode" \
        -Wl,--start-group $LIBS -Wl,--end-group -fopenmp -lpthread -ldl -lm
fi
echo "$OUT/llama_decode"
