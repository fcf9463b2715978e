"""Opening a checkpoint's files: the one way every reader of torch_ktmoe does it (shards, the index, config.json).

A checkpoint is a directory people receive. A FIFO named like one of its files would make a plain
``open()`` wait for a writer forever, so :func:`open_regular` opens ``O_NONBLOCK`` and refuses anything
but a regular file (``fstat``) with a ValueError naming it. Readers that take a path (safetensors'
``safe_open``) get the opened descriptor's (``/proc/self/fd/N``): the file checked is the file read, and its
errors name the file.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
from typing import Iterator

MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own bound on its JSON header


@contextlib.contextmanager
def open_regular(file) -> Iterator[tuple[int, os.stat_result]]:
    """``(fd, fstat)`` of ``file`` opened read-only, closed on exit; ValueError naming it unless it is a
    regular file (a FIFO, socket or device never blocks the open)."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"checkpoint file {file!r} is not a regular file")
        yield fd, st
    finally:
        os.close(fd)


def read_exactly(fd: int, offset: int, length: int, file) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise ValueError(f"checkpoint file {file!r} changed while it was read (short read at offset {offset})")
    return data


def read_json(file):
    """The JSON value of ``file`` (``config.json``, the shard index); ValueError naming it if it is not one."""
    with open_regular(file) as (fd, st):
        data = read_exactly(fd, 0, st.st_size, file)
    try:
        return json.loads(data)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"checkpoint file {file!r} is not valid JSON ({e})") from None


def safetensors_header(fd: int, size: int, file) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file; ValueError naming ``file`` if it has none."""
    if size < 8:
        raise ValueError(f"checkpoint file {file!r} is not a safetensors file ({size} bytes, no header)")
    prefix = read_exactly(fd, 0, 8, file)
    length = int.from_bytes(prefix, "little")
    if length > min(size - 8, MAX_HEADER_BYTES):
        raise ValueError(f"checkpoint file {file!r} is not a safetensors file (its header claims {length} bytes; "
                         f"the file has {size})")
    return prefix + read_exactly(fd, 8, length, file)


@contextlib.contextmanager
def open_safetensors(file):
    """safetensors' ``safe_open`` of ``file`` (torch, CPU), opened through :func:`open_regular`; the checked
    descriptor stays open while the handle is used (safetensors reads ``/proc/self/fd/N``, not the name)."""
    from safetensors import SafetensorError, safe_open

    with open_regular(file) as (fd, _):
        try:
            handle = safe_open(f"/proc/self/fd/{fd}", framework="pt", device="cpu")
        except SafetensorError as e:
            raise ValueError(f"checkpoint file {file!r} is not a safetensors file ({e})") from None
        with handle as h:
            yield h
