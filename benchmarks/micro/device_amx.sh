#!/usr/bin/env bash
# AMX on hardware, in one go on an AMX host (the device machine: 16 Xeon cores with AMX-BF16/INT8):
#   1. the host, and the extension built against its torch;
#   2. the native kernel tests (tests/native: the AMX tile kernels against the generic oracle, on real tiles
#      instead of the emulator) and the AMX op tests of tests/test_isa.py, which skip on hosts without AMX;
#   3. benchmarks/micro/bench_amx.py: avx512 against amx on the same packed experts, alternated, T sweep.
#
#   set -o pipefail; OUT=/some/dir bash benchmarks/micro/device_amx.sh 2>&1 | tee /some/dir/log
#
# Environment: OUT [build/device_amx]  TOKENS [1,16,32,64,128,256,512]  FORMATS [bf16,int8,int8:0,int4]  ROUNDS [7]
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$(date +%s)
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-build/device_amx}
mkdir -p "$OUT"
say() { echo "== [$(( $(date +%s) - START )) s] $*"; }

say "host"
lscpu | grep -E '^(CPU\(s\)|Model name|Core\(s\) per socket|L2|L3|Hypervisor)' || true
echo "ISA flags: $(grep -m1 -o -w -E 'avx512f|avx512_bf16|avx512_vnni|amx_tile|amx_bf16|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "$($PY --version); torch $($PY -c 'import torch; print(torch.__version__)'); $(g++ --version | head -1); uptime: $(uptime)"

say "build"
MAX_JOBS=$(nproc) $PY setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
$PY -m torch_ktmoe info

say "tests: native kernels (AMX on tiles), AMX op tests"
$PY -m pytest -q -p no:cacheprovider tests/test_native_kernels.py tests/test_isa.py 2>&1 | tail -15
build/native_tests/test_kernels 2>&1 | grep -E 'amx|FAIL|passed' | tail -25

say "bench_amx"
$PY -m benchmarks.micro.bench_amx --tokens "${TOKENS:-1,16,32,64,128,256,512}" --formats "${FORMATS:-bf16,int8,int8:0,int4}" \
    --rounds "${ROUNDS:-7}" --out "$OUT/bench_amx.json"
say "end"
