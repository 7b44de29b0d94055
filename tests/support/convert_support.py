"""Support for the convert tests: an independent look at safetensors files, a Hub cache laid out by hand,
and a crafted-file writer for malformed checkpoints.

The reader here is deliberately naive (plain ``json`` and byte slicing, no gguf_mtp code), so the
tests compare the converter's output against the checkpoint as the format defines it.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

#: How ggml stores the safetensors dtypes that pass through unchanged.
NUMPY = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}


def safetensors_header(path: Path) -> tuple[int, dict[str, Any]]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return 8 + n, json.loads(f.read(n))


def weight_map(folder: Path) -> dict[str, str]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return json.loads(index.read_text())["weight_map"]
    _, header = safetensors_header(folder / "model.safetensors")
    return {name: "model.safetensors" for name in header if name != "__metadata__"}


def raw_tensor(folder: Path, name: str) -> tuple[str, tuple[int, ...], bytes]:
    """(dtype, shape, raw bytes) of checkpoint tensor ``name``."""
    path = folder / weight_map(folder)[name]
    start, header = safetensors_header(path)
    entry = header[name]
    begin, end = entry["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + begin)
        return entry["dtype"], tuple(entry["shape"]), f.read(end - begin)


def checkpoint_bytes(folder: Path, name: str) -> bytes:
    """The raw bytes of checkpoint tensor ``name``, found by reading every ``*.safetensors`` header in ``folder``
    (no index needed: a checkpoint whose MTP file the index does not name works too)."""
    for path in sorted(folder.glob("*.safetensors")):
        start, header = safetensors_header(path)
        if name in header:
            begin, end = header[name]["data_offsets"]
            with open(path, "rb") as f:
                f.seek(start + begin)
                return f.read(end - begin)
    raise KeyError(name)


def widened_bf16(raw: bytes) -> bytes:
    """BF16 bytes as the F32 bytes of the same values (what a converter writing norms as F32 makes of them)."""
    return ((np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)).tobytes()


def tensor_array(folder: Path, name: str) -> np.ndarray:
    """A checkpoint tensor as numpy (BF16 as its uint16 bits), row-major shape."""
    dtype, shape, raw = raw_tensor(folder, name)
    return np.frombuffer(raw, dtype=NUMPY[dtype]).reshape(shape)


def as_f32(folder: Path, name: str) -> np.ndarray:
    dtype, _, _ = raw_tensor(folder, name)
    values = tensor_array(folder, name)
    if dtype == "BF16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


def read_raw_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of safetensors file ``path`` as name -> (dtype, shape, raw bytes), in the file's order: what
    :func:`write_raw_safetensors` takes, to write the file again with some tensors changed."""
    start, header = safetensors_header(path)
    header.pop("__metadata__", None)
    entries: dict[str, tuple[str, list[int], bytes]] = {}
    with open(path, "rb") as f:
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            begin, end = entry["data_offsets"]
            f.seek(start + begin)
            entries[name] = (entry["dtype"], entry["shape"], f.read(end - begin))
    return entries


def write_raw_safetensors(path: Path, entries: dict[str, tuple[str, list[int], bytes]], *,
                          header_override: bytes | None = None) -> None:
    """A safetensors file from raw parts (for crafting malformed or exotic files)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape, data) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = header_override if header_override is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, data in entries.values():
            f.write(data)


def rewrite_checkpoint_tensor(folder: Path, name: str, *, new_name: str | None = None, dtype: str | None = None,
                              shape: list[int] | None = None, data: bytes | None = None,
                              drop: bool = False, add: dict[str, tuple[str, list[int], bytes]] | None = None) -> None:
    """Rewrite the safetensors file holding ``name`` with that tensor renamed, retyped, reshaped or dropped,
    and the tensors ``add`` added next to it (the index follows)."""
    index_path = folder / "model.safetensors.index.json"
    file_name = weight_map(folder)[name]
    path = folder / file_name
    entries = read_raw_safetensors(path)
    old = entries.pop(name)
    if not drop:
        entries[new_name or name] = (dtype or old[0], shape if shape is not None else old[1],
                                     data if data is not None else old[2])
    entries.update(add or {})
    write_raw_safetensors(path, entries)
    if index_path.exists():
        index = json.loads(index_path.read_text())
        del index["weight_map"][name]
        if not drop:
            index["weight_map"][new_name or name] = file_name
        index["weight_map"].update({added: file_name for added in add or {}})
        index_path.write_text(json.dumps(index))


def fill_hub_cache(cache: Path, repo_id: str, folder: Path, *, leave_out: tuple[str, ...] = (),
                   commit: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """Lay ``folder``'s files out as huggingface_hub's cache holds a repo (blobs, a snapshot of links,
    ``refs/main`` and the tree listing of every file), leaving the files ``leave_out`` un-downloaded.
    Returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    tree: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        sha256 = hashlib.sha256(data).hexdigest()
        blob_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        lfs = path.suffix == ".safetensors"
        entry: dict[str, Any] = {"size": len(data), "blob_id": blob_id}
        if lfs:
            entry.update(lfs_sha256=sha256, lfs_size=len(data))
        tree[path.name] = entry
        if path.name in leave_out:
            continue
        blob = repo / "blobs" / (sha256 if lfs else blob_id)
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / path.name)
    (repo / "trees").mkdir(exist_ok=True)
    (repo / "trees" / f"{commit}.json").write_text(json.dumps({"format_version": 1, "files": tree}))
    return snapshot
