#!/usr/bin/env bash
# Thread scaling of our MoE layer against llama.cpp on a many-core host, in one go: builds the
# extension and ggml + the MoE-layer harness there (offline, from an unpacked llama.cpp source tree),
# prints the CPU, then runs benchmarks/layer/bench_moe.py (llama.cpp alternated with ours, read roof
# in every round) for bf16/int8/int4 at T=1 on 16,2,1,4,8 threads and T=512 on 16 threads:
#   pass "auto": our ISA as picked at run time, llama.cpp built with GGML_NATIVE=ON;
#   pass "avx2" (only where the auto ISA is avx512): KTMOE_ISA=avx2 against a llama.cpp built for
#     AVX2 only (GGML_NATIVE=OFF, AVX/AVX2/FMA/F16C/BMI2, no AVX-512, no AMX): AVX2 against AVX2.
# The most important numbers come first (T=1, 16 and 2 threads, every format, auto ISA).
#
#   set -o pipefail; OUT=/some/dir bash benchmarks/layer/device_scaling.sh 2>&1 | tee /some/dir/log
#
# Writes OUT/auto.json, OUT/auto.md, OUT/avx2.json, OUT/avx2.md (bench_moe's JSON and table);
# build logs stay in build/device_scaling/ (their tails are printed on failure).
# Environment (defaults in brackets):
#   OUT [build/device_scaling]   LLAMA_SRC [.devcarry/llama.cpp (its ggml/ is enough) if present, else build.sh downloads the sdist]
#   THREADS [16,2,1,4,8: counts above nproc are dropped]   BIG_THREADS [16, capped at nproc]
#   TOKENS [1,512]   FORMATS [bf16,int8,int4]   ROUNDS [5]   REPS [20]   PASSES [auto avx2]
#   BUDGET_S [500: wall seconds for the whole script; the last pass gets what is left, under timeout]
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
START=$(date +%s)
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-build/device_scaling}
mkdir -p "$OUT" build/device_scaling
OUT=$(cd "$OUT" && pwd)
LOGS=$ROOT/build/device_scaling
NPROC=$(nproc)
cap() {  # comma list -> those <= nproc (at least nproc itself when all are above)
    local out=() t
    for t in ${1//,/ }; do [ "$t" -le "$NPROC" ] && out+=("$t"); done
    [ ${#out[@]} -eq 0 ] && out=("$NPROC")
    (IFS=,; echo "${out[*]}")
}
THREADS=$(cap "${THREADS:-16,2,1,4,8}")
BIG_THREADS=$(cap "${BIG_THREADS:-16}")
TOKENS=${TOKENS:-1,512}
FORMATS=${FORMATS:-bf16,int8,int4}
ROUNDS=${ROUNDS:-5}
REPS=${REPS:-20}
PASSES=${PASSES:-auto avx2}
BUDGET_S=${BUDGET_S:-500}
if [ -z "${LLAMA_SRC:-}" ] && [ -d .devcarry/llama.cpp ]; then LLAMA_SRC=$ROOT/.devcarry/llama.cpp; fi
elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "== [$(elapsed) s] $*"; }

say "host"
lscpu | grep -E '^(Architecture|CPU\(s\)|On-line|Model name|Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|NUMA node|L1d|L2|L3|CPU max MHz|CPU MHz|Hypervisor|Virtualization)' || true
echo "ISA flags: $(grep -m1 -o -w -E 'avx2|fma|f16c|bmi2|avx_vnni|avx512f|avx512bw|avx512vl|avx512dq|avx512_vnni|avx512_bf16|avx512_fp16|avx512vbmi|amx_tile|amx_bf16|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "nproc $NPROC; $(grep MemTotal /proc/meminfo); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null); cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo n/a)"
echo "$($PY --version); torch $($PY -c 'import torch; print(torch.__version__)'); $(g++ --version | head -1); $(cmake --version | head -1)"
echo "uptime: $(uptime)"
HAS_AVX512=0
grep -q -w avx512f /proc/cpuinfo && HAS_AVX512=1

say "building (in parallel): the extension, ggml native, ggml AVX2-only (llama.cpp source: ${LLAMA_SRC:-sdist download})"
AVX2_ARGS="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
 -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
 -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
( $PY setup.py -q build_ext --inplace > "$LOGS/build_ext.log" 2>&1 &&
  $PY -c 'from benchmarks.baselines.roofs import read_roof_isa; read_roof_isa()' >> "$LOGS/build_ext.log" 2>&1 ) &
PID_EXT=$!
LLAMA_SRC=${LLAMA_SRC:-} PYTHON=$PY bash benchmarks/baselines/llama/build.sh moe_layer_ggml build/llama_peer_native \
    > "$LOGS/build_ggml_native.log" 2>&1 &
PID_NATIVE=$!
PID_AVX2=
if [ "$HAS_AVX512" = 1 ]; then
    LLAMA_SRC=${LLAMA_SRC:-} GGML_CMAKE_ARGS="$AVX2_ARGS" PYTHON=$PY bash benchmarks/baselines/llama/build.sh \
        moe_layer_ggml build/llama_peer_avx2 > "$LOGS/build_ggml_avx2.log" 2>&1 &
    PID_AVX2=$!
fi
built() {  # pid name log -> 0 when the build succeeded; prints its log's tail otherwise
    if wait "$1"; then say "built $2"; return 0; fi
    say "BUILD FAILED: $2 ($3):"; tail -40 "$3"; return 1
}
built $PID_EXT "extension" "$LOGS/build_ext.log" || exit 1
LLAMA_NATIVE=0; LLAMA_AVX2=0
built $PID_NATIVE "ggml native + harness" "$LOGS/build_ggml_native.log" && LLAMA_NATIVE=1
if [ -n "$PID_AVX2" ]; then built $PID_AVX2 "ggml AVX2-only + harness" "$LOGS/build_ggml_avx2.log" && LLAMA_AVX2=1; fi
for d in native avx2; do
    b=build/llama_peer_$d/moe_layer_ggml
    [ -x "$b" ] || continue
    echo "llama.cpp $d: $(grep -h 'Adding CPU backend variant' build/llama_peer_$d/cmake-configure.log 2>/dev/null | sed 's/^-- //'); " \
         "zmm instructions in the harness: $(objdump -d "$b" 2>/dev/null | grep -c '%zmm')," \
         "ymm: $(objdump -d "$b" 2>/dev/null | grep -c '%ymm')"
done

say "python3 -m torch_ktmoe info"
$PY -m torch_ktmoe info
AUTO_ISA=$($PY -c 'from torch_ktmoe import _C; print(_C.default_isa())')
echo "auto ISA: $AUTO_ISA"

run_pass() {  # name isa(auto|avx2) llama_dir(native|avx2|"") timeout_s
    local name=$1 isa=$2 peer=$3 limit=$4 llama_flag=()
    if [ -n "$peer" ]; then
        mkdir -p build/llama_peer && cp -f "build/llama_peer_$peer/moe_layer_ggml" build/llama_peer/moe_layer_ggml
    else
        llama_flag=(--no-llama)
    fi
    local env_isa=()
    [ "$isa" != auto ] && env_isa=(env KTMOE_ISA="$isa")
    say "pass $name: ISA $isa, llama.cpp ${peer:-none}, T $TOKENS, threads $THREADS (T > 32: $BIG_THREADS), timeout ${limit} s"
    timeout --signal=TERM --kill-after=10 "$limit" "${env_isa[@]}" $PY -m benchmarks.layer.bench_moe --shapes ref \
        --formats "$FORMATS" --tokens "$TOKENS" --threads "$THREADS" --threads-big "$BIG_THREADS" \
        --rounds "$ROUNDS" --reps "$REPS" --no-peers "${llama_flag[@]}" --out "$OUT/$name.json"
    local rc=$?
    say "pass $name done (rc $rc)"
    return $rc
}

for pass in $PASSES; do
    left=$(( BUDGET_S - $(elapsed) ))
    case $pass in
        auto)
            peer=; [ "$LLAMA_NATIVE" = 1 ] && peer=native
            # the first pass may take at most 2/3 of what is left when a second one follows
            limit=$left; [ "$HAS_AVX512" = 1 ] && [[ " $PASSES " == *" avx2 "* ]] && [ "$AUTO_ISA" = avx512 ] && limit=$(( left * 2 / 3 ))
            run_pass auto auto "$peer" "$limit" ;;
        avx2)
            if [ "$AUTO_ISA" != avx512 ]; then say "pass avx2 skipped: the auto ISA is already $AUTO_ISA"; continue; fi
            peer=; [ "$LLAMA_AVX2" = 1 ] && peer=avx2
            [ "$left" -lt 30 ] && { say "pass avx2 skipped: ${left} s left"; continue; }
            run_pass avx2 avx2 "$peer" "$left" ;;
        *) say "unknown pass $pass" ;;
    esac
done
# leave the native harness where `make peers` puts it
[ -x build/llama_peer_native/moe_layer_ggml ] && cp -f build/llama_peer_native/moe_layer_ggml build/llama_peer/moe_layer_ggml

say "summary (ours vs llama.cpp; % of the read roof measured in the same rounds)"
$PY - "$OUT" <<'EOF'
import json, os, sys
for name in ("auto", "avx2"):
    p = os.path.join(sys.argv[1], name + ".json")
    if not os.path.exists(p):
        continue
    r = json.load(open(p))
    print(f"\n### pass {name}: ISA {r['isa']}\n")
    print("| format | T | threads | read roof GB/s | ours ms (median / min) | llama.cpp ms (median / min) | llama.cpp / ours"
          " | % read roof ours / llama.cpp | ours weight GB/s | % compute roof ours |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for x in sorted(r["rows"], key=lambda x: (["bf16", "int8", "int4"].index(x["format"]), x["tokens"], x["threads"])):
        lm = f"{x['llama_ms']:.3f} / {x['llama_ms_min']:.3f}" if "llama_ms" in x else ""
        ratio = f"{x['llama_over_ours']:.2f}" if "llama_over_ours" in x else ""
        roof = f"{100 * x['read_roof_frac']:.0f}" + (f" / {100 * x['llama_read_roof_frac']:.0f}" if "llama_read_roof_frac" in x else "")
        comp = f"{100 * x['compute_roof_frac']:.0f}" if x.get("compute_roof_frac") else ""
        print(f"| {x['format']} | {x['tokens']} | {x['threads']} | {x['read_GBps']:.1f} | {x['ms']:.3f} / {x['ms_min']:.3f}"
              f" | {lm} | {ratio} | {roof} | {x['weight_GBps']:.1f} | {comp} |")
EOF
say "end"
