"""avx2 against avx2_vnni int8 / int4 gemms: a one-thread decode microbenchmark and instructions per 64 weight bytes.

    python -m benchmarks.micro.bench_avx2_vnni [--passes N] [--objdump-only]

1. Builds benchmarks/micro/avx2_vnni_gemm.cpp (see its [NOTE]) with the kernels it calls
   (benchmarks/micro/build.py) and runs it: the avx2_vnni kernels there are the EVEX build
   (isa_flags.json's avx2_vnni_evex), which runs on AVX-512 hosts without AVX-VNNI; its timings
   are a proxy for an AVX-VNNI host, and the machine's `uptime` is printed with them.
2. Counts, with objdump, the instructions per 64 weight bytes of the one-row inner loops (the
   decode tiles: as many weight loads as dots per row) of the int8 / int4 objects of avx2, of
   avx2_vnni as the library builds it (VEX vpdpbusd, -mavxvnni) and of the EVEX build.
"""
import argparse
import re
import subprocess

from benchmarks.micro.build import build
from native_build import CSRC, ROOT, Recompiled, isa_of, ninja_build, torch_free_sources

OBJDUMP_BUILD = ROOT / "build" / "bench" / "avx2_vnni_objdump"  # the gemm objects whose loops are counted
# The dot instruction of each build and how many it issues per 32-byte weight load and row.
DOTS = {"int8": {"avx2": ("vpmaddubsw", 1), "avx2_vnni": ("vpdpbusd", 1), "avx2_vnni_evex": ("vpdpbusd", 1)},
        "int4": {"avx2": ("vpmaddubsw", 2), "avx2_vnni": ("vpdpbusd", 2), "avx2_vnni_evex": ("vpdpbusd", 2)}}


def _library_sources():
    """The kernels the program calls: pack, generic, avx2, avx2_vnni as EVEX."""
    kernels = [s for s in torch_free_sources() if s.is_relative_to(CSRC / "kernels")
               and isa_of(s) in ("generic", "avx2") and s.name not in ("isa_select.cpp", "moe_driver.cpp")]
    evex = [Recompiled(s, "avx2_vnni_evex") for s in torch_free_sources() if isa_of(s) == "avx2_vnni"]
    return kernels + evex + [CSRC / "common" / "cpu_features.cpp"]


def _objects():
    """(format, build, object) of the int8 / int4 gemms: avx2's, avx2_vnni's VEX and EVEX builds."""
    out = []
    for fmt in ("int8", "int4"):
        out.append((fmt, "avx2", Recompiled(CSRC / "kernels" / "avx2" / f"gemm_{fmt}_avx2.cpp", "avx2")))
        src = CSRC / "kernels" / "avx2_vnni" / f"gemm_{fmt}_avx2_vnni.cpp"
        out += [(fmt, "avx2_vnni", Recompiled(src, "avx2_vnni")), (fmt, "avx2_vnni_evex", Recompiled(src, "avx2_vnni_evex"))]
    return out


_LINE = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")


def dot_loops(obj, dot: str, per_load_row: int):
    """Innermost loops of `obj` (backward jumps) doing `dot`: (rows, instructions, instructions per 64 weight bytes)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True,
                          check=True).stdout
    insns = []  # (address, mnemonic, operands), in order
    for line in text.splitlines():
        m = _LINE.match(line.replace("{vex} ", ""))
        if m:
            insns.append((int(m.group(1), 16), m.group(2), m.group(3)))
    loops = []
    for i, (addr, op, args) in enumerate(insns):
        target = re.match(r"([0-9a-f]+) <", args)
        if not op.startswith("j") or not target or int(target.group(1), 16) >= addr:
            continue
        body = [x for x in insns[:i + 1] if int(target.group(1), 16) <= x[0] <= addr]
        if any(re.match(r"([0-9a-f]+) <", x[2]) and x[1].startswith("j") and x[0] < addr
               and int(re.match(r"([0-9a-f]+)", x[2]).group(1), 16) < x[0] for x in body):
            continue  # not innermost
        dots = sum(x[1] == dot for x in body)
        # 32-byte weight loads: a ymm register filled from memory (loads folded into an op included), neither a
        # broadcast (activations) nor a reload from the stack (spills)
        # (counted once per address: GCC may read the same bytes twice)
        loads = len({x[2].split(",")[0] for x in body
                     if "(" in x[2] and x[2].rstrip().endswith(tuple(f"%ymm{r}" for r in range(32)))
                     and "broadcast" not in x[1] and "(%rsp" not in x[2] and "(%rbp" not in x[2]})
        if dots and loads:
            loops.append((dots // (loads * per_load_row), len(body), 2 * len(body) / loads))
    return sorted(set(loops))


def print_counts():
    ninja_build(OBJDUMP_BUILD, [u for _, _, u in _objects()])
    print("the one-row (decode) dot loops, instructions per 64 weight bytes (objdump):")
    for fmt, build, unit in _objects():
        dot, per = DOTS[fmt][build]
        obj = OBJDUMP_BUILD / unit.source.relative_to(ROOT).with_suffix(f".{unit.isa}.o")
        loops = [(n, p) for rows, n, p in dot_loops(obj, dot, per) if rows == 1]
        print(f"  {fmt} {build:15s} " + ", ".join(f"{p:.1f} ({n} in a loop over {128 * n / p / 2:.0f} B)"
                                                   for n, p in loops))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=300, help="timed passes per kernel, format and mode")
    ap.add_argument("--objdump-only", action="store_true", help="only count instructions")
    args = ap.parse_args(argv)
    print_counts()
    if args.objdump_only:
        return 0
    program = build("avx2_vnni_gemm", library_sources=_library_sources())
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    r = subprocess.run([str(program), str(args.passes)])
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return r.returncode


if __name__ == "__main__":
    raise SystemExit(main())
