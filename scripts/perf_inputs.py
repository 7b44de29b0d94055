"""Synthetic inputs for the benchmark: big split targets, their MTP draft, and an MTP head checkpoint.

Everything is generated once into a work folder and reused while its parameters do not change (a
``manifest.json`` per input records them). Targets are written at disk speed: the header comes from
gguf-mtp's own codec (:func:`gguf_mtp.format.header.serialize_header`) with the model KVs gguf-py's
:class:`gguf.GGUFWriter` writes for the tiny ``nemotron_h_moe`` models, and the tensor data is a
pseudo-random pool streamed over and over (quantized types hold random bytes; nothing loads them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from gguf_mtp.constants import KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT, split_file_name
from gguf_mtp.format.header import (
    KeyValue,
    TensorInfo,
    align_up,
    encode_kv,
    read_header,
    serialize_header,
    tensor_nbytes,
)
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint

# The tiny-model builders know the nemotron_h_moe block layout and its KV set; the benchmark reuses
# that knowledge rather than keeping a second copy (they are private because only fixtures need them).
from gguf_mtp.testing.tiny_models import (
    NEMOTRON_H_MOE,
    TinyHparams,
    block_tensors,
    matrix_type,
    tensor_role,
    write_draft,
)

__all__ = [
    "NEMOTRON_SUPER_PATTERN",
    "HeadSpec",
    "SyntheticTarget",
    "TargetSpec",
    "ensure_draft",
    "ensure_head",
    "ensure_target",
    "head_files",
    "parse_size",
    "size_label",
]

#: 88 blocks, 40 Mamba-2 + 40 latent-MoE + 8 attention, as in Nemotron 3 Super: with the three globals
#: this is 763 tensors, the tensor count of the real UD-Q4_K_XL target.
NEMOTRON_SUPER_PATTERN = "MEMEM*EMEME" * 8

#: Version of the generators: bump it to invalidate cached inputs when their layout changes.
GENERATOR_VERSION = 1
_ALIGNMENT = 32
_POOL_BYTES = 8 * 1024 * 1024
_MANIFEST = "manifest.json"


def parse_size(text: str) -> int:
    """``"3G"`` -> 3 GiB, ``"512M"``, ``"64K"``, ``"1.5G"``, or plain bytes.

    Raises:
        ValueError: not a size.
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    factor = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    value = int(float(number) * factor)
    if value <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return value


def size_label(nbytes: int) -> str:
    """``3221225472`` -> ``"3G"`` (the inverse of :func:`parse_size` for whole units)."""
    for suffix, factor in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= factor:
            value = nbytes / factor
            return f"{value:g}{suffix}" if value == int(value) else f"{value:.2f}{suffix}"
    return f"{nbytes}B"


# ------------------------------------------------------------------------------------------- targets


#: Experts per MoE block of the synthetic targets at most: Nemotron 3 Super's count.
MAX_BENCH_EXPERTS = 512


@dataclass(frozen=True)
class TargetSpec:
    """A synthetic ``nemotron_h_moe`` target of about ``size`` bytes in ``shards`` files.

    The size is reached by choosing the expert count (the MoE stacks dominate a real model too), so the
    tensor count stays that of ``pattern`` whatever the size; past Nemotron 3 Super's 512 experts the
    expert FFN widens instead (llama.cpp, and so ``convert``, loads at most 1024 experts).
    """

    size: int
    shards: int = 3
    pattern: str = NEMOTRON_SUPER_PATTERN
    base: TinyHparams = TinyHparams()  # noqa: RUF009  (frozen, so one shared default is safe)
    seed: int = 0

    @property
    def hparams(self) -> TinyHparams:
        hp = self.base
        while (n_expert := _experts_for_size(self.size, self.pattern, hp)) > MAX_BENCH_EXPERTS:
            hp = replace(hp, n_ff_exp=hp.n_ff_exp + 256)  # widths stay multiples of 256 (K-quants)
        return replace(hp, n_expert=n_expert)

    @property
    def name(self) -> str:
        hp = self.hparams  # in the name, so a cached target of other widths is never reused
        return f"target-{size_label(self.size)}-{self.shards}of-{len(self.pattern)}blk-{hp.n_expert}x{hp.n_ff_exp}"


@dataclass(frozen=True)
class SyntheticTarget:
    """A generated target: its files (shard order) and the hparams its draft must share."""

    spec: TargetSpec
    paths: tuple[Path, ...]
    hparams: TinyHparams

    @property
    def first(self) -> Path:
        return self.paths[0]

    @property
    def nbytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths)


def _tensor_table(pattern: str, hp: TinyHparams) -> list[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """Names, ggml shapes and types of a trunk-only target, in file order, as the tiny models have them."""
    entries = [("token_embd.weight", (hp.n_embd, hp.n_vocab), "matrix")]
    for bid, kind in enumerate(pattern):
        entries += block_tensors(NEMOTRON_H_MOE, kind, bid, hp)
    entries += [("output_norm.weight", (hp.n_embd,), "one"), ("output.weight", (hp.n_embd, hp.n_vocab), "matrix")]
    return [
        (name, shape, matrix_type(tensor_role(name), "mixed") if kind == "matrix" else GGMLQuantizationType.F32)
        for name, shape, kind in entries
    ]


def _data_bytes(pattern: str, hp: TinyHparams) -> int:
    return sum(align_up(tensor_nbytes(shape, qtype), _ALIGNMENT) for _, shape, qtype in _tensor_table(pattern, hp))


def _experts_for_size(size: int, pattern: str, hp: TinyHparams) -> int:
    if "E" not in pattern:
        raise ValueError(f"pattern {pattern!r} has no MoE block (E) to scale")
    one = _data_bytes(pattern, replace(hp, n_expert=1))
    per_expert = _data_bytes(pattern, replace(hp, n_expert=2)) - one
    smallest = _data_bytes(pattern, replace(hp, n_expert=hp.n_expert_used))
    if size < smallest:
        raise ValueError(
            f"{size_label(size)} is too small for a {len(pattern)}-block target (at least {size_label(smallest)})"
        )
    return max(hp.n_expert_used, 1 + round((size - one) / per_expert))


def _model_kvs(pattern: str, hp: TinyHparams, scratch: Path) -> list[KeyValue]:
    """The model KVs of a tiny nemotron_h_moe target (as gguf-py writes them), exact encodings."""
    path = scratch / "kvs.gguf"
    writer = GGUFWriter(path, NEMOTRON_H_MOE.arch)
    NEMOTRON_H_MOE.write_hparams(writer, hp, len(pattern), 0)
    for suffix, values in NEMOTRON_H_MOE.per_layer(pattern, hp).items():
        writer.add_array(f"{NEMOTRON_H_MOE.arch}.{suffix}", values)
    writer.add_file_type(GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    # Without tensors gguf-py leaves the header unpadded; pad it so the file is complete.
    with open(path, "ab") as f:
        f.write(b"\0" * (align_up(f.tell(), _ALIGNMENT) - f.tell()))
    return list(read_header(path).kvs.values())


def _split_kvs(number: int, count: int, total_tensors: int) -> list[KeyValue]:
    # Types as llama.cpp's gguf-split writes them.
    return [
        encode_kv(KEY_SPLIT_NO, GGUFValueType.UINT16, number),
        encode_kv(KEY_SPLIT_COUNT, GGUFValueType.UINT16, count),
        encode_kv(KEY_SPLIT_TENSORS_COUNT, GGUFValueType.INT32, total_tensors),
    ]


class _RandomStream:
    """Writes pseudo-random bytes fast: slices of one random pool, at a moving start."""

    def __init__(self, seed: int) -> None:
        pool = np.random.default_rng(seed).integers(0, 256, size=_POOL_BYTES, dtype=np.uint8).tobytes()
        self._doubled = memoryview(pool + pool)
        self._start = 0

    def write(self, fd: int, nbytes: int) -> None:
        while nbytes:
            n = min(nbytes, _POOL_BYTES)
            view = self._doubled[self._start : self._start + n]
            while view:
                view = view[os.write(fd, view) :]
            nbytes -= n
            # An odd step keeps equal-sized tensors from holding identical bytes.
            self._start = (self._start + n + 4099) % _POOL_BYTES


def _write_gguf(
    path: Path, kvs: Sequence[KeyValue], table: Sequence[tuple[str, tuple[int, ...], int]], stream: _RandomStream
) -> None:
    """One GGUF file: header, then every tensor back to back, each padded to the alignment."""
    tensors: list[TensorInfo] = []
    offset = 0
    for name, shape, qtype in table:
        nbytes = tensor_nbytes(shape, qtype)
        tensors.append(TensorInfo(name, tuple(shape), int(qtype), offset, nbytes))
        offset += align_up(nbytes, _ALIGNMENT)
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        head = memoryview(serialize_header(3, kvs, tensors, _ALIGNMENT))
        while head:
            head = head[os.write(fd, head) :]
        for tensor in tensors:
            stream.write(fd, tensor.nbytes)
            padding = align_up(tensor.nbytes, _ALIGNMENT) - tensor.nbytes
            if padding:
                os.write(fd, b"\0" * padding)
    finally:
        os.close(fd)
    os.replace(partial, path)


def _cached(folder: Path, params: dict, files: Sequence[Path]) -> bool:
    try:
        manifest = json.loads((folder / _MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("params") == params and all(p.is_file() for p in files)


def _record(folder: Path, params: dict) -> None:
    (folder / _MANIFEST).write_text(json.dumps({"params": params}, indent=2, default=str) + "\n")


def ensure_target(work_dir: Path, spec: TargetSpec, *, log: Callable[[str], None] = print) -> SyntheticTarget:
    """The target of ``spec`` under ``work_dir``: generated unless an identical one is cached.

    Returns:
        The target's files; a single file when ``spec.shards == 1``, else ``<name>-0000k-of-0000n.gguf``.
    """
    hp = spec.hparams
    folder = work_dir / spec.name
    count = spec.shards
    paths = (
        tuple(folder / split_file_name("bench", i, count) for i in range(1, count + 1))
        if count > 1
        else (folder / "bench.gguf",)
    )
    params = {"version": GENERATOR_VERSION, **asdict(spec), "n_expert": hp.n_expert}
    if _cached(folder, params, paths):
        return SyntheticTarget(spec, paths, hp)
    log(f"generating {folder} ({size_label(spec.size)}, {count} file(s), {hp.n_expert} experts per MoE block)")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    table = _tensor_table(spec.pattern, hp)
    with tempfile.TemporaryDirectory(dir=work_dir) as scratch:
        model_kvs = _model_kvs(spec.pattern, hp, Path(scratch))
    stream = _RandomStream(spec.seed)
    per_shard = -(-len(table) // count)
    for index, path in enumerate(paths):
        part = table[index * per_shard : (index + 1) * per_shard]
        # gguf-split layout: the model KVs live in shard 1; every shard carries the split keys.
        kvs = model_kvs if count == 1 else (model_kvs if index == 0 else []) + _split_kvs(index, count, len(table))
        _write_gguf(path, kvs, part, stream)
    _record(folder, params)
    return SyntheticTarget(spec, paths, hp)


def ensure_draft(work_dir: Path, hparams: TinyHparams, *, seed: int = 1, log: Callable[[str], None] = print) -> Path:
    """A BF16 ``blk.0`` MTP draft matching targets of ``hparams`` (what ``convert`` makes of a head)."""
    folder = work_dir / f"draft-e{hparams.n_expert}-d{hparams.n_embd}"
    path = folder / "draft.gguf"
    params = {"version": GENERATOR_VERSION, "hparams": asdict(hparams), "seed": seed}
    if _cached(folder, params, [path]):
        return path
    log(f"generating {path}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    partial = folder / "draft.partial.gguf"
    write_draft(partial, family=NEMOTRON_H_MOE, hparams=hparams, block=0, quant="BF16", seed=seed)
    os.replace(partial, path)
    _record(folder, params)
    return path


# ---------------------------------------------------------------------------------------------- head


@dataclass(frozen=True)
class HeadSpec:
    """A synthetic NVIDIA-style MTPv2 head checkpoint (BF16 safetensors, sharded, with an index).

    The defaults keep Nemotron 3 Super's widths (hidden 4096, 32/2 heads of 128, 512 experts per
    stack, MoE latent 1024, shared expert 5376) and scale it down only in length: each expert has
    ``expert_ff`` rows instead of 2688, so a stacked ``ffn_{up,down}_exps`` is still bigger than 1 GiB
    and a converter that materialised one could not stay under the memory target.
    """

    n_embd: int = 4096
    n_head: int = 32
    n_head_kv: int = 2
    head_dim: int = 128
    n_expert: int = 512
    n_expert_used: int = 22
    expert_ff: int = 1344
    shared_ff: int = 5376
    moe_latent: int = 1024
    files: int = 4
    trunk_pattern: str = "M*E"

    @property
    def hparams(self) -> TinyHparams:
        return replace(
            TinyHparams(), n_embd=self.n_embd, n_head=self.n_head, n_head_kv=self.n_head_kv, head_dim=self.head_dim,
            n_expert=self.n_expert, n_expert_used=self.n_expert_used, n_ff_exp=self.expert_ff,
            n_ff_shexp=self.shared_ff, moe_latent=self.moe_latent,
        )

    @property
    def has_real_widths(self) -> bool:
        """Whether every width is Nemotron 3 Super's (only the expert length may differ)."""
        real = HeadSpec()
        return all(getattr(self, f) == getattr(real, f) for f in ("n_embd", "n_head", "n_head_kv", "head_dim",
                                                                  "n_expert", "shared_ff", "moe_latent"))

    @property
    def block(self) -> int:
        """The NextN block index the converted draft gets (the trunk's block count)."""
        return len(self.trunk_pattern)


def head_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (what ``cp`` copies for the baseline)."""
    return sorted(folder.glob("*.safetensors"))


def ensure_head(work_dir: Path, spec: HeadSpec, *, log: Callable[[str], None] = print) -> Path:
    """The checkpoint folder of ``spec`` under ``work_dir``, written by
    :func:`gguf_mtp.testing.tiny_checkpoints.write_mtpv2_checkpoint` unless an identical one is cached."""
    folder = work_dir / f"head-e{spec.n_expert}-f{spec.expert_ff}-d{spec.n_embd}"
    params = {"version": GENERATOR_VERSION, **asdict(spec)}
    checkpoint = folder / "checkpoint"
    if _cached(folder, params, [checkpoint / "config.json"]) and head_files(checkpoint):
        return checkpoint
    log(f"generating {checkpoint} ({spec.n_expert} experts x {spec.expert_ff} x {spec.moe_latent}, BF16)")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    written = write_mtpv2_checkpoint(
        folder / "partial", hparams=spec.hparams, trunk_pattern=spec.trunk_pattern, files=spec.files, dtype="bfloat16"
    )
    os.replace(written, checkpoint)
    _record(folder, params)
    return checkpoint


def make_composite(folder: Path, target: SyntheticTarget, draft: Path, *, env: dict[str, str],
                   log: Callable[[str], None] = print) -> Path:
    """``target`` composed with ``draft`` into ``folder`` (emptied first) by this gguf-mtp, the input of the strip
    and graft cases; made afresh on every run, since its bytes are this gguf-mtp's. Returns its first file."""
    shutil.rmtree(folder, ignore_errors=True)
    log(f"composing the {size_label(target.spec.size)} target once, as the input of strip and graft")
    done = subprocess.run([sys.executable, "-m", "gguf_mtp", "compose", str(target.first), str(draft), "-o",
                           str(folder), "--quiet", "--no-verify"],
                          capture_output=True, text=True, check=False, env={**os.environ, **env})
    if done.returncode:
        raise RuntimeError(f"compose for the strip and graft inputs failed: {done.stderr.strip()}")
    return folder / target.first.name
