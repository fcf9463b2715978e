#!/usr/bin/env bash
# The one build of llama.cpp for the benchmarks: the llama.cpp vendored in the llama-cpp-python sdist,
# and one harness of this folder linked against it. Idempotent.
#   benchmarks/baselines/llama/build.sh HARNESS [OUT_DIR]      (default OUT_DIR build/llama_peer)
# prints OUT_DIR/HARNESS. HARNESS:
#   moe_layer_ggml  one MoE layer as a ggml graph (ggml only; benchmarks/baselines/llama_layer.py, make peers)
#   llama_decode    a GGUF model's decode through libllama (benchmarks/model/, built by scale/models.py)
# GGML_NATIVE=ON: ggml is tuned to this CPU, as a user building llama.cpp here would get; OpenMP threads, as in
# llama.cpp's default build. Offline: LLAMA_SRC=DIR builds from an unpacked llama.cpp tree (the sdist's
# vendor/llama.cpp) instead of downloading the sdist. GGML_CMAKE_ARGS="-D..." are appended to cmake's configure
# (they win over the defaults, e.g. "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF" for an AVX2-only peer).
set -euo pipefail
cd "$(dirname "$0")/../../.."
HARNESS=${1:?usage: benchmarks/baselines/llama/build.sh moe_layer_ggml|llama_decode [OUT_DIR]}
case "$HARNESS" in  # the cmake project (a folder of the llama.cpp tree) and the library that says it is built
    moe_layer_ggml) PROJECT=ggml TARGET=all LIB=libggml-cpu.a ;;
    llama_decode) PROJECT=. TARGET=llama LIB=libllama.a ;;
    *) echo "build.sh: unknown harness '$HARNESS' (moe_layer_ggml or llama_decode)" >&2; exit 2 ;;
esac
OUT=${2:-build/llama_peer}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if [ -n "${LLAMA_SRC:-}" ]; then
    SRC=$(cd "$LLAMA_SRC" && pwd)
else
    SDIST="$OUT/llama_cpp_python-$VERSION.tar.gz"
    [ -f "$SDIST" ] || "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT"
    SRC="$OUT/llama_cpp_python-$VERSION/vendor/llama.cpp"
    [ -d "$SRC/src" ] || tar -xzf "$SDIST" -C "$OUT" "llama_cpp_python-$VERSION/vendor/llama.cpp"
fi
touch "$SRC/ggml/ggml.pc.in"  # the sdist lacks it; cmake only needs the file to exist

BUILD="$OUT/cmake-$HARNESS"
if [ -z "$(find "$BUILD" -name "$LIB" 2>/dev/null)" ]; then
    cmake -S "$SRC/$PROJECT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_OPENMP=ON \
        -DBUILD_SHARED_LIBS=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF \
        ${GGML_CMAKE_ARGS:-} > "$OUT/cmake-configure.log"
    echo "building $TARGET (llama.cpp $VERSION's vendored copy) in $BUILD ..." >&2
    cmake --build "$BUILD" --target "$TARGET" -j "$(nproc)" > "$OUT/cmake-build.log" 2>&1 || {
        tail -30 "$OUT/cmake-build.log"; exit 1; }
fi

SOURCE=benchmarks/baselines/llama/$HARNESS.cpp
if [ ! -x "$OUT/$HARNESS" ] || [ "$SOURCE" -nt "$OUT/$HARNESS" ]; then
    LIBS=$(find "$BUILD" -name 'libllama.a' -o -name 'libggml*.a' | sort -r)  # libllama, libggml, -cpu, -base
    g++ -O2 -std=c++17 -I "$SRC/include" -I "$SRC/ggml/include" "$SOURCE" -o "$OUT/$HARNESS" \
        -Wl,--start-group $LIBS -Wl,--end-group -fopenmp -lpthread -ldl -lm
fi
echo "$OUT/$HARNESS"
