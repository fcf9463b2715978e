#!/usr/bin/env bash
# one-off device tuning run: decode item size and THP for the weights, T=1, ours only
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$(date +%s)
python3 setup.py -q build_ext --inplace > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
python3 -c 'from benchmarks.roofs import read_roof_isa; read_roof_isa()' || exit 1
echo "built in $(( $(date +%s) - START )) s; $(nproc) cpus; THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
run() {  # name env...
    local name=$1; shift
    echo "=== $name ($*) at $(( $(date +%s) - START )) s"
    env "$@" timeout 150 python3 -m benchmarks.bench_moe --no-llama --no-peers --shapes ref --tokens 1 --threads 16,2 \
        --formats bf16,int8,int4 --rounds 3 --reps 20 --out "$OUT/$name.json" 2>&1 | grep -v "^\[" | tail -12
}
run base KTMOE_DECODE_ITEM_KB=256
run thp THP_MEM_ALLOC_ENABLE=1
run item128 KTMOE_DECODE_ITEM_KB=128
run item1024 KTMOE_DECODE_ITEM_KB=1024
run thp_item128 THP_MEM_ALLOC_ENABLE=1 KTMOE_DECODE_ITEM_KB=128
echo "done at $(( $(date +%s) - START )) s"
