"""The persistent packed cache: policies, source fingerprints, inspection.

A layer part's packed experts can be kept in ``<dir>/<name>.ktmoe`` (a 4 KiB
validated header, then 2 MiB-aligned slices; format in ``csrc/arena/cache_file.h``)
and mapped (copy on write: a write never reaches the file) by later processes instead
of being packed again.

Policies (``KTMoE(cache=...)``, ``patch_model``, ``from_pretrained``):

* ``"reuse"`` (default with a directory): map a valid file; a missing, truncated,
  foreign, stale or corrupt one is rebuilt (the reason is logged at INFO on the
  ``torch_ktmoe.cache`` logger and kept in ``KTMoE.cache_events``);
* ``"rebuild"``: always pack and replace the file;
* ``"off"``: an unnamed file that disappears with the process (nothing persists);
* ``"map"``: read-only, for a directory of packed files received as a model: map
  valid files only; no lock file, no cleanup, nothing is created, written or
  deleted; a missing or invalid file is a miss whose reason names the file
  (``KTMoE.try_load_cached`` is then False) and nothing is packed.

Verification (``KTMoE(verify=...)``): ``"header"`` (default, instant) checks the
file header, the file's size and every expert's packed header against the
layer; ``"full"`` also compares a checksum of every tensor's data (reads every
byte) and rebuilds on a mismatch.

Trust: no path is followed through a symlink, only regular files are opened
(a FIFO never blocks), and a cache file or directory owned by another user or
writable by others is refused (reason ``untrusted: ...``; the layer then uses an
unnamed file and keeps nothing) unless ``cache_trust_others=True``.

A build writes ``<name>.ktmoe.tmp.<pid>``, writes the header last, fsyncs and
renames it over the final name, then fsyncs the directory. Validate-or-build is
one C++ call per file (``WeightArena.load_or_build``, ``csrc/arena/cache_protocol.h``)
that runs under ``flock`` on ``<name>.ktmoe.lock`` (created 0600, refused when
another user owns it, replaced by a 0600 one when others can open it), so processes
starting together on one directory build each file once and never see a half-written
one. The lock is waited for at most ``KTMOE_CACHE_LOCK_WAIT`` seconds (default 5;
``inf``: as long as it is held; not a number >= 0: ValueError naming it): past that (another process, even a
stopped one, holds it) the layer packs into an unnamed file, keeps nothing, says
so in ``cache_events`` (``lock busy: ...``) and warns (``CacheLockWarning``).
"""
import hashlib
import os
from typing import Iterable, List

import torch

from ._native import _C
from .paths import utf8_path

CACHE_POLICIES = ("reuse", "rebuild", "off", "map")
VERIFY_LEVELS = ("header", "full")
CACHE_SUFFIX = _C.cache_suffix()  # file names are spelled in C++ (csrc/arena/cache_file.h)


def check_policy(cache: str) -> str:
    if cache not in CACHE_POLICIES:
        raise ValueError(f"cache must be one of {CACHE_POLICIES}, got {cache!r}")
    return cache


def check_verify(verify: str) -> str:
    if verify not in VERIFY_LEVELS:
        raise ValueError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")
    return verify


def tensors_fingerprint(tensors: Iterable[torch.Tensor]) -> str:
    """``blake2b`` of the tensors' bytes, shapes and dtypes (weights packed from memory)."""
    h = hashlib.blake2b(digest_size=20)
    for t in tensors:
        t = t.detach().contiguous()
        h.update(f"{tuple(t.shape)}:{t.dtype};".encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return "tensors:blake2b:" + h.hexdigest()


def layer_fingerprint(source: str, module_name: str) -> str:
    """``source|module_name``, hashed when longer than the header's 256 bytes."""
    fp = f"{source}|{module_name}"
    return fp if len(fp) <= 256 else "layer:blake2b:" + hashlib.blake2b(fp.encode(), digest_size=20).hexdigest()


def inspect_dir(directory: str, verify: bool = False) -> List[dict]:
    """One dict per ``*.ktmoe`` entry of ``directory``: header fields, size, resident bytes, valid/reason.

    Each file is checked as a load would check it against its own header's key
    (``verify=True``: data checksums too); a bad file gets its own reason and
    never stops the listing.
    """
    directory = utf8_path(directory, "cache directory")  # ValueError naming it: the native side takes UTF-8
    return [_inspect_file(directory, name, verify) for name in sorted(os.listdir(directory))
            if name.endswith(CACHE_SUFFIX)]


def _inspect_file(directory: str, name: str, verify: bool) -> dict:
    """:func:`inspect_dir`'s row of one file; a file it cannot inspect gets a one-line reason."""
    path = os.path.join(directory, name)
    try:
        info = dict(_C.inspect_cache_file(utf8_path(path, "cache file"), verify))
    except Exception as e:  # noqa: BLE001 - one file's failure is that file's reason (its first line)
        first_line = (str(e).splitlines() or [""])[0]
        info = {"path": path, "file_bytes": 0, "valid": False, "reason": f"unreadable: {type(e).__name__}: {first_line}",
                "resident_bytes": -1}
    info["name"] = name
    info["layer"], info["part"] = _C.parse_cache_arena_name(name) if name.isascii() else (None, None)
    return info


def leftover_temp_files(directory: str) -> List[str]:
    """Temporary build files (``*.ktmoe.tmp.<pid>``) in ``directory``."""
    return list(_C.cache_temp_files(utf8_path(directory, "cache directory")))
