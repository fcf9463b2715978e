"""A packed model directory: a self-contained checkpoint whose experts are already packed.

``save_packed(model, DIR)`` (``torch_ktmoe.hf.save_packed``) writes, for a model patched by
``torch_ktmoe.hf`` (``patch_model`` or ``from_pretrained``)::

    DIR/config.json, generation_config.json    transformers' own files
    DIR/model.safetensors (or shards)           the non-expert weights (save_pretrained)
    DIR/experts/layer{idx:04d}.part{p}.ktmoe    the packed experts: KTMoE cache files
    DIR/ktmoe_packed.json                       the manifest (below)

``torch_ktmoe.hf.from_pretrained(DIR)`` sees the manifest, lets transformers load the
non-expert weights and maps every experts layer read-only from ``DIR/experts`` through
``KTMoE.try_load_cached`` -- nothing is read from the original checkpoint and nothing is
packed, so the logits are bit-identical to the saved model's. A missing or invalid
expert file is an error that names it (the directory is not a cache to rebuild: the
dense weights are not in it).

Loading only reads: no lock file, no cleanup of temporary files, nothing created or deleted
in the directory (a packed directory is a model people receive, like a checkpoint). The
manifest (:mod:`.packed_manifest`) is the trust root: every field is checked, ``experts_dir``
is a plain name inside DIR, and every file must resolve inside DIR, or inside the hub repo
folder of a Hugging Face cache snapshot (whose files are symlinks into ``blobs/``).
A packed directory is an explicitly chosen model, so it is loaded with
``cache_trust_others=True``: a directory owned by another user (a root-owned ``/models``
served by a service user) loads; every file is still checked (``verify="header"`` by default:
file header, size and every expert's packed header) before it is mapped read-only.

``save_packed`` writes the whole directory into a new sibling directory and renames it into
place last (an existing packed DIR is swapped out atomically and removed), so a failure leaves
DIR as it was. The expert files are KTMoE's persistent cache files, written and validated through
KTMoE's public behaviour: a layer whose experts already live in valid cache files
(``mmap_experts_dir`` with ``cache="reuse"``/``"rebuild"``, mapped from or committed to a
kept file that the cache did not refuse, and each file valid for the layer's fingerprint)
has its files copied; any other layer is packed again from its unpacked experts into
``DIR/experts`` with ``cache="rebuild"`` and the result must equal the live packed bytes (always so for bf16;
int8 / int4 re-quantization of dequantized values is checked, and a mismatch raises).
A filesystem the cache cannot keep files on (tmpfs, ...) raises :class:`PackedDirError`
and leaves nothing behind.

Manifest ``ktmoe_packed.json``: ``{"format": "torch_ktmoe.packed_dir", "version": 1,
"experts_dir": "experts", "layers": [{"module", "layer_idx", "class_name", "num_experts",
"top_k", "hidden_size", "intermediate_size", "weight_format", "group_size", "numa_parts",
"dense_dtype", "fingerprint", "files"}]}``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
import warnings

import torch
import torch.nn as nn

from .._native import _C
from ..arena import WeightArena
from ..residency.experts_dir import layer_lock_names
from ..layer import KTMoE
from .experts import KTMoEExperts, dense_experts, unpacking_disabled
from .packed_manifest import (
    EXPERTS_DIR,
    FORMAT,
    MANIFEST,
    VERSION,
    PackedDirError,
    experts_path,
    is_packed_dir,
    read_manifest,
)
from .vocabulary import account

READ_ONLY_POLICY = "map"  # only reads: no lock file, no cleanup, nothing created or deleted

__all__ = ["MANIFEST", "PackedDirError", "is_packed_dir", "read_manifest", "save_packed", "packed_dir_layers",
           "map_packed_layers"]


def _is_valid_cache(ktm) -> bool:
    if not (ktm.mmap_experts_dir is not None and ktm.cache != "off" and ktm.cache_fingerprint is not None
            and ktm.arenas.kept
            and all(s["anon_bytes"] == 0 and s["file_backed_bytes"] > 0 for s in ktm.arena_stats())):
        return False
    for name in ktm.arenas.file_names():  # the files now on disk (replaced or planted since?) hold these experts
        info = _C.inspect_cache_file(os.path.join(ktm.mmap_experts_dir, name), False)
        if not info["valid"] or info.get("fingerprint") != ktm.cache_fingerprint:
            return False
    return True


def _write_layer_files(ktm, experts_dir: str, where: str) -> str:
    """Puts ``ktm``'s packed experts as cache files in ``experts_dir``; returns their fingerprint."""
    if _is_valid_cache(ktm):
        for name in ktm.arenas.file_names():  # checked again as copied (the source may have been replaced since)
            copy = os.path.join(experts_dir, name)
            shutil.copyfile(os.path.join(ktm.mmap_experts_dir, name), copy)
            info = _C.inspect_cache_file(copy, False)
            if not info["valid"] or info.get("fingerprint") != ktm.cache_fingerprint:
                raise PackedDirError(f"save_packed: {where}: the copy of {name} from {ktm.mmap_experts_dir} "
                                     f"is not the layer's cache file ({info['reason'] or 'another fingerprint'})")
        return ktm.cache_fingerprint
    fingerprint = f"torch_ktmoe.save_packed:{uuid.uuid4().hex}"
    gate_up, down = dense_experts(ktm) if ktm.weight_format == "bf16" else _quiet_dense(ktm)
    copy = KTMoE(ktm.num_experts, ktm.top_k, ktm.hidden_size, ktm.intermediate_size,
                 weight_format=ktm.weight_format, mmap_experts_dir=experts_dir, layer_idx=ktm.layer_idx,
                 numa_parts=ktm.numa_parts, group_size=ktm.group_size, cache="rebuild")
    copy.load_weights(gate_up, down, fingerprint=fingerprint)
    for (a13, a2), (b13, b2) in zip(ktm.packed_tensors(), copy.packed_tensors()):
        if not (torch.equal(a13, b13) and torch.equal(a2, b2)):
            raise PackedDirError(
                f"save_packed: {where}: repacking the dequantized {ktm.weight_format} experts does not give the "
                "same bytes; load the model with mmap_experts_dir= (cache files are then copied as they are)")
    if copy.file_backed_bytes != copy.packed_bytes or not copy.arenas.kept:
        why = copy.arenas.refusals()
        raise PackedDirError(f"save_packed: {where}: could not write the experts as files in {experts_dir} "
                             f"({why or copy.arena_stats()})")
    return fingerprint


def _quiet_dense(ktm):
    with warnings.catch_warnings():  # the dequantization warning is about checkpoints, not this repack
        warnings.simplefilter("ignore")
        return dense_experts(ktm)


def save_packed(model: nn.Module, directory, *, max_shard_size="5GB") -> dict:
    """Write ``model`` (patched by torch_ktmoe.hf) as a packed model directory; returns the manifest.

    Everything is written into a new sibling directory that then takes the place of ``directory``
    in one rename, so an existing packed directory there stays complete and loadable until the new
    one is (a failure leaves it as it was). ``directory`` must be new, empty or a packed directory.
    ``torch_ktmoe.hf.from_pretrained(directory)`` then loads it without the source checkpoint.
    """
    directory = os.path.abspath(os.fspath(directory))
    adapters = [(n, m) for n, m in model.named_modules() if isinstance(m, KTMoEExperts)]
    if not adapters:
        raise PackedDirError(f"save_packed: {type(model).__name__} has no KTMoE experts; patch it first "
                             "(torch_ktmoe.hf.patch_model / from_pretrained)")
    refused = getattr(getattr(model, "ktmoe_report", None), "refused", None)
    if refused:
        raise PackedDirError(f"save_packed: {len(refused)} experts block(s) were left dense "
                             f"({', '.join(r.class_name for r in refused)}); a packed directory holds every expert packed")
    for name, adapter in adapters:
        if adapter.ktmoe is None or not adapter.ktmoe.loaded:
            raise PackedDirError(f"save_packed: {name} has no loaded experts")
    _check_target(directory)
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    staging = os.path.join(os.path.dirname(directory), f".{os.path.basename(directory)}.saving.{uuid.uuid4().hex}")
    os.mkdir(staging, 0o755)  # ours, not writable by others: the cache trusts the experts directory in it
    try:
        manifest = _write_packed(model, adapters, staging, max_shard_size)
        _swap_into_place(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _check_target(directory: str) -> None:
    if os.path.islink(directory):
        raise PackedDirError(f"save_packed: {directory} is a symlink; give the directory it names")
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise PackedDirError(f"save_packed: {directory} exists and is not a directory")
    if os.path.isdir(directory) and os.listdir(directory) and not is_packed_dir(directory):
        raise PackedDirError(f"save_packed: {directory} is neither empty nor a packed model directory "
                             f"(no {MANIFEST}); nothing in it is replaced: choose a new or empty directory")


def _write_packed(model: nn.Module, adapters, directory: str, max_shard_size) -> dict:
    """The whole packed directory, written into the new (staging) ``directory``; the manifest last."""
    experts_dir = os.path.join(directory, EXPERTS_DIR)
    os.mkdir(experts_dir, 0o755)
    refusal = WeightArena(experts_dir, "save_packed", persistent=True).cache_refusal  # creates nothing
    if refusal:  # the experts could only go into unnamed files: a manifest would name files that do not exist
        raise PackedDirError(f"save_packed: {os.path.dirname(directory)} cannot hold the packed expert files "
                             f"({refusal})")
    layers = []
    for name, adapter in adapters:
        ktm = adapter.ktmoe
        fingerprint = _write_layer_files(ktm, experts_dir, name)
        layers.append(dict(module=name, layer_idx=ktm.layer_idx, class_name=adapter.replaced_class,
                           num_experts=ktm.num_experts, top_k=ktm.top_k, hidden_size=ktm.hidden_size,
                           intermediate_size=ktm.intermediate_size, weight_format=ktm.weight_format,
                           group_size=ktm.group_size, numa_parts=ktm.numa_parts,
                           dense_dtype=str(adapter.dense_dtype).removeprefix("torch."),
                           fingerprint=fingerprint, files=ktm.arenas.file_names()))
    for entry in layers:  # the build locks of the layers written above: a model ships none
        for name in layer_lock_names(entry["layer_idx"], entry["numa_parts"]):
            if os.path.lexists(os.path.join(experts_dir, name)):
                os.unlink(os.path.join(experts_dir, name))
    with unpacking_disabled():  # the non-expert weights only
        state_dict = model.state_dict()
    model.save_pretrained(directory, state_dict=state_dict, max_shard_size=max_shard_size)
    manifest = dict(format=FORMAT, version=VERSION, experts_dir=EXPERTS_DIR, layers=layers)
    with open(os.path.join(directory, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _swap_into_place(new: str, directory: str) -> None:
    """``new`` becomes ``directory``; an old ``directory`` (empty or packed) is removed after the swap."""
    if not os.path.lexists(directory):
        os.rename(new, directory)
        return
    if not _exchange(new, directory):  # no atomic exchange here: the old one is moved aside, then replaced
        os.rename(directory, new + ".old")
        os.rename(new, directory)
        new += ".old"
    shutil.rmtree(new)  # now the old directory


def _exchange(a: str, b: str) -> bool:
    """Swaps two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where that is not available."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, f"save_packed: cannot move {a} into place: {os.strerror(err)}", b)


def load_layer(entry: dict, path: str, experts_dir: str, ktmoe_kwargs: dict):
    """The KTMoE of one manifest entry, mapped read-only from its files in ``experts_dir`` (raises if one is bad)."""
    for key in ("weight_format", "mmap_experts_dir", "cache", "numa_parts", "group_size"):
        if key in ktmoe_kwargs:
            raise PackedDirError(f"from_pretrained({path}): a packed directory fixes {key}; do not pass it")
    # A packed directory is an explicitly chosen model, like a checkpoint: trust its owner (e.g. a
    # root-owned /models read by a service user); verify="header" still checks every file's headers.
    ktmoe_kwargs = dict(dict(cache_trust_others=True), **ktmoe_kwargs)
    ktm = KTMoE(entry["num_experts"], entry["top_k"], entry["hidden_size"], entry["intermediate_size"],
                weight_format=entry["weight_format"], layer_idx=entry["layer_idx"],
                mmap_experts_dir=experts_dir, numa_parts=entry["numa_parts"], group_size=entry["group_size"],
                cache=READ_ONLY_POLICY, **ktmoe_kwargs)
    if not ktm.try_load_cached(entry["fingerprint"]):
        reasons = "; ".join(f"{e['name']}: {e['reason']}" for e in ktm.cache_events if not e["hit"])
        raise PackedDirError(f"from_pretrained({path}): {entry['module']}: the packed expert files are missing or "
                             f"invalid ({reasons or 'not found'})")
    return ktm


def packed_dir_layers(path: str, **fixed) -> dict | None:
    """A packed model directory's layers by module name (None for a checkpoint). Such a directory
    fixes the options in ``fixed`` (weight_format, mmap_experts_dir, cache): giving one is an error.
    The manifest is checked, and its files confined to the directory, before anything is loaded."""
    if not is_packed_dir(path):
        return None
    given = [k for k, v in fixed.items() if v is not None]
    if given:
        raise PackedDirError(
            f"from_pretrained({path}): a packed model directory fixes {', '.join(given)} (see its {MANIFEST})"
        )
    manifest = read_manifest(path)
    experts_path(path, manifest)
    return {"manifest": manifest, "by_module": {e["module"]: e for e in manifest["layers"]}}


def map_packed_layers(path, manifest, by_module, entries, ktmoe_kwargs, report) -> None:
    """from_pretrained of a packed model directory: every experts layer mapped from its files."""
    missing = [b.name for b, *_ in entries if b.name not in by_module]
    if missing or len(entries) != len(by_module):
        raise PackedDirError(
            f"from_pretrained({path}): the model's experts blocks and {MANIFEST} disagree "
            f"(not in the manifest: {missing}; manifest: {sorted(by_module)})"
        )
    experts_dir = experts_path(path, manifest)
    for b, E, H, I, adapter in entries:
        entry = by_module[b.name]
        if (entry["num_experts"], entry["hidden_size"], entry["intermediate_size"], entry["top_k"]) != (E, H, I, adapter.top_k):
            raise PackedDirError(
                f"from_pretrained({path}): {b.name}: the config says E, H, I, top_k = {(E, H, I, adapter.top_k)}, "
                f"the manifest {(entry['num_experts'], entry['hidden_size'], entry['intermediate_size'], entry['top_k'])}"
            )
        ktm = load_layer(entry, path, experts_dir, {**adapter.layout.ktmoe_kwargs(), **ktmoe_kwargs})
        adapter.ktmoe = ktm
        adapter.layer_idx = ktm.layer_idx
        account(report, b, ktm, 0)
