"""``python -m torch_ktmoe pack CHECKPOINT DIR``: prebuild the packed expert cache files of a checkpoint (a
safetensors directory, or a GGUF file: its experts dequantized exactly and packed into ``--format``).

Everything that can be judged before loading is judged first, and a refusal is one line on
stderr, exit code 2, with nothing created: the output is a file, empty, or under a file; the
checkpoint is missing, a file, unreadable (or one of its shards is, or is no regular file), has
no ``*.safetensors``, or is a packed model directory (nothing to pack); a path that is not UTF-8;
a name that is neither a local directory nor a hub id (``owner/name``); a ``--group-size`` the format does not
take; a directory the cache cannot keep files in (tmpfs, unwritable, ...); a disk with less free
space than the files need at the least. A load that fails later is one line too, and removes the
output directory if pack created it. A file not kept (e.g. the disk filled up) is named with the
arena's reason (``fallocate: No space left on device``) and makes the exit code 1.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time

ALIGN = 2 << 20  # a cache file's tensors start on 2 MiB boundaries (csrc/arena/cache_file.h)


class PackRefused(Exception):
    """Why pack does not start (or stopped): one line for the user."""


def _is_hub_id(name: str) -> bool:
    """``owner/name`` that is not a (mistyped) local path: its first part is no local directory."""
    return bool(re.fullmatch(r"[\w-][\w.-]*/[\w-][\w.-]*", name)) and not os.path.isdir(name.split("/")[0])


def _safetensors_files(checkpoint: str) -> list[str]:
    try:
        names = os.listdir(checkpoint)
    except OSError as e:
        raise PackRefused(f"checkpoint directory {checkpoint!r} cannot be read: {e.strerror}") from None
    return sorted(os.path.join(checkpoint, n) for n in names if n.endswith(".safetensors"))


def _header(path: str) -> dict:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, offsets), read through the
    checkpoint files' one opener (a FIFO is refused, never waited on)."""
    from ..checkpoint.files import open_regular, safetensors_header

    try:
        with open_regular(path) as (fd, st):
            raw = safetensors_header(fd, st.st_size, path)[8:]
    except OSError as e:
        raise PackRefused(f"checkpoint file {path!r} cannot be read: {e.strerror}") from None
    except ValueError as e:  # not a regular file, no safetensors header
        raise PackRefused(str(e)) from None
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise PackRefused(f"checkpoint file {path!r} is not a safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise PackRefused(f"checkpoint file {path!r} is not a safetensors file (its header is not an object)")
    return header


def is_gguf(checkpoint: str) -> bool:
    return checkpoint.endswith(".gguf") and os.path.isfile(checkpoint)


def _gguf_layers(checkpoint: str):
    """The routed experts of each layer of a GGUF file (PackRefused naming what is wrong with it)."""
    from ..checkpoint.gguf import GGUFError, expert_layers, open_gguf

    try:
        layers = expert_layers(open_gguf(checkpoint))
    except (GGUFError, OSError) as e:
        raise PackRefused(str(e)) from None
    if not layers:
        raise PackRefused(f"GGUF file {checkpoint!r} has no routed experts (blk.N.ffn_*_exps.weight)")
    return layers


def _expert_params(checkpoint: str) -> dict[str, int]:
    """Weights of the experts per experts block (the key before ".experts."; a GGUF's layer)."""
    if is_gguf(checkpoint):
        return {str(layer.layer): 3 * layer.shape[0] * layer.shape[1] * layer.shape[2]
                for layer in _gguf_layers(checkpoint)}
    params: dict[str, int] = {}
    for path in _safetensors_files(checkpoint):
        for key, info in _header(path).items():
            if ".experts." not in key or key.endswith(("bias", "scales", "_scale")) or not isinstance(info, dict):
                continue
            numel = 1
            for d in info.get("shape") or [0]:
                numel *= int(d) if isinstance(d, int) and d >= 0 else 0
            block = key.split(".experts.")[0]
            params[block] = params.get(block, 0) + numel
    return params


def least_packed_bytes(checkpoint: str, weight_format: str) -> int:
    """A lower bound of the disk space the cache files of ``checkpoint`` take in ``weight_format``:
    per layer, its expert weights at the format's code bits, each of its two packed tensors
    (gate/up and down) rounded up to the 2 MiB alignment of a cache file."""
    from ..ops import FORMAT_TRAITS

    bits = FORMAT_TRAITS[weight_format]["code_bits"]
    total = 0
    for p in _expert_params(checkpoint).values():  # gate and up are two thirds of a SwiGLU expert's weights, down one third
        for share in (p * 2 // 3, p // 3):
            total += -(-max(share * bits // 8, 1) // ALIGN) * ALIGN
    return total


def free_bytes(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _existing_parent(directory: str) -> str:
    """The nearest of ``directory`` and its parents that exists (a directory, else PackRefused naming it)."""
    target = os.path.abspath(directory)
    while not os.path.lexists(target):
        parent = os.path.dirname(target)
        if parent == target:
            break
        target = parent
    if not os.path.isdir(target):
        raise PackRefused(f"{directory!r} cannot be made: {target!r} is not a directory")
    return target


def _utf8(path: str, what: str) -> str:
    from ..paths import utf8_path

    try:
        return utf8_path(path, what)
    except ValueError as e:
        raise PackRefused(str(e)) from None


def check(checkpoint: str, directory: str, weight_format: str, group_size: int) -> None:
    """Raises PackRefused with the first reason pack cannot start; reads no weight, creates nothing."""
    from .. import _C
    from ..hf.packed_manifest import is_packed_dir
    from ..ops import FORMAT_TRAITS

    if not directory:
        raise PackRefused("DIR is empty: name the directory to keep the packed experts in")
    _utf8(checkpoint, "checkpoint directory")
    _utf8(directory, "DIR")
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise PackRefused(f"{directory!r} exists and is not a directory")
    takes_group = ("chosen", "row")  # "row": one scale per row unless a group is asked for (int8)
    if group_size and (FORMAT_TRAITS[weight_format]["group"] not in takes_group or group_size < 0 or group_size % 32):
        grouped = [n for n, r in FORMAT_TRAITS.items() if r["group"] in takes_group]
        raise PackRefused(f"--group-size {group_size}: must be a positive multiple of 32, for a grouped format "
                          f"({', '.join(grouped)}), not {weight_format}")
    if is_gguf(checkpoint):
        _gguf_layers(checkpoint)
    elif os.path.lexists(checkpoint):
        if not os.path.isdir(checkpoint):
            raise PackRefused(f"checkpoint {checkpoint!r} is not a directory (nor a *.gguf file)")
        if is_packed_dir(checkpoint):
            raise PackRefused(f"{checkpoint!r} is a packed model directory: its experts are packed already "
                              "(load it with torch_ktmoe.hf.from_pretrained; there is nothing to pack)")
        if not _safetensors_files(checkpoint):
            raise PackRefused(f"checkpoint directory {checkpoint!r} has no *.safetensors file")
    elif not _is_hub_id(checkpoint):
        raise PackRefused(f"checkpoint directory {checkpoint!r} does not exist (and it is no hub id, owner/name)")
    target = _existing_parent(directory)
    problem = _C.cache_dir_problem(target)
    if problem:
        raise PackRefused(f"cannot keep packed experts in {directory!r}: {problem}")


def _replaced_bytes(directory: str) -> int:
    """Disk space the cache files already in ``directory`` give back as pack replaces them one by one
    (all but the largest: a file is replaced only once its successor is written)."""
    from ..cache import CACHE_SUFFIX

    if not os.path.isdir(directory):
        return 0
    sizes = [os.lstat(os.path.join(directory, n)).st_blocks * 512 for n in os.listdir(directory)
             if n.endswith(CACHE_SUFFIX)]
    return sum(sizes) - max(sizes, default=0)


def check_space(checkpoint: str, directory: str, weight_format: str) -> None:
    need = least_packed_bytes(checkpoint, weight_format)
    free = free_bytes(_existing_parent(directory)) + _replaced_bytes(directory)
    if need > free:
        raise PackRefused(f"{directory!r} has {free / 2**20:.1f} MiB free; the {weight_format} cache files of "
                          f"{checkpoint!r} need at least {need / 2**20:.1f} MiB")


def resolve(checkpoint: str) -> str:
    """The local checkpoint directory or GGUF file (a hub id is downloaded)."""
    if os.path.isdir(checkpoint) or is_gguf(checkpoint):
        return checkpoint
    from ..hf.streaming import _resolve_dir

    try:
        path = _resolve_dir(checkpoint)
    except Exception as e:  # noqa: BLE001 - any download failure is that one line
        raise PackRefused(f"cannot download {checkpoint!r} from the hub: {_first_line(e)}") from None
    return path


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def pack(args) -> int:
    from .. import KTMoE, hf
    from ..cache import inspect_dir

    try:
        check(args.checkpoint, args.dir, args.format, args.group_size)
        checkpoint = resolve(args.checkpoint)
        if checkpoint != args.checkpoint:
            check(checkpoint, args.dir, args.format, args.group_size)
        check_space(checkpoint, args.dir, args.format)
    except PackRefused as e:
        print(f"pack: {e}; nothing was packed", file=sys.stderr)
        return 2
    created = not os.path.isdir(args.dir)
    os.makedirs(args.dir, exist_ok=True)
    t0 = time.perf_counter()
    source = {"pretrained_model_name_or_path": os.path.dirname(checkpoint) or ".", "gguf_file": checkpoint} \
        if is_gguf(checkpoint) else {"pretrained_model_name_or_path": checkpoint}
    try:
        model = hf.from_pretrained(**source, mmap_experts_dir=args.dir, weight_format=args.format,
                                   cache="rebuild", progress=not args.quiet,
                                   ktmoe_kwargs={"group_size": args.group_size} if args.group_size else None,
                                   pack_linears=False, decode_attention=False)  # only the experts' files count
    except (ValueError, RuntimeError, OSError, KeyError) as e:
        if created:
            shutil.rmtree(args.dir, ignore_errors=True)
        print(f"pack: {checkpoint}: {_first_line(e)}; nothing was kept", file=sys.stderr)
        return 2
    r = model.ktmoe_report
    layers = [m for m in model.modules() if isinstance(m, KTMoE)]
    events = [e for m in layers for e in m.cache_events]
    kept = {row["name"] for row in inspect_dir(args.dir) if row["valid"]}
    not_kept = [(m, p, e) for m in layers for p, e in enumerate(m.cache_events) if e["name"] + ".ktmoe" not in kept]
    kept_bytes = sum(os.path.getsize(os.path.join(args.dir, n)) for n in kept)
    print(f"packed {r.num_layers} layers ({r.packed_bytes / 2**20:.1f} MiB) in {time.perf_counter() - t0:.1f} s; "
          f"kept {len(events) - len(not_kept)} of {len(events)} cache files ({kept_bytes / 2**20:.1f} MiB) "
          f"in {args.dir}")
    for m, p, e in not_kept:
        arena = m.arena_stats()[p].get("fallback_reasons") or []
        why = "; ".join(dict.fromkeys(arena)) or e["reason"]
        print(f"pack: {e['name']} was not kept: {why}", file=sys.stderr)
    return 0 if events and not not_kept else 1
