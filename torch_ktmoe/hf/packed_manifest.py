"""The manifest of a packed model directory, ``ktmoe_packed.json``: read, checked, and where its files are.

The manifest is the trust root of a packed directory: every field the loader uses is checked
(type and range) before anything is mapped, and a bad one is a :class:`PackedDirError` naming
the manifest file and the field. ``experts_dir`` is a plain name inside the directory (no
``/``, no ``..``, not absolute). Every file the loader reads (the manifest, the experts
directory, each expert file) must resolve inside the directory's root: the directory itself,
or, for a Hugging Face hub cache snapshot (``<repo>/snapshots/<rev>``, whose files are
symlinks to ``<repo>/blobs/<sha>``), the repo folder holding ``snapshots/`` and ``blobs/``.
A symlink leading anywhere else is refused.
"""

from __future__ import annotations

import os

from ..checkpoint.files import read_json
from ..residency.experts_dir import layer_file_names
from ..ops import WEIGHT_FORMATS

MANIFEST = "ktmoe_packed.json"
FORMAT = "torch_ktmoe.packed_dir"
VERSION = 1
EXPERTS_DIR = "experts"


class PackedDirError(RuntimeError):
    """A packed model directory that cannot be written or loaded (the message says why)."""


def is_packed_dir(path) -> bool:
    return os.path.isfile(os.path.join(os.fspath(path), MANIFEST))


def snapshot_root(path) -> str:
    """Where the files of packed directory ``path`` may resolve: the repo folder of a hub cache
    snapshot (``<repo>/snapshots/<rev>`` beside ``<repo>/blobs``), else the directory itself."""
    real = os.path.realpath(os.fspath(path))
    snapshots = os.path.dirname(real)
    repo = os.path.dirname(snapshots)
    if os.path.basename(snapshots) == "snapshots" and os.path.isdir(os.path.join(repo, "blobs")):
        return repo
    return real


def confined(path, relative: str, what: str) -> str:
    """``path/relative``, after checking that it resolves (through any symlink) inside ``snapshot_root(path)``."""
    full = os.path.join(os.fspath(path), relative)
    root = snapshot_root(path)
    real = os.path.realpath(full)
    if os.path.commonpath([root, real]) != root:
        raise PackedDirError(f"{full}: the {what} resolves to {real}, outside the packed directory's root {root} "
                             "(a packed directory's symlinks must stay inside it, or inside its hub repo folder)")
    return full


def check_experts_dir(value, where: str) -> str:
    """``value`` if it is a plain relative directory name, else a PackedDirError."""
    if not isinstance(value, str) or value in ("", ".", "..") or "/" in value or "\0" in value:
        raise PackedDirError(f"{where}: experts_dir must be a plain directory name inside the packed directory "
                             f"(no '/', not '..', not absolute), got {value!r}")
    return value


_LAYER_FIELDS = {  # field: (type, check, what the check says)
    "module": (str, bool, "a non-empty string"),
    "class_name": (str, lambda v: True, "a string"),
    "layer_idx": (int, lambda v: 0 <= v <= 9999, "an integer in 0..9999"),
    "num_experts": (int, lambda v: v > 0, "a positive integer"),
    "top_k": (int, lambda v: v > 0, "a positive integer"),
    "hidden_size": (int, lambda v: v > 0, "a positive integer"),
    "intermediate_size": (int, lambda v: v > 0, "a positive integer"),
    "weight_format": (str, lambda v: v in WEIGHT_FORMATS, f"one of {WEIGHT_FORMATS}"),
    "group_size": (int, lambda v: v >= 0, "a non-negative integer"),
    "numa_parts": (int, lambda v: 1 <= v <= 64, "an integer in 1..64"),
    "dense_dtype": (str, lambda v: True, "a string"),
    "fingerprint": (str, bool, "a non-empty string"),
    "files": (list, lambda v: True, "a list of file names"),
}


def _check_layer(entry, i: int, file: str) -> dict:
    if not isinstance(entry, dict):
        raise PackedDirError(f"{file}: layers[{i}] must be an object, got {type(entry).__name__}")
    for field, (kind, ok, says) in _LAYER_FIELDS.items():
        if field not in entry:
            raise PackedDirError(f"{file}: layers[{i}] has no field {field!r}")
        value = entry[field]
        if not isinstance(value, kind) or isinstance(value, bool) or not ok(value):
            raise PackedDirError(f"{file}: layers[{i}].{field} must be {says}, got {value!r}")
    want = layer_file_names(entry["layer_idx"], entry["numa_parts"])
    if entry["files"] != want:
        raise PackedDirError(f"{file}: layers[{i}].files must be {want} (layer_idx and numa_parts name them), "
                             f"got {entry['files']!r}")
    return entry


def read_manifest(path) -> dict:
    """The checked manifest of packed directory ``path`` (PackedDirError naming the file and field otherwise)."""
    file = confined(path, MANIFEST, "manifest")
    try:
        manifest = read_json(file)  # the checkpoint files' opener: a FIFO is refused, never waited on
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise PackedDirError(f"{file}: not a readable JSON manifest ({type(e).__name__}: {e})") from None
    if not isinstance(manifest, dict):
        raise PackedDirError(f"{file}: the manifest must be a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise PackedDirError(f"{file}: not a {FORMAT} version {VERSION} manifest "
                             f"(format={manifest.get('format')!r}, version={manifest.get('version')!r})")
    check_experts_dir(manifest.get("experts_dir"), file)
    layers = manifest.get("layers")
    if not isinstance(layers, list) or not layers:
        raise PackedDirError(f"{file}: layers must be a non-empty list, got {layers!r:.80}")
    seen_modules, seen_layers = set(), set()
    for i, entry in enumerate(layers):
        _check_layer(entry, i, file)
        for value, seen, field in ((entry["module"], seen_modules, "module"),
                                   (entry["layer_idx"], seen_layers, "layer_idx")):
            if value in seen:
                raise PackedDirError(f"{file}: layers[{i}].{field} {value!r} appears twice")
            seen.add(value)
    return manifest


def experts_path(path, manifest: dict) -> str:
    """The experts directory of a checked manifest, after checking that it and every expert file stay
    inside the packed directory's root (a symlink out of it is refused)."""
    experts_dir = confined(path, manifest["experts_dir"], "experts directory")
    for entry in manifest["layers"]:
        for name in entry["files"]:
            confined(path, os.path.join(manifest["experts_dir"], name), f"expert file of {entry['module']}")
    return experts_dir
