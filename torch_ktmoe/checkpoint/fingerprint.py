"""The fingerprint of a checkpoint directory: what the packed cache files of its experts are checked against.

``checkpoint_fingerprint(path, extra)`` hashes, for each ``*.safetensors`` and ``*.json`` file of
``path`` and each shard its ``model.safetensors.index.json`` names (``sub/x.safetensors`` too; a name
that leaves ``path`` is refused), sorted by name:

* its name, size and mtime (a rewritten shard changes them);
* a safetensors shard's whole JSON header (every tensor's name, dtype, shape and data offsets, and
  the file's metadata), so another layout, dtype or set of tensors is a different checkpoint (a GGUF
  file, hashed by :func:`files_fingerprint`: its first MiB, where its metadata and tensor table lie);
* a content sample: :data:`SAMPLES` blocks of :data:`SAMPLE_BYTES` at fixed, evenly spaced offsets
  of the file (a file up to :data:`WHOLE_FILE_BYTES`, e.g. ``config.json``, is hashed whole).

The sample is what catches a checkpoint swapped under the same names, sizes and mtimes (``rsync -a``,
``cp -p``, ``tar``, container layers): another model of the same shapes (a fine-tune, base against
instruct) differs in nearly every block, and most of a MoE shard's bytes are experts. It is a sample:
a change confined to bytes it does not read, with the names, sizes and mtimes put back, is not seen
(``cache="rebuild"`` packs again whatever the fingerprint says). Its cost is bounded per file, not
by the checkpoint's size: the header plus 64 reads of 4 KiB.

A process keeps the files' digest while their ``stat`` (device, inode, size, mtime, ctime) is
unchanged, so a host that asks once per layer reads them once: any write to a file, and ``os.utime``
itself, sets its ctime to the current time. Only files whose ctime is older than the hashing by
:data:`SETTLED_NS` are kept (as git treats "racy" index entries), so a change within one tick of the
file system's timestamps is not mistaken for no change.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time

from .files import open_regular, read_exactly, safetensors_header
from .safetensors_dir import index_shard_names

CHECKPOINT_SUFFIXES = (".safetensors", ".json")
SAMPLES = 64
SAMPLE_BYTES = 4096
WHOLE_FILE_BYTES = SAMPLES * SAMPLE_BYTES
GGUF_HEADER_BYTES = 1 << 20
SETTLED_NS = 2_000_000_000  # coarser than any file system's ctime (FAT: 2 s)
_MEMO_SIZE = 16
_memo: dict[tuple, bytes] = {}  # (path, the files' stat) -> digest of the files
_memo_lock = threading.Lock()  # hosts may load layers from several threads


def checkpoint_fingerprint(path, extra: str = "") -> str:
    """``blake2b`` of a checkpoint directory's files (names, sizes, mtimes, safetensors headers, content
    samples; see the module docstring) plus ``extra``."""
    path = os.fspath(path)
    names = sorted({n for n in os.listdir(path) if n.endswith(CHECKPOINT_SUFFIXES)} | set(index_shard_names(path)))
    return files_fingerprint([os.path.join(path, n) for n in names], names, extra)


def files_fingerprint(files: list[str], names: list[str], extra: str = "") -> str:
    """``blake2b`` of ``files`` (each hashed under its name in ``names``: name, size, mtime, a safetensors
    header or a GGUF file's first :data:`GGUF_HEADER_BYTES`, content samples) plus ``extra``."""
    stats = [os.stat(f) for f in files]
    key = (tuple(os.path.abspath(f) for f in files), tuple((n, *_identity(st)) for n, st in zip(names, stats)))
    with _memo_lock:
        digest = _memo.get(key)
    if digest is None:
        started = time.time_ns()
        h = hashlib.blake2b(digest_size=20)
        for file, name in zip(files, names):
            _hash_file(h, file, name)
        digest = h.digest()
        if all(st.st_ctime_ns < started - SETTLED_NS for st in stats):
            with _memo_lock:
                if len(_memo) >= _MEMO_SIZE:
                    _memo.pop(next(iter(_memo)))
                _memo[key] = digest
    h = hashlib.blake2b(digest, digest_size=20)
    h.update(b"|extra:" + extra.encode("utf-8", "surrogateescape"))
    return "checkpoint:content:blake2b:" + h.hexdigest()


def _identity(st: os.stat_result) -> tuple:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _hash_file(h, file: str, name: str) -> None:
    with open_regular(file) as (fd, st):
        h.update(b"|file:" + os.fsencode(name) + f":{st.st_size}:{st.st_mtime_ns}".encode())
        if name.endswith(".safetensors"):
            h.update(b"|header:" + safetensors_header(fd, st.st_size, file))
        elif name.endswith(".gguf"):  # its metadata and tensor table (types, shapes, offsets) lead the file
            h.update(b"|header:" + read_exactly(fd, 0, min(st.st_size, GGUF_HEADER_BYTES), file))
        h.update(b"|sample:")
        for offset, length in sample_ranges(st.st_size):
            h.update(read_exactly(fd, offset, length, file))


def sample_ranges(size: int) -> list[tuple[int, int]]:
    """(offset, length) of the sampled blocks of a file of ``size`` bytes: the whole file when small,
    else :data:`SAMPLES` blocks from the first to the last byte, evenly spaced."""
    if size <= WHOLE_FILE_BYTES:
        return [(0, size)] if size else []
    span = size - SAMPLE_BYTES
    return [(span * i // (SAMPLES - 1), SAMPLE_BYTES) for i in range(SAMPLES)]
