"""GGUF files: the header, the metadata and the tensor table, read strictly; the experts of each layer found.

A GGUF file (llama.cpp's format, version 2 or 3, little-endian) is::

    "GGUF", version u32, tensor count u64, metadata count u64,
    metadata: key (string), value type u32, value          -- string: length u64 + UTF-8 bytes
    tensor infos: name, n_dims u32, dims u64 x n_dims (innermost first), GGML type u32, offset u64
    padding to `general.alignment` (default 32), then the data section: each tensor at data start + offset

:func:`read_gguf` reads one file and checks everything a reader may later trust: every count against the bytes
that could hold it, every string as UTF-8, every type id against ggml's table (:data:`torch_ktmoe.ops.GGML_TYPES`),
every row as whole blocks, every tensor inside the file, aligned, and apart from the others. A file that fails is a
:class:`GGUFError` naming the file, the tensor or key, and what is wrong; nothing past the end is ever read.
:func:`open_gguf` reads a model: one file, or every part of a split ``name-0000k-of-0000n.gguf`` (each part carries
its own tensors; the metadata is the first part's). :func:`expert_layers` finds each layer's routed experts
(``blk.N.ffn_{gate,up,down}_exps.weight``) and checks their shapes against the metadata.

Shapes here are torch's (outermost first): a GGUF tensor of dims ``[H, I, E]`` is ``(E, I, H)``, its rows of
``H`` weights stored as ``H / block_elems`` blocks.
"""
from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from .. import ops
from ..gguf_experts import GGUFExperts
from .files import open_regular

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# Metadata value types: id -> (name, struct format of one scalar, or None for string / array).
_SCALARS = {0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"), 4: ("uint32", "<I"),
            5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<?"), 10: ("uint64", "<Q"), 11: ("int64", "<q"),
            12: ("float64", "<d")}
_STRING, _ARRAY = 8, 9
_SPLIT = re.compile(r"^(?P<stem>.*)-(?P<k>\d{5})-of-(?P<n>\d{5})\.gguf$")
EXPERT_ROLES = ("gate", "up", "down")


class GGUFError(ValueError):
    """A GGUF file that cannot be read as one: names the file and what is wrong."""


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: Tuple[int, ...]  # torch's order: outermost first (the file's dims reversed)
    ggml_type: int
    file: str
    offset: int             # absolute byte offset in `file`
    nbytes: int

    @property
    def type_name(self) -> str:
        return ops.GGML_TYPES[self.ggml_type]["name"]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (the innermost dimension's blocks)."""
        row = ops.GGML_TYPES[self.ggml_type]
        return self.shape[-1] // row["block_elems"] * row["block_bytes"]


@dataclass
class GGUFFile:
    path: str
    version: int
    metadata: Dict[str, object]
    tensors: Dict[str, GGUFTensor]
    alignment: int
    data_offset: int
    file_size: int


class _Cursor:
    """Reads the header of `path` from `buf`, every read bounded by the file's size."""

    def __init__(self, buf, path: str):
        self.buf, self.path, self.pos = buf, path, 0

    def fail(self, what: str):
        raise GGUFError(f"GGUF file {self.path!r}: {what}")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has {len(self.buf)}")
        data = self.buf[self.pos:self.pos + n]  # a copy: no buffer of the mapping outlives the read
        self.pos += n
        return data

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count of items that take at least `min_item_bytes` each: refused if they cannot fit in the file."""
        n = self.scalar("<Q", what)
        if n * min_item_bytes > len(self.buf) - self.pos:
            self.fail(f"{what} is {n}: more than the {len(self.buf) - self.pos} bytes left could hold")
        return n

    def string(self, what: str) -> str:
        n = self.count(f"the length of {what}", 1)
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} at offset {self.pos - n} is not UTF-8")

    def value(self, vtype: int, key: str, in_array: bool = False):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype][1], f"the value of {key!r}")
        if vtype == _STRING:
            return self.string(f"the value of {key!r}")
        if vtype == _ARRAY and not in_array:
            etype = self.scalar("<I", f"the array type of {key!r}")
            if etype in _SCALARS:
                fmt = _SCALARS[etype][1]
                n = self.count(f"the length of array {key!r}", struct.calcsize(fmt))
                return list(struct.unpack(f"<{n}{fmt[1]}", self.take(n * struct.calcsize(fmt), f"array {key!r}")))
            if etype == _STRING:
                n = self.count(f"the length of array {key!r}", 8)
                return [self.string(f"an element of array {key!r}") for _ in range(n)]
            self.fail(f"metadata {key!r}: array element type {etype} is not a GGUF scalar or string type")
        self.fail(f"metadata {key!r}: value type {vtype} is not a GGUF type"
                  + (" (arrays of arrays are not read)" if vtype == _ARRAY else ""))


def _read_tensor_info(cur: _Cursor):
    name = cur.string("a tensor name")
    n_dims = cur.scalar("<I", f"the dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        cur.fail(f"tensor {name!r} has {n_dims} dimensions; GGML tensors have 1 to {MAX_DIMS}")
    dims = [cur.scalar("<Q", f"the dimensions of tensor {name!r}") for _ in range(n_dims)]
    ggml_type = cur.scalar("<I", f"the type of tensor {name!r}")
    offset = cur.scalar("<Q", f"the offset of tensor {name!r}")
    return name, dims, ggml_type, offset


def _tensor(cur: _Cursor, info, data_offset: int, alignment: int) -> GGUFTensor:
    name, dims, ggml_type, offset = info
    row = ops.GGML_TYPES.get(ggml_type)
    if row is None:
        cur.fail(f"tensor {name!r} has type id {ggml_type}, which ggml does not define (a corrupt or newer file)")
    elements = 1
    for d in dims:
        elements *= d
    if elements >= 1 << 62 or any(d == 0 for d in dims):
        cur.fail(f"tensor {name!r} has dimensions {dims}: empty or too large")
    if dims[0] % row["block_elems"]:
        cur.fail(f"tensor {name!r} ({row['name']}) has rows of {dims[0]} weights, not whole blocks of "
                 f"{row['block_elems']}")
    nbytes = elements // row["block_elems"] * row["block_bytes"]
    if offset % alignment:
        cur.fail(f"tensor {name!r} starts at data offset {offset}, not a multiple of the alignment {alignment}")
    start = data_offset + offset
    if start + nbytes > len(cur.buf):
        cur.fail(f"tensor {name!r} ({row['name']}, {nbytes} bytes at offset {start}) runs past the end of the file "
                 f"({len(cur.buf)} bytes): truncated?")
    return GGUFTensor(name, tuple(reversed(dims)), ggml_type, cur.path, start, nbytes)


def read_gguf(path) -> GGUFFile:
    """The header, metadata and tensor table of one GGUF file, checked (:class:`GGUFError` naming what is wrong)."""
    path = os.fspath(path)
    with open_regular(path) as (fd, st):
        if st.st_size < 24:
            raise GGUFError(f"GGUF file {path!r}: truncated: {st.st_size} bytes, less than a GGUF header")
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Cursor(buf, path))


def _parse(cur: _Cursor) -> GGUFFile:
    magic = cur.take(4, "the magic")
    if magic != MAGIC:
        cur.fail(f"not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
    version = cur.scalar("<I", "the version")
    if version not in VERSIONS:
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        cur.fail("a big-endian GGUF file; torch_ktmoe reads little-endian ones" if swapped in VERSIONS else
                 f"GGUF version {version}; torch_ktmoe reads versions {', '.join(map(str, VERSIONS))}")
    n_tensors = cur.count("the tensor count", 8 + 4 + 8 + 4 + 8)  # the smallest tensor info
    n_kv = cur.count("the metadata count", 8 + 4 + 1)  # the smallest metadata entry
    metadata: Dict[str, object] = {}
    for _ in range(n_kv):
        key = cur.string("a metadata key")
        if key in metadata:
            cur.fail(f"metadata key {key!r} appears twice")
        metadata[key] = cur.value(cur.scalar("<I", f"the type of {key!r}"), key)
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        cur.fail(f"general.alignment is {alignment!r}, not a power of two")
    infos = [_read_tensor_info(cur) for _ in range(n_tensors)]
    data_offset = -(-cur.pos // alignment) * alignment
    if data_offset > len(cur.buf) and infos:
        cur.fail(f"truncated: the data section would start at {data_offset}, past the end ({len(cur.buf)} bytes)")
    tensors: Dict[str, GGUFTensor] = {}
    for info in infos:
        if info[0] in tensors:
            cur.fail(f"tensor {info[0]!r} appears twice")
        tensors[info[0]] = _tensor(cur, info, data_offset, alignment)
    spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in tensors.values())
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            cur.fail(f"tensors {a!r} and {b!r} overlap in the data section")
    return GGUFFile(cur.path, version, metadata, tensors, alignment, data_offset, len(cur.buf))


def split_paths(path) -> List[str]:
    """Every part of the split GGUF that `path` (any part) belongs to, in order; ``[path]`` for a single file.
    GGUFError when a part is missing."""
    path = os.fspath(path)
    m = _SPLIT.match(os.path.basename(path))
    if m is None:
        return [path]
    n = int(m["n"])
    directory = os.path.dirname(path)
    parts = [os.path.join(directory, f"{m['stem']}-{k:05d}-of-{n:05d}.gguf") for k in range(1, n + 1)]
    missing = [p for p in parts if not os.path.exists(p)]
    if n == 0 or missing:
        raise GGUFError(f"GGUF file {path!r} is part of a split of {n}, and "
                        + (f"{len(missing)} parts are missing, e.g. {missing[0]!r}" if missing else "n is 0"))
    return parts


@dataclass
class GGUFModel:
    """A model's GGUF: its files (one, or a split's parts), the first part's metadata, every part's tensors."""
    files: List[GGUFFile]
    metadata: Dict[str, object] = field(default_factory=dict)
    tensors: Dict[str, GGUFTensor] = field(default_factory=dict)
    _maps: Dict[str, mmap.mmap] = field(default_factory=dict, repr=False)
    _experts_fit: Optional[bool] = field(default=None, repr=False)

    def experts_fit_in_memory(self) -> bool:
        """Whether the model's routed experts fit in RAM (or the memory cgroup) beside this process's anonymous
        memory (:func:`torch_ktmoe.memory.file_room_bytes`), asked once: KTMoE's ``prefetch="auto"`` reads the
        routed experts ahead when they do not."""
        if self._experts_fit is None:
            from ..memory import file_room_bytes

            self._experts_fit = sum(layer.nbytes for layer in expert_layers(self)) <= file_room_bytes()
        return self._experts_fit

    def rows(self, t: GGUFTensor) -> torch.Tensor:
        """uint8 [*t.shape[:-1], row bytes]: tensor `t`'s bytes where they lie in its file, no copy.

        Each file is mapped once, whole, private and read-write (``MAP_PRIVATE``): the pages are the file's page
        cache, read on first touch and dropped by the kernel like any clean file page; a write through the tensor
        gets a private copy of its page instead of a crash or a change to the file. GGUFError when the file is
        now shorter than the tensor's end (changed since it was read)."""
        m = self._maps.get(t.file)
        if m is None:
            with open_regular(t.file) as (fd, st):
                if st.st_size < t.offset + t.nbytes:
                    raise GGUFError(f"GGUF file {t.file!r} is now {st.st_size} bytes, shorter than tensor {t.name!r} "
                                    f"(ends at {t.offset + t.nbytes}): it changed since it was read")
                m = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            self._maps[t.file] = m
        if len(m) < t.offset + t.nbytes:
            raise GGUFError(f"GGUF file {t.file!r} was mapped at {len(m)} bytes, shorter than tensor {t.name!r}")
        flat = torch.frombuffer(m, dtype=torch.uint8, count=t.nbytes, offset=t.offset)
        return flat.view(*t.shape[:-1], t.row_bytes)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"GGUF file {self.files[0].path!r} has no general.architecture")
        return arch

    def arch_value(self, key: str, default=None):
        """Metadata ``<architecture>.<key>`` (e.g. ``expert_count``), or ``default`` (also without an architecture)."""
        arch = self.metadata.get("general.architecture")
        return self.metadata.get(f"{arch}.{key}", default) if isinstance(arch, str) else default


def open_gguf(path) -> GGUFModel:
    """One GGUF model from `path` (a file, or any part of a split): every part read and checked, their tensors
    merged (a name in two parts is a GGUFError)."""
    files = [read_gguf(p) for p in split_paths(path)]
    model = GGUFModel(files, dict(files[0].metadata))
    for f in files:
        for name, t in f.tensors.items():
            if name in model.tensors:
                raise GGUFError(f"GGUF tensor {name!r} is in both {model.tensors[name].file!r} and {f.path!r}")
            model.tensors[name] = t
    return model


@dataclass(frozen=True)
class ExpertLayer:
    """One layer's routed experts: gate [E, I, H], up [E, I, H], down [E, H, I] as GGUF tensors (each its own
    GGML type)."""
    layer: int
    gate: GGUFTensor
    up: GGUFTensor
    down: GGUFTensor

    @property
    def shape(self) -> Tuple[int, int, int]:
        """(E, H, I)."""
        e, i, h = self.gate.shape
        return e, h, i

    @property
    def nbytes(self) -> int:
        return self.gate.nbytes + self.up.nbytes + self.down.nbytes

    @property
    def ggml_types(self) -> Tuple[int, int, int]:
        return self.gate.ggml_type, self.up.ggml_type, self.down.ggml_type


def layer_experts(model: GGUFModel, layer: ExpertLayer) -> GGUFExperts:
    """The layer's experts where they lie (:meth:`GGUFModel.rows`: mapped, no copy), for
    :meth:`torch_ktmoe.KTMoE.load_gguf`. ValueError when a role's type is one torch_ktmoe does not read."""
    files = sorted({os.path.basename(t.file) for t in (layer.gate, layer.up, layer.down)})
    return GGUFExperts.of(model.rows(layer.gate), model.rows(layer.up), model.rows(layer.down), layer.ggml_types,
                          ", ".join(files), mapped=True, fits=model.experts_fit_in_memory(), where=f"GGUF {files[0]!r} layer {layer.layer}")


_EXPERT_NAME = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")


def expert_layers(model: GGUFModel) -> List[ExpertLayer]:
    """Each layer's routed experts, by layer, checked: all three of gate, up and down, 3-D, the shapes
    ``[E, I, H]`` / ``[E, H, I]`` agreeing with each other and with the metadata's ``expert_count``,
    ``embedding_length`` and ``expert_feed_forward_length`` where it has them. GGUFError naming the tensor
    otherwise. ``[]`` for a model without routed experts."""
    found: Dict[int, Dict[str, GGUFTensor]] = {}
    for name, t in model.tensors.items():
        m = _EXPERT_NAME.match(name)
        if m:
            found.setdefault(int(m[1]), {})[m[2]] = t
    if not found:
        return []
    expected = {"E": model.arch_value("expert_count"), "H": model.arch_value("embedding_length"),
                "I": model.arch_value("expert_feed_forward_length")}
    layers = []
    for layer in sorted(found):
        parts = found[layer]
        missing = [r for r in EXPERT_ROLES if r not in parts]
        where = f"GGUF file {model.files[0].path!r}: layer {layer}"
        if missing:
            raise GGUFError(f"{where} has ffn_{'/'.join(parts)}_exps but no ffn_{missing[0]}_exps.weight")
        for role, t in parts.items():
            if len(t.shape) != 3:
                raise GGUFError(f"{where}: {t.name} has shape {list(t.shape)}; expert tensors are 3-D [E, rows, cols]")
        e, i, h = parts["gate"].shape
        want = {"gate": (e, i, h), "up": (e, i, h), "down": (e, h, i)}
        for role, t in parts.items():
            if t.shape != want[role]:
                raise GGUFError(f"{where}: {t.name} has shape {list(t.shape)}, expected {list(want[role])} from "
                                f"{parts['gate'].name} {list(parts['gate'].shape)} ([E, I, H])")
        for key, value in (("E", e), ("H", h), ("I", i)):
            meta = expected[key]
            if isinstance(meta, int) and not isinstance(meta, bool) and meta != value:
                name = {"E": "expert_count", "H": "embedding_length", "I": "expert_feed_forward_length"}[key]
                raise GGUFError(f"{where}: {parts['gate'].name} has {key} = {value}, but the metadata's "
                                f"{model.metadata['general.architecture']}.{name} is {meta}")
        layers.append(ExpertLayer(layer, parts["gate"], parts["up"], parts["down"]))
    return layers
