"""Command line: ``python -m torch_ktmoe info|demo|pack|inspect``."""
import argparse
import os
import sys

from torch_ktmoe.ops import WEIGHT_FORMATS


def cmd_info(args) -> int:
    import torch

    import torch_ktmoe
    from torch_ktmoe import _C

    print(f"torch_ktmoe {torch_ktmoe.__version__}")
    print(f"torch       {torch.__version__}")
    print(f"ISA         {torch_ktmoe.active_isa()} (auto would pick {_C.default_isa()}; "
          f"available: {', '.join(torch_ktmoe.available_isas())}; force with KTMOE_ISA)")
    print(f"threads     {torch.get_num_threads()} (torch.set_num_threads / OMP_NUM_THREADS)")
    print(f"NUMA nodes  {_C.numa_node_count()}")
    return 0


def cmd_demo(args) -> int:
    """The demo lives beside the package in a source checkout (ktmoe_harness/demo.py), not in the install."""
    import importlib.util

    if importlib.util.find_spec("ktmoe_harness") is None:
        print("demo: the demo runs from a source checkout of torch_ktmoe: `make demo` there", file=sys.stderr)
        return 2
    from ktmoe_harness import demo

    return demo.main(args.demo_args)


def _pack_problem(checkpoint: str, directory: str) -> str:
    """Why `pack` cannot start ("" if it can): checked before anything is created or read."""
    import re

    from torch_ktmoe import _C

    looks_like_repo_id = re.fullmatch(r"[\w.-]+(/[\w.-]+)?", checkpoint) and not checkpoint.startswith(".")
    if not os.path.exists(checkpoint) and not looks_like_repo_id:
        return f"checkpoint directory {checkpoint!r} does not exist"
    if os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
        return f"checkpoint {checkpoint!r} is not a directory"
    target = directory
    while not os.path.isdir(target):  # the directory pack would create: judge where it would live
        parent = os.path.dirname(os.path.abspath(target))
        if parent == os.path.abspath(target):
            break
        target = parent
    problem = _C.cache_dir_problem(target)
    return f"cannot keep packed experts in {directory!r}: {problem}" if problem else ""


def cmd_pack(args) -> int:
    import time

    from torch_ktmoe import KTMoE, hf
    from torch_ktmoe.cache import inspect_dir

    problem = _pack_problem(args.checkpoint, args.dir)
    if problem:
        print(f"pack: {problem}; nothing was packed", file=sys.stderr)
        return 2
    os.makedirs(args.dir, exist_ok=True)
    t0 = time.perf_counter()
    model = hf.from_pretrained(args.checkpoint, mmap_experts_dir=args.dir, weight_format=args.format,
                               cache="rebuild", progress=not args.quiet,
                               ktmoe_kwargs={"group_size": args.group_size} if args.group_size else None)
    r = model.ktmoe_report
    events = [e for m in model.modules() if isinstance(m, KTMoE) for e in m.cache_events]
    kept = {row["name"] for row in inspect_dir(args.dir) if row["valid"]}
    not_kept = [e for e in events if e["name"] + ".ktmoe" not in kept]
    kept_bytes = sum(os.path.getsize(os.path.join(args.dir, n)) for n in kept)
    print(f"packed {r.num_layers} layers ({r.packed_bytes / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s; "
          f"kept {len(events) - len(not_kept)} of {len(events)} cache files ({kept_bytes / 2**20:.1f} MiB) "
          f"in {args.dir}")
    for e in not_kept:
        print(f"pack: {e['name']} was not kept: {e['reason']}", file=sys.stderr)
    return 0 if events and not not_kept else 1


def cmd_inspect(args) -> int:
    from torch_ktmoe.cache import inspect_dir, leftover_temp_files

    rows = inspect_dir(args.dir, verify=args.verify)
    print(f"{'file':<26} {'layer':>5} {'part':>4} {'format':<6} {'E x H x I':<16} {'range':<11} "
          f"{'w13':<15} {'w2':<15} {'MiB':>8} {'resident':>8}  status")
    for r in rows:
        shape = f"{r.get('experts', '?')}x{r.get('hidden', '?')}x{r.get('inter', '?')}"
        rng = "{}..{}".format(*r["inter_range"]) if "inter_range" in r else "?"
        w13 = "x".join(map(str, r["w13_shape"])) if "w13_shape" in r else "?"
        w2 = "x".join(map(str, r["w2_shape"])) if "w2_shape" in r else "?"
        status = "valid" if r["valid"] else f"invalid: {r['reason']}"
        print(f"{r['name']:<26} {str(r['layer']):>5} {str(r['part']):>4} {r.get('weight_format', '?'):<6} {shape:<16} "
              f"{rng:<11} {w13:<15} {w2:<15} {r['file_bytes'] / 2**20:8.1f} "
              f"{max(r['resident_bytes'], 0) / 2**20:8.1f}  {status}")
    for name in leftover_temp_files(args.dir):
        print(f"{name:<26} temporary build file (a build in progress, or left by a crashed process)")
    print(f"{len(rows)} files, {sum(r['valid'] for r in rows)} valid")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_ktmoe", description="torch_ktmoe command line")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="version, torch, ISA chosen and available, threads").set_defaults(func=cmd_info)
    demo = sub.add_parser("demo", add_help=False,  # its flags: python -m torch_ktmoe demo --help
                          help="patch a Qwen3-MoE-shaped model and generate, anonymous vs file-backed")
    demo.set_defaults(func=cmd_demo)
    pack = sub.add_parser("pack", help="prebuild the packed expert cache files of a checkpoint into DIR")
    pack.add_argument("checkpoint", help="checkpoint directory (or hub id) with *.safetensors")
    pack.add_argument("dir", help="cache directory (mmap_experts_dir of later runs)")
    pack.add_argument("--format", default="bf16", choices=WEIGHT_FORMATS)
    pack.add_argument("--group-size", type=int, default=0, help="int4 group size (0: 32)")
    pack.add_argument("--quiet", action="store_true", help="no progress bar")
    pack.set_defaults(func=cmd_pack)
    insp = sub.add_parser("inspect", help="list the .ktmoe cache files of DIR: layer, part, format, "
                          "shapes, size, resident bytes, valid or why not")
    insp.add_argument("dir")
    insp.add_argument("--verify", action="store_true",
                      help="also compare every tensor's data checksum (reads every byte)")
    insp.set_defaults(func=cmd_inspect)
    args, rest = ap.parse_known_args(argv)
    if args.func is cmd_demo:
        args.demo_args = rest  # parsed by the demo itself
    elif rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
