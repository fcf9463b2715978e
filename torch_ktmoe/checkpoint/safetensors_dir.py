"""A directory of safetensors shards, read one tensor (or one stacked row) at a time."""
from __future__ import annotations

import contextlib
import json
import os

import torch


class SafetensorsCheckpoint:
    """Key -> shard index over a directory of safetensors files, with lazily opened handles.

    The shards come from ``model.safetensors.index.json`` when it exists, else from every
    ``*.safetensors`` file of the directory. Use as a context manager or call :meth:`close`.
    """

    def __init__(self, path):
        from safetensors import safe_open

        self.path = os.fspath(path)
        self._safe_open = safe_open
        self._stack = contextlib.ExitStack()
        self._handles: dict[str, object] = {}
        index = os.path.join(self.path, "model.safetensors.index.json")
        if os.path.isfile(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
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

    def _open(self, file: str):
        h = self._handles.get(file)
        if h is None:
            h = self._stack.enter_context(self._safe_open(file, framework="pt", device="cpu"))
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
