"""Command line: ``python -m torch_ktmoe info|demo|pack|inspect`` (``torch_ktmoe/__main__.py`` calls :func:`main`).

The command line is an application over the library, the layer above the wings: ``pack`` loads a checkpoint
through the Hugging Face wing (:mod:`.pack`), ``inspect`` reads packed model directories (the hf wing's
manifest) and GGUF files (:mod:`.gguf`). Nothing in the core, ``checkpoint/`` or a wing imports it
(``tests/test_layering.py``).
"""
import argparse
import os
import sys

from torch_ktmoe.ops import WEIGHT_FORMATS


def cmd_info(args) -> int:
    import torch

    import torch_ktmoe
    from torch_ktmoe import _C
    from torch_ktmoe.threads import thread_lines

    print(f"torch_ktmoe {torch_ktmoe.__version__}")
    print(f"torch       {torch.__version__}")
    print(f"ISA         {torch_ktmoe.active_isa()} (auto would pick {_C.default_isa()}; "
          f"available: {', '.join(torch_ktmoe.available_isas())}; force with KTMOE_ISA)")
    for line in thread_lines():
        print(line)
    print(f"NUMA nodes  {_C.numa_node_count()}")
    return 0


def cmd_demo(args) -> int:
    """The demo lives beside the package in a source checkout (ktmoe_harness/demo.py), not in the install: it
    runs as its own command, ``python -m ktmoe_harness.demo``, so the package never imports the harness."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("ktmoe_harness") is None:
        print("demo: the demo runs from a source checkout of torch_ktmoe: `make demo` there", file=sys.stderr)
        return 2
    from torch_ktmoe.threads import passive_env

    # the same torch_ktmoe and harness; torch's OpenMP threads sleep while they wait (docs/threads.md)
    env = {**passive_env(), "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.call([sys.executable, "-m", "ktmoe_harness.demo", *args.demo_args], env=env)


def cmd_pack(args) -> int:
    from torch_ktmoe.cli.pack import pack

    return pack(args)


def _inspected_dir(directory: str) -> str:
    """The directory whose .ktmoe files ``inspect`` lists: a packed model directory's experts directory."""
    from torch_ktmoe.hf.packed_manifest import experts_path, is_packed_dir, read_manifest

    if not is_packed_dir(directory):
        return directory
    manifest = read_manifest(directory)
    experts = experts_path(directory, manifest)
    print(f"packed model directory: {len(manifest['layers'])} experts layers, their files in {experts}")
    return experts


def _printable(name: str) -> str:
    """A file name as printable text: bytes that are not UTF-8 as ``\\xff`` (any locale's stdout takes it)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def cmd_inspect(args) -> int:
    from torch_ktmoe.cache import inspect_dir, leftover_temp_files
    from torch_ktmoe.hf.packed_manifest import PackedDirError

    if os.path.isfile(args.dir) and args.dir.endswith(".gguf"):
        from torch_ktmoe.cli.gguf import inspect_gguf

        return inspect_gguf(args.dir)
    if not os.path.isdir(args.dir):
        print(f"inspect: {args.dir!r} is not a directory (or a .gguf file)", file=sys.stderr)
        return 2
    try:
        directory = _inspected_dir(args.dir)
        rows = inspect_dir(directory, verify=args.verify)
        leftovers = leftover_temp_files(directory)
    except (OSError, ValueError, PackedDirError) as e:  # ValueError: a path that is not UTF-8
        print(f"inspect: {e}", file=sys.stderr)
        return 2
    print(f"{'file':<26} {'layer':>5} {'part':>4} {'format':<6} {'E x H x I':<16} {'range':<11} "
          f"{'w13':<15} {'w2':<15} {'MiB':>8} {'resident':>8}  status")
    for r in rows:
        shape = f"{r.get('experts', '?')}x{r.get('hidden', '?')}x{r.get('inter', '?')}"
        rng = "{}..{}".format(*r["inter_range"]) if "inter_range" in r else "?"
        w13 = "x".join(map(str, r["w13_shape"])) if "w13_shape" in r else "?"
        w2 = "x".join(map(str, r["w2_shape"])) if "w2_shape" in r else "?"
        status = "valid" if r["valid"] else f"invalid: {r['reason']}"
        print(f"{_printable(r['name']):<26} {str(r['layer']):>5} {str(r['part']):>4} "
              f"{r.get('weight_format', '?'):<6} {shape:<16} "
              f"{rng:<11} {w13:<15} {w2:<15} {r['file_bytes'] / 2**20:8.1f} "
              f"{max(r['resident_bytes'], 0) / 2**20:8.1f}  {status}")
    for name in leftovers:
        print(f"{_printable(name):<26} temporary build file (a build in progress, or left by a crashed process)")
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
    pack.add_argument("checkpoint", help="checkpoint directory (or hub id) with *.safetensors, or a FILE.gguf (a "
                      "split's first part; see docs/formats.md: GGUF experts run in place without packing)")
    pack.add_argument("dir", help="cache directory (mmap_experts_dir of later runs)")
    pack.add_argument("--format", default="bf16", choices=WEIGHT_FORMATS)
    pack.add_argument("--group-size", type=int, default=0,
                      help="group size along the input of int4 / int8 / fp8 (0: the format's default, 32 / 32 / 128)")
    pack.add_argument("--quiet", action="store_true", help="no progress bar")
    pack.set_defaults(func=cmd_pack)
    insp = sub.add_parser("inspect", help="list the .ktmoe cache files of DIR: layer, part, format, "
                          "shapes, size, resident bytes, valid or why not; of FILE.gguf: its experts' GGML types, "
                          "shapes and bytes per layer")
    insp.add_argument("dir", metavar="DIR|FILE.gguf")
    insp.add_argument("--verify", action="store_true",
                      help="also compare every tensor's data checksum (reads every byte)")
    insp.set_defaults(func=cmd_inspect)
    args, rest = ap.parse_known_args(argv)
    if args.func is cmd_demo:
        args.demo_args = rest  # parsed by the demo itself
    elif rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)
