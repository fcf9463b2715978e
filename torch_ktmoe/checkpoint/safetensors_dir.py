"""A directory of safetensors shards, read one tensor (or one stacked row) at a time."""
from __future__ import annotations

import contextlib
import functools
import os

import torch

from .files import open_safetensors, read_json
from .int4_config import config_group_sizes

INDEX = "model.safetensors.index.json"


def index_weight_map(path: str):
    """key -> shard name (relative to ``path``) of ``path``'s index, None without one; ValueError naming the
    index for a malformed ``weight_map`` or a shard name that leaves the directory (absolute, ``..``)."""
    index = os.path.join(path, INDEX)
    if not os.path.lexists(index):
        return None
    weight_map = read_json(index)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: no weight_map object (the key -> shard file map of a sharded checkpoint)")
    for key, name in weight_map.items():
        if not isinstance(name, str) or not _inside(name):
            raise ValueError(f"{index}: weight_map[{key!r}] = {name!r} is not a file inside the checkpoint directory "
                             f"{path!r} (shards are named relative to it, without '..')")
    return weight_map


def _inside(name: str) -> bool:
    """``name``, as written, names a file inside the directory: not empty, relative, no ``..`` out of it."""
    return (bool(name) and "\0" not in name and not os.path.isabs(name)
            and os.path.normpath(name).split(os.sep)[0] not in ("..", "."))


def index_shard_names(path: str) -> list[str]:
    """The shard files ``path``'s index names (relative to ``path``, sorted); [] without an index."""
    return sorted(set((index_weight_map(path) or {}).values()))


class SafetensorsCheckpoint:
    """Key -> shard index over a directory of safetensors files, with lazily opened handles.

    The shards come from ``model.safetensors.index.json`` when it exists (each inside the directory,
    :func:`index_weight_map`), else from every ``*.safetensors`` file of the directory. Every file is
    opened through :func:`~.files.open_regular` (a FIFO is a ValueError naming it, never a hang). Use as a
    context manager or call :meth:`close`.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, object] = {}
        weight_map = index_weight_map(self.path)
        if weight_map is not None:
            self.key_to_file = {k: os.path.join(self.path, v) for k, v in weight_map.items()}
        else:
            files = sorted(f for f in os.listdir(self.path) if f.endswith(".safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors file in {self.path}")
            self.key_to_file = {}
            for fn in files:
                full = os.path.join(self.path, fn)
                for k in self._open(full).keys():
                    self.key_to_file[k] = full

    @functools.cached_property
    def quantization_config(self) -> dict:
        """The quantization_config of the directory's ``config.json`` ({} without either)."""
        config = os.path.join(self.path, "config.json")
        qc = read_json(config) if os.path.lexists(config) else None
        qc = qc.get("quantization_config") if isinstance(qc, dict) else None
        return qc if isinstance(qc, dict) else {}

    @functools.cached_property
    def int4_group_sizes(self) -> tuple[int, ...]:
        """The int4 group sizes the quantization_config names (:func:`~.int4_config.config_group_sizes`)."""
        return config_group_sizes(self.quantization_config, os.path.join(self.path, "config.json"))

    def _open(self, file: str):
        h = self._handles.get(file)
        if h is None:
            h = self._stack.enter_context(open_safetensors(file))
            self._handles[file] = h
        return h

    def __contains__(self, key: str) -> bool:
        return key in self.key_to_file

    def get(self, key: str) -> torch.Tensor:
        return self._open(self.key_to_file[key]).get_tensor(key)

    def get_row(self, key: str, i: int) -> torch.Tensor:
        """``tensor[i]`` of a stacked tensor, reading only that slice."""
        return self._open(self.key_to_file[key]).get_slice(key)[i]

    def dtype(self, key: str) -> str:
        """safetensors' name of ``key``'s dtype: ``"BF16"``, ``"F32"``, ``"F8_E4M3"``, ``"I32"``..."""
        return self._open(self.key_to_file[key]).get_slice(key).get_dtype()

    def keys_under(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted."""
        return sorted(k for k in self.key_to_file if k.startswith(prefix))

    def shape(self, key: str) -> list[int]:
        return list(self._open(self.key_to_file[key]).get_slice(key).get_shape())

    def expect_shape(self, key: str, want) -> None:
        """ValueError naming ``key`` unless its shape is ``want``."""
        got = self.shape(key)
        if got != list(want):
            raise ValueError(f"{key}: shape {got} in {self.path}, expected {list(want)}")

    def expect_rows(self, key: str, rows) -> None:
        """ValueError unless every index in ``rows`` is a row of the stacked tensor ``key``."""
        n = self.shape(key)[0]
        bad = [i for i in rows if not 0 <= i < n]
        if bad:
            raise ValueError(f"expert {bad[0]} is not in {key} ({n} experts) in {self.path}")

    def close(self) -> None:
        self._stack.close()
        self._handles.clear()

    def __enter__(self) -> "SafetensorsCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
