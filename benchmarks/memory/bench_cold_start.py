"""Cold start: decode speed of the first passes after the page cache was dropped.

Run (root: it drops the page cache itself, ``sync; echo 3 > /proc/sys/vm/drop_caches``):
    python -m benchmarks.memory.bench_cold_start [--restarts 3] [--passes 40]

Packs --layers layers of E=--experts bf16 experts (H=--hidden, I=--intermediate,
default 8 x 32 x 1024 x 512 = 768 MiB) into KTMoE cache files under a directory on
disk (--mmap-dir, default /var/tmp), then, per row and restart, drops the page
cache and starts a fresh process that warms a small anonymous layer (thread
pool, code pages, scratch), loads the layers from the cache files
(``cache="reuse"``), warms them as the row says, and times decode passes (T=1,
top-k routing drawn at random per layer and pass) through all layers:

* ``warm="blocking"``, before: the old warm, ``MADV_POPULATE_READ`` only (done
  here through ctypes, exactly what the arena did before);
* ``warm="blocking"``: what KTMoE does now. The layer's arena reads the kept
  file with read() before the load maps and checks it
  (``WeightArena.load_or_build(read_first_max_bytes=)``, sequential readahead, every page read
  once by the CPU in the copy), then the warm touches one 64-byte line per cached
  page and ``MADV_POPULATE_READ`` maps them;
* ``warm="auto"``, the default: the load returns at once and the model's one background
  worker reads the layers in load order while the passes run (a layer not yet warm reads its
  routed experts ahead);
* ``warm="none"``: the experts fault in on demand;
* ``cat`` the files after the drop, then no warm;
* page cache hot: right after the previous row's process (no drop).

Reports per row the median over restarts of: pass 0, passes 1-3, steady (the
median of --passes more passes, run once every warm is done: ``join_warm``) and the mean of passes 4-, the speed of the first 16 passes
against steady (steady / their mean time), the time to the first pass's end from
the start of the load (load + warm + pass 0), pass 0 / steady by wall time and
by CPU time (getrusage: what a co-tenant taking a core does not inflate), major
and minor faults in pass 0, load + warm time with its throughput, and the timed passes' disk figures (MB read
per pass, GB/s over the passes and while the layers waited on the disk, each as % of the roof, the routed
experts' hit rate: torch_ktmoe.residency_report, counted in the timed passes only); plus the disk roof of
benchmarks/baselines/disk_roof.py over the same files, once per restart (one buffered stream, O_DIRECT 4 MiB
requests, 8 buffered streams; the best is the roof). The row order reverses every other restart ("hot" stays last).
Writes benchmarks/results/bench_cold_start.json (--out).
"""
import argparse
import ctypes
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from benchmarks.baselines.disk_roof import PATTERNS, disk_roof
from benchmarks.cli import add_out_argument, add_shape_arguments, write_result

MiB = 1 << 20
ROWS = ("blocking_before", "blocking", "auto", "none", "cat", "hot")
LABELS = {
    "blocking_before": 'warm="blocking", before (MADV_POPULATE_READ only)',
    "blocking": 'warm="blocking", after (file read() before the load, then populate)',
    "auto": 'warm="auto" (the default: the model\'s background warm while the passes run)',
    "none": 'warm="none" (faults on demand)',
    "cat": "cat files > /dev/null after the drop, no warm",
    "hot": "page cache hot (a second process)",
}


def _layer(args, i, warm):
    from torch_ktmoe import KTMoE

    return KTMoE(args.experts, args.top_k, args.hidden, args.intermediate, mmap_experts_dir=args.dir,
                 layer_idx=i, numa_parts=1, warm=warm, cache="reuse", residency=True)  # counted: timed passes


def _fingerprint(i):
    return f"bench-cold-start-{i}"


def build(args):
    import torch

    for i in range(args.layers):
        g = torch.Generator().manual_seed(i)
        gate_up = (torch.randn(args.experts, 2 * args.intermediate, args.hidden, generator=g)
                   / args.hidden ** 0.5).bfloat16()
        down = (torch.randn(args.experts, args.hidden, args.intermediate, generator=g)
                / args.intermediate ** 0.5).bfloat16()
        layer = _layer(args, i, "none")
        layer.load_weights(gate_up, down, fingerprint=_fingerprint(i))
        assert layer.cache_events and not layer.cache_hit  # packed and kept


def _populate_read(tensors):
    """The arena's warm before this change: MADV_POPULATE_READ in 64 MiB steps, nothing else."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    step = 64 * MiB
    for t in tensors:
        addr, n = t.data_ptr(), t.numel()
        end = addr + n
        addr -= addr % mmap.PAGESIZE
        for a in range(addr, end, step):
            if libc.madvise(a, min(step, end - a), 22) != 0:  # MADV_POPULATE_READ
                raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_READ)")


def child(args) -> int:
    """One fresh process: warm the process, load, warm as the row says, time passes."""
    import torch

    import torch_ktmoe
    from torch_ktmoe import KTMoE
    from torch_ktmoe.residency.counters import process_read_bytes

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(99)
    small = KTMoE(8, args.top_k, args.hidden, 256)  # anonymous: thread pool, code pages, scratch
    small.load_weights((torch.randn(8, 512, args.hidden, generator=g) / 32).bfloat16(),
                       (torch.randn(8, args.hidden, 256, generator=g) / 16).bfloat16())
    x = torch.randn(1, args.hidden, generator=g).bfloat16()
    n = 2 * args.passes * args.layers  # the timed passes, then as many steady ones
    ids = torch.stack([torch.randperm(args.experts, generator=g)[:args.top_k] for _ in range(n)])
    weights = torch.softmax(torch.randn(n, args.top_k, generator=g), dim=-1)
    with torch.inference_mode():
        for _ in range(20):
            small(x, ids[:1] % 8, weights[:1])

    warm = args.row if args.row in ("blocking", "auto") else "none"
    t0 = time.perf_counter()
    layers = [_layer(args, i, warm) for i in range(args.layers)]
    for i, layer in enumerate(layers):
        if not layer.try_load_cached(_fingerprint(i)):
            raise RuntimeError(f"layer {i}: no valid cache file: {layer.cache_events}")
    if args.row == "blocking_before":
        _populate_read([t for layer in layers for pair in layer.packed_tensors() for t in pair])
    ready_s = time.perf_counter() - t0

    times, cpu, pass0, steady = [], [], {}, []
    read0 = process_read_bytes()
    with torch.inference_mode():
        for p in range(2 * args.passes):
            if p == args.passes:
                disk = {"read_bytes": process_read_bytes() - read0,  # the timed passes' (and the warm's) reads
                        "residency": {k: v for k, v in torch_ktmoe.residency_report(torch.nn.ModuleList(layers)).items()
                                      if k != "per_layer"}}
                for layer in layers:
                    layer.join_warm()  # warm="auto": steady is measured once the model's warm is done
                    layer.residency_mode = False  # steady passes: not counted (its mincore would cost them)
            r0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for i, layer in enumerate(layers):
                j = p * args.layers + i
                x = layer(x, ids[j:j + 1], weights[j:j + 1])
            (times if p < args.passes else steady).append(time.perf_counter() - c0)
            if p >= args.passes:
                continue
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            if p == 0:
                pass0 = {"major_faults": r1.ru_majflt - r0.ru_majflt, "minor_faults": r1.ru_minflt - r0.ru_minflt}
    out = {"row": args.row, "ready_s": ready_s, "times_s": times, "cpu_s": cpu, "steady_s": steady, **pass0, **disk,
           "packed_bytes": sum(layer.packed_bytes for layer in layers),
           "status": sorted({a.prefault_status for layer in layers for a in layer.arenas}),
           "checksum": float(x.float().sum())}
    with open(args.result, "w") as f:
        json.dump(out, f)
    return 0


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")


def _files(args):
    return sorted(os.path.join(args.dir, n) for n in os.listdir(args.dir) if n.endswith(".ktmoe"))


def resident_fraction(files) -> float:
    """Fraction of the files' bytes in the page cache: mincore over a PROT_READ mapping (touches nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    resident = total = 0
    for path in files:
        size = os.path.getsize(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap {path}")
            vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            rc = libc.mincore(addr, size, vec)
            libc.munmap(addr, size)
            if rc != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            resident += sum(b & 1 for b in vec.raw) * mmap.PAGESIZE
            total += size
        finally:
            os.close(fd)
    return min(1.0, resident / total)


def run_row(args, row, work) -> dict:
    files = _files(args)
    if row != "hot":
        drop_caches()
        time.sleep(args.settle)
    if row == "cat":
        subprocess.run(f"cat {' '.join(files)} > /dev/null", shell=True, check=True)
    resident = resident_fraction(files)
    load = os.getloadavg()[0]
    out = os.path.join(work, f"{row}.json")
    cmd = [sys.executable, "-m", "benchmarks.memory.bench_cold_start", "--row", row, "--result", out]
    for k in ("layers", "experts", "hidden", "intermediate", "top_k", "passes", "threads", "dir"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    subprocess.run(cmd, check=True)
    with open(out) as f:
        r = json.load(f)
    r["resident_before"], r["loadavg"] = resident, load
    return r


def pass_disk(r) -> dict:
    """The timed passes' disk figures: MB read per pass (the process's read_bytes: the passes' and the warm's),
    GB/s over the passes, GB/s while the layers waited on the disk and the hit rate (residency_report)."""
    res, passes_s = r["residency"], sum(r["times_s"])
    return {"mb_per_pass": r["read_bytes"] / len(r["times_s"]) / 1e6, "gbs_passes": r["read_bytes"] / passes_s / 1e9,
            "gbs_waiting": res["read_bytes"] / res["read_seconds"] / 1e9 if res["read_seconds"] else None,
            "hit_rate": res["hit_rate"]}


def summarize(runs) -> dict:
    """Per restart: pass 0 against steady (the median of passes 4..), by wall time and by CPU time.

    CPU time (getrusage, all threads) is what a pass costs the machine; unlike the wall
    time it does not grow when a co-tenant takes a core from one of the pass's threads.
    """
    med = statistics.median
    per = []
    for r in runs:
        t, c = r["times_s"], r["cpu_s"]
        steady, steady_cpu = med(r["steady_s"]), med(c[4:])
        per.append({"pass0": t[0], "p1_3": t[1:4], "steady": steady, "mean_rest": statistics.mean(t[4:]),
                    "first16": steady / statistics.mean(t[:16]), "ttft": r["ready_s"] + t[0],
                    "t16": r["ready_s"] + sum(t[:16]),
                    "ratio": t[0] / steady, "ratio_cpu": c[0] / steady_cpu, "ready_s": r["ready_s"],
                    "major": r["major_faults"], "minor": r["minor_faults"],
                    "resident_before": r["resident_before"], "loadavg": r["loadavg"],
                    "gbs": r["packed_bytes"] / r["ready_s"] / 1e9, **pass_disk(r)})
    out = {k: med([p[k] for p in per]) for k in ("pass0", "steady", "mean_rest", "ratio", "ratio_cpu", "ready_s",
                                                  "major", "minor", "resident_before", "loadavg", "gbs",
                                                  "first16", "ttft", "t16", "mb_per_pass", "gbs_passes")}
    for k in ("gbs_waiting", "hit_rate"):  # None where nothing was read (hot) or counted
        vals = [p[k] for p in per if p[k] is not None]
        out[k] = med(vals) if vals else None
    out.update({"ratio_min": min(p["ratio"] for p in per), "ratio_max": max(p["ratio"] for p in per),
                "ready_min": min(p["ready_s"] for p in per), "first16_min": min(p["first16"] for p in per),
                "ttft_min": min(p["ttft"] for p in per),
                "p1_3": [med(x) for x in zip(*[p["p1_3"] for p in per])], "per_restart": per})
    return out


def table(summary, rows, disk) -> str:
    out = ["| how the experts came back into memory | pass 0 | passes 1-3 | steady (after every warm) | mean of 4- "
           "| pass 0 / steady: wall, median (min-max) | CPU time | faults in pass 0 (major / minor) "
           "| load + warm, median (min) | first 16 passes / steady speed, median (min) "
           "| load to the end of pass 0, median (min) | load to the end of pass 15 "
           "| page cache before the process | timed passes: MB read / pass | disk GB/s over them (% of roof) "
           "| disk GB/s while waiting (% of roof) | hit rate |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    best = disk["best"]
    pct = lambda v: "-" if v is None else f"{v:.2f} ({100 * v / best:.0f} %)"  # noqa: E731
    for row in rows:
        s = summary[row]
        state = "dropped" if row not in ("cat", "hot") else {"cat": "read by cat after the drop",
                                                             "hot": "left by the previous process"}[row]
        out.append(f"| {LABELS[row]} | {s['pass0'] * 1e3:.1f} ms | {'/'.join(f'{x * 1e3:.1f}' for x in s['p1_3'])} ms "
                   f"| {s['steady'] * 1e3:.2f} ms | {s['mean_rest'] * 1e3:.2f} ms "
                   f"| {s['ratio']:.2f} ({s['ratio_min']:.2f}-{s['ratio_max']:.2f}) | {s['ratio_cpu']:.2f} "
                   f"| {s['major']:.0f} / {s['minor']:.0f} | {s['ready_s']:.2f} s ({s['ready_min']:.2f} s), "
                   f"{s['gbs']:.2f} GB/s | {s['first16']:.2f} ({s['first16_min']:.2f}) "
                   f"| {s['ttft']:.2f} s ({s['ttft_min']:.2f} s) | {s['t16']:.2f} s "
                   f"| {state}, {s['resident_before'] * 100:.0f} % resident "
                   f"| {s['mb_per_pass']:.1f} | {pct(s['gbs_passes'])} | {pct(s['gbs_waiting'])} "
                   f"| {'-' if s['hit_rate'] is None else format(s['hit_rate'], '.2f')} |")
    out.append("")
    out.append(f"disk roof, all files, after a drop each (GB/s, medians of {len(disk['roofs'])}): "
               + ", ".join(f"{p} {disk[p]:.2f}" for p in PATTERNS) + f"; best {best:.2f} (the % above); "
               f"load average during the rows: {min(s['loadavg'] for s in summary.values()):.1f}-"
               f"{max(s['loadavg'] for s in summary.values()):.1f} on 2 cores")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    add_shape_arguments(ap, experts=32, top_k=4, hidden=1024, intermediate=512)
    ap.add_argument("--passes", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--settle", type=float, default=4.0,
                    help="seconds between the drop and the process (the VM hands freed pages back meanwhile)")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of " + ",".join(ROWS))
    ap.add_argument("--mmap-dir", default=None, help="parent of the cache directory (default /var/tmp)")
    ap.add_argument("--dir", help=argparse.SUPPRESS)     # child: the cache directory
    ap.add_argument("--row", help=argparse.SUPPRESS)     # child: which row
    ap.add_argument("--result", help=argparse.SUPPRESS)  # child: JSON out
    add_out_argument(ap, "bench_cold_start")
    args = ap.parse_args(argv)
    if args.row:
        return child(args)
    if os.geteuid() != 0:
        print("bench_cold_start: needs root, to drop the page cache (echo 3 > /proc/sys/vm/drop_caches)",
              file=sys.stderr)
        return 2
    from ktmoe_harness.checkpoint import make_workdir

    rows = [r for r in args.rows.split(",") if r]
    work = make_workdir(args, "ktmoe-cold-start-")
    args.dir = os.path.join(work, "experts")
    os.makedirs(args.dir)
    try:
        print(f"packing {args.layers} layers of {args.experts} bf16 experts (H={args.hidden}, "
              f"I={args.intermediate}) into cache files in {args.dir} ...", flush=True)
        build(args)
        files = _files(args)
        disk = {"roofs": []}
        runs = {r: [] for r in rows}
        print("each row: sync; echo 3 > /proc/sys/vm/drop_caches (except 'hot'), then a fresh process",
              flush=True)
        for k in range(args.restarts):
            disk["roofs"].append(disk_roof(files, drop=lambda paths: drop_caches()))
            order = rows if k % 2 == 0 else [r for r in reversed(rows) if r != "hot"] + (
                ["hot"] if "hot" in rows else [])
            for row in order:
                r = run_row(args, row, work)
                runs[row].append(r)
                t = r["times_s"]
                print(f"  restart {k} {row:>19}: pass 0 {t[0] * 1e3:6.1f} ms (CPU {r['cpu_s'][0] * 1e3:5.1f}), steady "
                      f"{statistics.median(r['steady_s']) * 1e3:5.2f} ms, first 16 / steady speed "
                      f"{statistics.median(r['steady_s']) / statistics.mean(t[:16]):.2f}, load+warm {r['ready_s']:.2f} s, "
                      f"faults {r['major_faults']}/{r['minor_faults']}, load avg {r['loadavg']:.1f}", flush=True)
        for pattern in (*PATTERNS, "best"):
            vals = [r[pattern] for r in disk["roofs"] if r[pattern] is not None]
            disk[pattern] = statistics.median(vals) if vals else float("nan")
        summary = {r: summarize(runs[r]) for r in rows}
        same = len({round(r["checksum"], 3) for row in rows for r in runs[row]}) == 1
        print(f"\n{args.layers} layers x {args.experts} experts bf16 (H={args.hidden}, I={args.intermediate}, "
              f"top-{args.top_k}), {sum(os.path.getsize(f) for f in files) / MiB:.0f} MiB of cache files, "
              f"{args.threads} threads, T=1, {args.passes} passes, medians of {args.restarts} restarts; "
              f"page cache dropped by this script (sync; echo 3 > /proc/sys/vm/drop_caches), "
              f"then {args.settle:g} s before each process; 'cat' and 'hot' start within seconds of the reads that "
              f"filled the page cache (a proactive reclaim such as DAMON pageout takes unmapped file pages idle "
              f"for about a minute)\n")
        print(table(summary, rows, disk))
        print(f"\nsame outputs in every row and restart: {same}")
        write_result(args.out, {"args": {k: v for k, v in vars(args).items() if k not in ("row", "result")},
                                "disk": disk, "summary": summary, "runs": runs})
        return 0 if same else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
