"""A corpus of malformed inputs, built in the tests from tiny but real models.

Every entry is a named builder with a one-line description of what is broken, the kind of input it
breaks (a GGUF file, a split set, a target's metadata, a draft, a checkpoint), the phrase the error
must contain, and the file the error must name. Builders copy the valid :class:`Sources` into a
work folder and break the copy (sources are never modified); each returns the command line that
feeds the broken input to gguf-mtp.

GGUF-level damage is done on the bytes (magic, counts, lengths, type tags, tensor table fields),
using the positions our header codec reports; structural damage (duplicate keys, missing keys,
renamed tensors) re-serialises the header with :func:`gguf_mtp.format.header.serialize_header` and
keeps the data section as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from gguf import GGUFValueType

from gguf_mtp.format.header import (
    GGUFArray,
    GGUFHeader,
    KeyValue,
    TensorInfo,
    encode_kv,
    read_header,
    serialize_header,
)
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import GLM4MOE, with_hparams, write_draft, write_target

__all__ = ["CORPUS", "Inputs", "Malformed", "Sources", "build_sources"]

#: Small dimensions (multiples of 256 where K-quants apply) keep every copy of the corpus cheap.
SMALL = with_hparams(n_embd=256, n_vocab=256, n_head=4, n_expert=4, n_ff_shexp=256, n_ff_dense=256, ssm_heads=4)
ARCH = "nemotron_h_moe"
TRUNK = "M*E"  # three trunk blocks: the NextN block is blk.3


@dataclass(frozen=True)
class Sources:
    """Valid inputs every builder starts from (read-only: builders break copies)."""

    target: Path  # one file, blocks M * E, alignment 32
    split: Path  # shard 1 of a 3-shard split of the same model
    other_split: Path  # shard 1 of a 3-shard model with another layout (M*EE)
    draft0: Path  # blk.0 draft carrying token_embd / output_norm / output
    draftN: Path  # blk.3 draft, no globals
    glm_draft: Path  # a draft for glm4moe
    wide_draft: Path  # a draft with n_embd 512
    big_vocab_draft: Path  # a draft with 512 tokens
    nextn_target: Path  # the target with its NextN block already in place (blocks M * E +)
    checkpoint: Path  # an NVIDIA-style MTPv2 head checkpoint folder matching the target


def build_sources(folder: Path) -> Sources:
    """Write the valid inputs of the corpus into ``folder`` (about 12 MB in all)."""
    hp = SMALL
    return Sources(
        target=write_target(folder / "single", hparams=hp, pattern=TRUNK, name="tiny"),
        split=write_target(folder / "split", hparams=hp, pattern=TRUNK, shards=3, name="Tiny-Q4"),
        other_split=write_target(folder / "other", hparams=hp, pattern=TRUNK + "E", shards=3, name="Tiny-Q4"),
        draft0=write_draft(folder / "drafts" / "mtp-blk0.gguf", hparams=hp, trunk_pattern=TRUNK, with_globals=True),
        draftN=write_draft(folder / "drafts" / "mtp-blk3.gguf", hparams=hp, trunk_pattern=TRUNK, block="N"),
        glm_draft=write_draft(folder / "drafts" / "glm-mtp.gguf", family=GLM4MOE, hparams=hp),
        wide_draft=write_draft(folder / "drafts" / "wide-mtp.gguf", hparams=with_hparams(n_vocab=256)),
        big_vocab_draft=write_draft(folder / "drafts" / "vocab-mtp.gguf", hparams=replace(hp, n_vocab=512)),
        nextn_target=write_target(folder / "nextn", hparams=hp, pattern=TRUNK, with_nextn=True, name="tiny-mtp"),
        checkpoint=write_mtpv2_checkpoint(folder / "checkpoint", hparams=hp, trunk_pattern=TRUNK),
    )


@dataclass(frozen=True)
class Inputs:
    """A broken input ready to run: the gguf-mtp arguments (before ``-o OUT``) and the file to blame."""

    argv: tuple[str, ...]
    blamed: Path  # the error line must name this file (its name, at least)

    def command(self, out: Path) -> list[str]:
        """The full command line, writing into ``out`` (a folder for compose, a file path for convert)."""
        destination = out / "draft.gguf" if self.argv[0] == "convert" else out
        return [*self.argv, "-o", str(destination)]


def compose_args(target: Path, draft: Path, blamed: Path) -> Inputs:
    return Inputs(("compose", str(target), str(draft)), blamed)


@dataclass(frozen=True)
class Malformed:
    """One entry of the corpus."""

    name: str
    kind: str  # "gguf" (the file's bytes), "path", "split set", "target" (metadata), "draft", "checkpoint"
    broken: str  # what is wrong, in one line
    expect: str  # a phrase the error line must contain
    build: Callable[[Sources, Path], Inputs] = field(repr=False)

    def __str__(self) -> str:
        return self.name


CORPUS: list[Malformed] = []


def malformed(kind: str, broken: str, expect: str) -> Callable[[Callable[[Sources, Path], Inputs]], Callable]:
    """Register a builder in :data:`CORPUS`."""

    def register(build: Callable[[Sources, Path], Inputs]) -> Callable[[Sources, Path], Inputs]:
        CORPUS.append(Malformed(build.__name__, kind, broken, expect, build))
        return build

    return register


# ------------------------------------------------------------------------------------------ byte tools


@dataclass(frozen=True)
class Layout:
    """Where each field of a GGUF header lies in its file (from our codec's view of a valid file)."""

    header: GGUFHeader
    kv_start: dict[str, int]
    tensor_start: dict[str, int]

    def value_at(self, key: str) -> int:
        """Absolute offset of ``key``'s value (after its type tag)."""
        return self.kv_start[key] + self.header.kvs[key].value_offset

    def type_tag_at(self, key: str) -> int:
        return self.value_at(key) - 4

    def tensor_field_at(self, name: str, what: str) -> int:
        """Absolute offset of one field (``n_dims``, ``dims``, ``type``, ``offset``) of a tensor entry."""
        info = self.header.tensor_by_name[name]
        n_dims_at = self.tensor_start[name] + 8 + len(name.encode())
        return {
            "n_dims": n_dims_at,
            "dims": n_dims_at + 4,
            "type": n_dims_at + 4 + 8 * len(info.shape),
            "offset": n_dims_at + 8 + 8 * len(info.shape),
        }[what]


def layout(path: Path) -> Layout:
    header = read_header(path)
    kv_start: dict[str, int] = {}
    position = 24
    for key, kv in header.kvs.items():
        kv_start[key] = position
        position += len(kv.raw)
    tensor_start: dict[str, int] = {}
    for info in header.tensors:
        tensor_start[info.name] = position
        position += 8 + len(info.name.encode()) + 4 + 8 * len(info.shape) + 4 + 8
    assert position == header.header_size
    return Layout(header, kv_start, tensor_start)


def copy(source: Path, work: Path, name: str | None = None) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    destination = work / (name or source.name)
    shutil.copyfile(source, destination)
    return destination


def copy_split(first: Path, work: Path) -> list[Path]:
    """Copy every shard of the split set ``first`` belongs to; returns the copies in shard order."""
    prefix = first.name.split("-00001-of-")[0]
    shards = sorted(first.parent.glob(f"{prefix}-0000?-of-0000?.gguf"))
    return [copy(shard, work) for shard in shards]


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def truncate(path: Path, size: int) -> None:
    os.truncate(path, size)


def rewrite(
    source: Path,
    destination: Path,
    *,
    kvs: Sequence[KeyValue] | None = None,
    tensors: Sequence[TensorInfo] | None = None,
) -> Path:
    """Copy a GGUF file with another KV list and/or tensor table (the data section is kept as is)."""
    header = read_header(source)
    destination.parent.mkdir(parents=True, exist_ok=True)
    head = serialize_header(
        header.version,
        header.kvs.values() if kvs is None else kvs,
        header.tensors if tensors is None else tensors,
        header.alignment,
    )
    with open(source, "rb") as fin, open(destination, "wb") as fout:
        fout.write(head)
        fin.seek(header.data_offset)
        shutil.copyfileobj(fin, fout)
    return destination


def edit_kvs(
    source: Path,
    destination: Path,
    *,
    set_: Iterable[KeyValue] = (),
    drop: Iterable[str] = (),
) -> Path:
    """Copy a GGUF file with KVs replaced in place or appended (``set_``) and some removed (``drop``)."""
    header = read_header(source)
    new = {kv.key: kv for kv in set_}
    dropped = set(drop)
    kvs = [new.pop(key, kv) for key, kv in header.kvs.items() if key not in dropped]
    return rewrite(source, destination, kvs=[*kvs, *new.values()])


def rename_tensors(source: Path, destination: Path, rename: Callable[[str], str | None]) -> Path:
    """Copy a GGUF file with tensors renamed (``rename`` returning ``None`` leaves the entry out)."""
    header = read_header(source)
    tensors = []
    for info in header.tensors:
        name = rename(info.name)
        if name is not None:
            tensors.append(TensorInfo(name, info.shape, info.ggml_type, info.offset, info.nbytes))
    return rewrite(source, destination, tensors=tensors)


def arch_key(suffix: str) -> str:
    return f"{ARCH}.{suffix}"


U32, I32, I64, F32, STR, ARR = (
    GGUFValueType.UINT32,
    GGUFValueType.INT32,
    GGUFValueType.INT64,
    GGUFValueType.FLOAT32,
    GGUFValueType.STRING,
    GGUFValueType.ARRAY,
)


def _broken_target(src: Sources, work: Path) -> tuple[Path, Layout]:
    target = copy(src.target, work)
    return target, layout(target)


def _target_case(target: Path, src: Sources) -> Inputs:
    return compose_args(target, src.draft0, target)


# ------------------------------------------------------------------------------------ GGUF file level


@malformed("gguf", "the first four bytes are b'GGML', not b'GGUF'", "not a GGUF file")
def wrong_magic(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    patch(target, 0, b"GGML")
    return _target_case(target, src)


@malformed("gguf", "GGUF version 1 (u32 counts, unsupported)", "GGUF version 1 is not supported")
def version_1(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    patch(target, 4, u32(1))
    return _target_case(target, src)


@malformed("gguf", "the version field is big-endian (a big-endian GGUF)", "big-endian GGUF files are not supported")
def big_endian(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    patch(target, 4, struct.pack(">I", 3))
    return _target_case(target, src)


@malformed("gguf", "an empty file", "truncated in the file header")
def empty_file(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    truncate(target, 0)
    return _target_case(target, src)


@malformed("gguf", "a 6-byte text file (shorter than a GGUF header, other bytes than the magic)", "not a GGUF file")
def short_text_file(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    target.write_bytes(b"hello\n")
    return _target_case(target, src)


@malformed("gguf", "the file ends inside the fixed header (16 of its 24 bytes)", "truncated in the file header")
def truncated_in_header(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    truncate(target, 16)
    return _target_case(target, src)


@malformed("gguf", "the file ends in the middle of the last KV's value", "truncated in the KV table")
def truncated_in_kv_table(src: Sources, work: Path) -> Inputs:
    target, where = _broken_target(src, work)
    truncate(target, where.value_at("general.file_type") + 2)
    return _target_case(target, src)


@malformed("gguf", "the file ends in the middle of a tensor's dimensions", "truncated in the tensor table")
def truncated_in_tensor_table(src: Sources, work: Path) -> Inputs:
    target, where = _broken_target(src, work)
    truncate(target, where.tensor_field_at(where.header.tensors[3].name, "dims") + 3)
    return _target_case(target, src)


@malformed("gguf", "the file ends in the padding between the tensor table and the data", "truncated before the data")
def truncated_before_data(src: Sources, work: Path) -> Inputs:
    target, where = _broken_target(src, work)
    assert where.header.data_offset > where.header.header_size + 1
    truncate(target, where.header.header_size + 1)
    return _target_case(target, src)


@malformed("gguf", "the last 1000 bytes of tensor data are missing", "runs past the end of the file")
def truncated_in_data(src: Sources, work: Path) -> Inputs:
    target, where = _broken_target(src, work)
    truncate(target, where.header.file_size - 1000)
    return _target_case(target, src)


@malformed("gguf", "kv_count is 2**62", "kv_count 4,611,686,018,427,387,904 cannot fit")
def kv_count_absurd(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    patch(target, 16, u64(2**62))
    return _target_case(target, src)


@malformed("gguf", "tensor_count is 2**64 - 1", "tensor_count 18,446,744,073,709,551,615 cannot fit")
def tensor_count_absurd(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    patch(target, 8, u64(2**64 - 1))
    return _target_case(target, src)


@malformed("gguf", "the first key's length is 2**40", "string length 1,099,511,627,776 runs past the end")
def key_length_past_end(src: Sources, work: Path) -> Inputs:
    target, _ = _broken_target(src, work)
    patch(target, 24, u64(2**40))
    return _target_case(target, src)


@malformed("gguf", "general.name's string length runs past the end of the file", "'general.name': string length")
def string_value_past_end(src: Sources, work: Path) -> Inputs:
    target, where = _broken_target(src, work)
    patch(target, where.value_at("general.name"), u64(where.header.file_size))
    return _target_case(target, src)


@malformed("gguf", "general.file_type has value type 13 (there is none)", "unknown value type 13")
def unknown_value_type(src: Sources, work: Path) -> Inputs:
    target, where = _broken_target(src, work)
    patch(target, where.type_tag_at("general.file_type"), u32(13))
    return _target_case(target, src)


@malformed("gguf", "an array's element type is 99", "unknown value type 99")
def unknown_array_element_type(src: Sources, work: Path) -> Inputs:
    target, where = _broken_target(src, work)
    patch(target, where.value_at(arch_key("feed_forward_length")), u32(99))
    return _target_case(target, src)


@malformed("gguf", "an array claims 2**60 items", "array of 1,152,921,504,606,846,976 items cannot fit")
def array_of_2_60_items(src: Sources, work: Path) -> Inputs:
    target, where = _broken_target(src, work)
    patch(target, where.value_at(arch_key("feed_forward_length")) + 4, u64(2**60))
    return _target_case(target, src)


@malformed("gguf", "an array of arrays nested 12 deep", "arrays nested more than 8 deep")
def arrays_nested_too_deep(src: Sources, work: Path) -> Inputs:
    value = GGUFArray(GGUFValueType.UINT8, (1, 2, 3))
    for _ in range(12):
        value = GGUFArray(ARR, (value,))
    target = edit_kvs(src.target, work / src.target.name, set_=[encode_kv("fuzz.deep", ARR, value)])
    return _target_case(target, src)


@malformed("gguf", "general.name appears twice in the KV table", "duplicate key 'general.name'")
def duplicate_key(src: Sources, work: Path) -> Inputs:
    header = read_header(src.target)
    kvs = [*header.kvs.values(), encode_kv("general.name", STR, "another name")]
    target = rewrite(src.target, work / src.target.name, kvs=kvs)
    return _target_case(target, src)


@malformed("gguf", "general.alignment is 48", "general.alignment = 48 is not a power of two")
def alignment_not_power_of_two(src: Sources, work: Path) -> Inputs:
    target = edit_kvs(src.target, work / src.target.name, set_=[encode_kv("general.alignment", U32, 48)])
    return _target_case(target, src)


@malformed("gguf", "general.alignment is 2**31, a power of two", "general.alignment = 2,147,483,648 is larger than")
def alignment_absurd_power_of_two(src: Sources, work: Path) -> Inputs:
    target = edit_kvs(src.target, work / src.target.name, set_=[encode_kv("general.alignment", U32, 2**31)])
    return _target_case(target, src)


@malformed(
    "target", "a single file's split.tensors.count is a string", "split.tensors.count must be an integer, not str"
)
def single_file_split_tensors_count_string(src: Sources, work: Path) -> Inputs:
    kv = encode_kv("split.tensors.count", STR, "26")
    target = edit_kvs(src.target, work / src.target.name, set_=[kv])
    return _target_case(target, src)


@malformed("gguf", "general.alignment is a u64, not a u32", "general.alignment must be u32, not u64")
def alignment_wrong_type(src: Sources, work: Path) -> Inputs:
    kv = encode_kv("general.alignment", GGUFValueType.UINT64, 32)
    target = edit_kvs(src.target, work / src.target.name, set_=[kv])
    return _target_case(target, src)


def _patch_tensor(src: Sources, work: Path, what: str, data: bytes, index: int = 1) -> Inputs:
    target, where = _broken_target(src, work)
    patch(target, where.tensor_field_at(where.header.tensors[index].name, what), data)
    return _target_case(target, src)


@malformed("gguf", "a tensor has ggml type 99", "unknown ggml type 99")
def unknown_ggml_type(src: Sources, work: Path) -> Inputs:
    return _patch_tensor(src, work, "type", u32(99))


@malformed("gguf", "a tensor has ggml type 4 (Q4_2, removed from ggml)", "unknown ggml type 4")
def removed_ggml_type(src: Sources, work: Path) -> Inputs:
    return _patch_tensor(src, work, "type", u32(4))


@malformed("gguf", "a tensor has n_dims 0", "n_dims 0 (must be 1..4)")
def n_dims_zero(src: Sources, work: Path) -> Inputs:
    return _patch_tensor(src, work, "n_dims", u32(0))


@malformed("gguf", "a tensor has n_dims 5", "n_dims 5 (must be 1..4)")
def n_dims_five(src: Sources, work: Path) -> Inputs:
    return _patch_tensor(src, work, "n_dims", u32(5))


@malformed("gguf", "a Q4_K tensor whose ne0 (100) is not a multiple of 256", "is not a multiple of Q4_K's block size")
def ne0_not_multiple_of_block(src: Sources, work: Path) -> Inputs:
    header = read_header(src.target)
    index = next(i for i, t in enumerate(header.tensors) if t.type_name == "Q4_K")
    return _patch_tensor(src, work, "dims", u64(100), index)


@malformed("gguf", "a tensor's ne1 is 2**63", "absurd shape")
def dimension_absurd(src: Sources, work: Path) -> Inputs:
    header = read_header(src.target)
    index = next(i for i, t in enumerate(header.tensors) if len(t.shape) >= 2)
    target, where = _broken_target(src, work)
    patch(target, where.tensor_field_at(header.tensors[index].name, "dims") + 8, u64(2**63))
    return _target_case(target, src)


@malformed("gguf", "a tensor's offset is 16 bytes off the 32-byte alignment", "is not a multiple of the alignment 32")
def tensor_offset_unaligned(src: Sources, work: Path) -> Inputs:
    header = read_header(src.target)
    return _patch_tensor(src, work, "offset", u64(header.tensors[1].offset + 16))


@malformed("gguf", "two tensors start at the same offset", "overlap")
def tensors_overlap(src: Sources, work: Path) -> Inputs:
    header = read_header(src.target)
    return _patch_tensor(src, work, "offset", u64(header.tensors[0].offset), index=1)


@malformed("gguf", "a tensor's offset points past the end of the data section", "runs past the end of the file")
def tensor_past_end(src: Sources, work: Path) -> Inputs:
    header = read_header(src.target)
    return _patch_tensor(src, work, "offset", u64(header.data_size + 4096))


@malformed("gguf", "two tensor entries carry the same name", "duplicate tensor name")
def duplicate_tensor_name(src: Sources, work: Path) -> Inputs:
    header = read_header(src.target)
    first = header.tensors[0].name
    target = rename_tensors(src.target, work / src.target.name, lambda n: first if n == header.tensors[1].name else n)
    return _target_case(target, src)


@malformed("gguf", "the tensor table lists the tensors in reverse order of their data", "llama.cpp requires")
def tensors_not_packed(src: Sources, work: Path) -> Inputs:
    header = read_header(src.target)
    target = rewrite(src.target, work / src.target.name, tensors=header.tensors[::-1])
    return _target_case(target, src)


@malformed("path", "the target is a directory", "is a directory")
def target_is_directory(src: Sources, work: Path) -> Inputs:
    target = work / "tiny.gguf"
    target.mkdir(parents=True)
    return _target_case(target, src)


@malformed("path", "the target does not exist", "no such file")
def target_missing(src: Sources, work: Path) -> Inputs:
    return _target_case(work / "missing.gguf", src)


@malformed("path", "the target is a named pipe (reading it would block forever)", "not a regular file")
def target_is_fifo(src: Sources, work: Path) -> Inputs:
    work.mkdir(parents=True, exist_ok=True)
    target = work / "pipe.gguf"
    os.mkfifo(target)
    return _target_case(target, src)


@malformed("path", "the target's name is longer than the filesystem allows", "File name too long")
def target_name_too_long(src: Sources, work: Path) -> Inputs:
    work.mkdir(parents=True, exist_ok=True)
    return _target_case(work / ("x" * 300 + ".gguf"), src)


# ----------------------------------------------------------------------------------------- split sets


def _split_case(shards: Sequence[Path], src: Sources, blamed: Path) -> Inputs:
    return compose_args(shards[0], src.draft0, blamed)


def _set_split_kv(shard: Path, kv: KeyValue) -> None:
    _rewrite_in_place(shard, set_=[kv])


def _rewrite_in_place(shard: Path, **changes: object) -> None:
    tmp = shard.with_name(shard.name + ".tmp")
    edit_kvs(shard, tmp, **changes)  # type: ignore[arg-type]
    os.replace(tmp, shard)


@malformed("split set", "shard 2 of 3 is missing", "incomplete split set: missing Tiny-Q4-00002-of-00003.gguf")
def split_missing_shard(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    shards[1].unlink()
    return _split_case(shards, src, shards[1])


@malformed("split set", "shard 2 says split.count = 4 in a set of 3", "split.count = 4, but the file name says 3")
def split_count_mismatch(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    _set_split_kv(shards[1], encode_kv("split.count", GGUFValueType.UINT16, 4))
    return _split_case(shards, src, shards[1])


@malformed("split set", "shards 2 and 3 carry each other's split.no", "split.no = 2, expected 1")
def split_no_out_of_order(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    _set_split_kv(shards[1], encode_kv("split.no", GGUFValueType.UINT16, 2))
    _set_split_kv(shards[2], encode_kv("split.no", GGUFValueType.UINT16, 1))
    return _split_case(shards, src, shards[1])


@malformed("split set", "shard 3 comes from another model of the same name", "shards disagree on split.tensors.count")
def shard_from_another_model(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    other = copy_split(src.other_split, work / "other")
    os.replace(other[2], shards[2])
    return _split_case(shards, src, shards[0])


@malformed("split set", "shard 2 says it belongs to a glm4moe model", "shard is from another model")
def shard_of_other_architecture(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    _set_split_kv(shards[1], encode_kv("general.architecture", STR, "glm4moe"))
    return _split_case(shards, src, shards[1])


@malformed("split set", "every shard says split.tensors.count = 27; they hold 26", "split.tensors.count = 27, but")
def split_tensors_count_stale(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    for shard in shards:
        _set_split_kv(shard, encode_kv("split.tensors.count", I32, 27))
    return _split_case(shards, src, shards[0])


@malformed("split set", "split.tensors.count is a string in every shard", "split.tensors.count must be an integer")
def split_tensors_count_not_integer(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    for shard in shards:
        _set_split_kv(shard, encode_kv("split.tensors.count", STR, "26"))
    return _split_case(shards, src, shards[0])


@malformed("split set", "shard 2 has no split.* keys", "shard 2 of 3 has no split.* keys")
def shard_without_split_keys(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    _rewrite_in_place(shards[1], drop=["split.no", "split.count", "split.tensors.count"])
    return _split_case(shards, src, shards[1])


@malformed("split set", "a tensor name of shard 2 appears again in shard 3", "is also in")
def tensor_in_two_shards(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    taken = read_header(shards[1]).tensors[0].name
    last = read_header(shards[2]).tensors[0].name
    tmp = shards[2].with_name("tmp.gguf")
    rename_tensors(shards[2], tmp, lambda n: taken if n == last else n)
    os.replace(tmp, shards[2])
    return _split_case(shards, src, shards[2])


@malformed("split set", "a single file says split.count = 3", "its siblings cannot be found")
def split_count_without_split_name(src: Sources, work: Path) -> Inputs:
    target = edit_kvs(src.target, work / src.target.name, set_=[encode_kv("split.count", GGUFValueType.UINT16, 3)])
    return compose_args(target, src.draft0, target)


@malformed("split set", "a shard is named 00004-of-00003", "shard number 4 is not within 1..3")
def shard_number_beyond_count(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work)
    beyond = shards[0].with_name("Tiny-Q4-00004-of-00003.gguf")
    shutil.copyfile(shards[2], beyond)
    return compose_args(beyond, src.draft0, beyond)


# ------------------------------------------------------------------------------------ target metadata


def _target_with(src: Sources, work: Path, **changes: object) -> Inputs:
    target = edit_kvs(src.target, work / src.target.name, **changes)  # type: ignore[arg-type]
    return compose_args(target, src.draft0, target)


@malformed("target", "general.architecture is missing", "no general.architecture key")
def no_architecture(src: Sources, work: Path) -> Inputs:
    return _target_with(src, work, drop=["general.architecture"])


@malformed("target", "block_count is the string '3'", "nemotron_h_moe.block_count is missing or not a non-negative")
def block_count_not_integer(src: Sources, work: Path) -> Inputs:
    return _target_with(src, work, set_=[encode_kv(arch_key("block_count"), STR, "3")])


@malformed("target", "block_count is missing", "nemotron_h_moe.block_count is missing")
def block_count_missing(src: Sources, work: Path) -> Inputs:
    return _target_with(src, work, drop=[arch_key("block_count")])


@malformed("target", "block_count is 0", "no trunk blocks")
def block_count_zero(src: Sources, work: Path) -> Inputs:
    return _target_with(src, work, set_=[encode_kv(arch_key("block_count"), U32, 0)])


@malformed("target", "block_count is a u8 holding 255: one more block does not fit its type", "256 does not fit u8")
def block_count_cannot_grow(src: Sources, work: Path) -> Inputs:
    return _target_with(src, work, set_=[encode_kv(arch_key("block_count"), GGUFValueType.UINT8, 255)])


@malformed("target", "nextn_predict_layers (7) exceeds block_count (3)", "nextn_predict_layers = 7 is not within")
def nextn_layers_exceed_block_count(src: Sources, work: Path) -> Inputs:
    return _target_with(src, work, set_=[encode_kv(arch_key("nextn_predict_layers"), U32, 7)])


@malformed("target", "the target already carries a NextN block", "target already has 1 NextN block(s)")
def target_already_has_nextn(src: Sources, work: Path) -> Inputs:
    target = copy(src.nextn_target, work)
    return compose_args(target, src.draft0, target)


@malformed("target", "blk.3 tensors exist though block_count says 3 blocks", "target already has tensors of blk.3")
def target_already_has_block_n(src: Sources, work: Path) -> Inputs:
    target = edit_kvs(
        src.nextn_target,
        work / src.nextn_target.name,
        set_=[encode_kv(arch_key("block_count"), U32, 3)],
        drop=[arch_key("nextn_predict_layers")],
    )
    return compose_args(target, src.draft0, target)


@malformed("target", "a per-layer array holds strings", "has STRING items, not integers, floats or booleans")
def per_layer_array_of_strings(src: Sources, work: Path) -> Inputs:
    names = GGUFArray(STR, ("mamba", "attention", "moe"))
    return _target_with(src, work, set_=[encode_kv(arch_key("layer_names"), ARR, names)])


# --------------------------------------------------------------------------------------------- drafts


def _draft_case(src: Sources, draft: Path, target: Path | None = None) -> Inputs:
    return compose_args(target or src.target, draft, draft)


def _draft_with(src: Sources, work: Path, draft: Path | None = None, **changes: object) -> Inputs:
    source = draft or src.draft0
    return _draft_case(src, edit_kvs(source, work / source.name, **changes))  # type: ignore[arg-type]


@malformed("draft", "the draft is for glm4moe, the target is nemotron_h_moe", "draft is for architecture 'glm4moe'")
def draft_other_architecture(src: Sources, work: Path) -> Inputs:
    return _draft_case(src, copy(src.glm_draft, work))


@malformed("draft", "the draft is 512 wide, the target 256", "embedding_length = 512, the target's is 256")
def draft_other_width(src: Sources, work: Path) -> Inputs:
    return _draft_case(src, copy(src.wide_draft, work))


@malformed("draft", "the draft's vocabulary has 512 tokens, the target's 256", "draft vocabulary has 512 tokens")
def draft_other_vocab(src: Sources, work: Path) -> Inputs:
    return _draft_case(src, copy(src.big_vocab_draft, work))


@malformed("draft", "the draft does not state its embedding length", "draft does not state nemotron_h_moe.embedding")
def draft_without_embedding_length(src: Sources, work: Path) -> Inputs:
    return _draft_with(src, work, drop=[arch_key("embedding_length")])


@malformed("draft", "the draft has tensors of blk.0 and blk.3", "draft blocks blk.0, blk.3")
def draft_mixed_block_indices(src: Sources, work: Path) -> Inputs:
    names = [t.name for t in read_header(src.draft0).tensors if t.name.startswith("blk.")]
    half = set(names[: len(names) // 2])
    draft = rename_tensors(
        src.draft0, work / src.draft0.name, lambda n: n.replace("blk.0.", "blk.3.") if n in half else n
    )
    return _draft_case(src, draft)


@malformed("draft", "the draft's block is blk.2, a trunk block of the target", "draft blocks blk.2: expected blk.0")
def draft_block_is_a_trunk_block(src: Sources, work: Path) -> Inputs:
    draft = rename_tensors(src.draft0, work / src.draft0.name, lambda n: n.replace("blk.0.", "blk.2."))
    return _draft_case(src, draft)


@malformed("draft", "the draft carries rope_freqs.weight outside any block", "'rope_freqs.weight' is outside any")
def draft_stray_global_tensor(src: Sources, work: Path) -> Inputs:
    stray = "rope_freqs.weight"
    draft = rename_tensors(src.draft0, work / src.draft0.name, lambda n: stray if n == "output.weight" else n)
    return _draft_case(src, draft)


@malformed("draft", "the draft has no block tensors at all", "draft has no blk.* tensors")
def draft_without_blocks(src: Sources, work: Path) -> Inputs:
    draft = rename_tensors(src.draft0, work / src.draft0.name, lambda n: None if n.startswith("blk.") else n)
    return _draft_case(src, draft)


@malformed("draft", "nextn_predict_layers = 2 but one block", "declares nextn_predict_layers = 2 but carries 1")
def draft_declares_more_blocks(src: Sources, work: Path) -> Inputs:
    return _draft_with(src, work, set_=[encode_kv(arch_key("nextn_predict_layers"), U32, 2)])


@malformed("draft", "the draft lacks feed_forward_length, a per-layer array", "the draft has no nemotron_h_moe.feed")
def draft_missing_per_layer_array(src: Sources, work: Path) -> Inputs:
    return _draft_with(src, work, drop=[arch_key("feed_forward_length")])


@malformed("draft", "a blk.3 draft whose per-layer arrays have one entry", "1 entries, none for the draft's block 3")
def draft_per_layer_array_too_short(src: Sources, work: Path) -> Inputs:
    keys = ("attention.head_count_kv", "feed_forward_length")
    short = [encode_kv(arch_key(k), ARR, GGUFArray(I32, (2,))) for k in keys]
    return _draft_with(src, work, src.draftN, set_=short)


@malformed("draft", "the draft's head_count_kv entry is 2.5", "head_count_kv = 2.5 is not an integer")
def draft_per_layer_value_not_integer(src: Sources, work: Path) -> Inputs:
    return _draft_with(src, work, set_=[encode_kv(arch_key("attention.head_count_kv"), ARR, GGUFArray(F32, (2.5,)))])


@malformed("draft", "the draft's feed_forward_length entry (2**40) does not fit the target's i32", "does not fit i32")
def draft_per_layer_value_out_of_range(src: Sources, work: Path) -> Inputs:
    return _draft_with(src, work, set_=[encode_kv(arch_key("feed_forward_length"), ARR, GGUFArray(I64, (2**40,)))])


@malformed("draft", "the draft's embedding_length is the string '256'", "embedding_length = '256', the target's is 256")
def draft_width_is_a_string(src: Sources, work: Path) -> Inputs:
    return _draft_with(src, work, set_=[encode_kv(arch_key("embedding_length"), STR, "256")])


@malformed("draft", "the draft's nextn_predict_layers is the string '1'", "nextn_predict_layers = '1' but carries 1")
def draft_nextn_layers_is_a_string(src: Sources, work: Path) -> Inputs:
    return _draft_with(src, work, set_=[encode_kv(arch_key("nextn_predict_layers"), STR, "1")])


@malformed("draft", "blk.0.attn_norm.weight and blk.00.attn_norm.weight: both block 0", "would both become 'blk.3.")
def draft_names_collide_after_renaming(src: Sources, work: Path) -> Inputs:
    twin = "blk.00.attn_norm.weight"
    draft = rename_tensors(src.draft0, work / src.draft0.name, lambda n: twin if n == "blk.0.nextn.enorm.weight" else n)
    return _draft_case(src, draft)


@malformed("draft", "a draft tensor name of 64 bytes (llama.cpp allows 63)", "longer than the 63 bytes llama.cpp")
def draft_name_too_long(src: Sources, work: Path) -> Inputs:
    long_name = "blk.0.nextn." + "x" * (64 - len("blk.0.nextn.") - len(".weight")) + ".weight"
    assert len(long_name) == 64
    draft = rename_tensors(
        src.draft0, work / src.draft0.name, lambda n: long_name if n == "blk.0.nextn.enorm.weight" else n
    )
    return _draft_case(src, draft)


@malformed("draft", "the draft is a split set", "a draft must be a single GGUF file, not a split set")
def draft_is_a_split_set(src: Sources, work: Path) -> Inputs:
    shards = copy_split(src.split, work / "draft")
    return _draft_case(src, shards[0])


@malformed("draft", "the draft's last tensor runs past its end", "runs past the end of the file")
def draft_truncated_in_data(src: Sources, work: Path) -> Inputs:
    draft = copy(src.draft0, work)
    truncate(draft, read_header(draft).file_size - 4096)
    return Inputs(("compose", str(src.target), str(draft)), draft)


# ---------------------------------------------------------------------------------------- checkpoints


def _checkpoint(src: Sources, work: Path) -> Path:
    folder = work / "checkpoint"
    shutil.copytree(src.checkpoint, folder)
    return folder


def _convert_case(src: Sources, folder: Path, blamed: Path) -> Inputs:
    return Inputs(("convert", str(folder), "--target", str(src.target)), blamed)


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def _rewrite_safetensors(path: Path, header: dict) -> None:
    """Give a safetensors file another JSON header; the data after it is kept (offsets are relative to it)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + length)
        data = f.read()
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(u64(len(text)) + text + data)


@malformed("checkpoint", "config.json is not JSON", "not valid JSON")
def checkpoint_config_not_json(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    (folder / "config.json").write_text("{'hidden_size': 256,")
    return _convert_case(src, folder, folder / "config.json")


@malformed("checkpoint", "the checkpoint folder has no config.json", "no config.json")
def checkpoint_without_config(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    (folder / "config.json").unlink()
    return _convert_case(src, folder, folder / "config.json")


@malformed("checkpoint", "a safetensors file's JSON header is garbage", "corrupt safetensors header: not valid JSON")
def checkpoint_safetensors_corrupt_header(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _weight_files(folder)[0]
    patch(weights, 8, b"\x00{not json at all")
    return _convert_case(src, folder, weights)


@malformed("checkpoint", "a safetensors file's header length runs past its end", "safetensors header: it claims")
def checkpoint_safetensors_header_past_end(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _weight_files(folder)[0]
    patch(weights, 0, u64(2**50))
    return _convert_case(src, folder, weights)


@malformed("checkpoint", "a tensor's data_offsets run past the end of its safetensors file", "runs past the end")
def checkpoint_tensor_past_end(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _weight_files(folder)[-1]
    header = _safetensors_header(weights)
    name = next(k for k in header if k != "__metadata__")
    begin, end = header[name]["data_offsets"]
    size = weights.stat().st_size
    header[name]["data_offsets"] = [size, size + end - begin]
    _rewrite_safetensors(weights, header)
    return _convert_case(src, folder, weights)


@malformed("checkpoint", "the index names a safetensors file that does not exist", "which is missing")
def checkpoint_index_points_to_missing_file(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    weights = _weight_files(folder)[-1]
    weights.unlink()
    return _convert_case(src, folder, weights)


@malformed("checkpoint", "the index file is not JSON", "not a valid index")
def checkpoint_index_not_json(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    index = folder / "model.safetensors.index.json"
    index.write_text("weight_map: everything")
    return _convert_case(src, folder, index)


@malformed("checkpoint", "the checkpoint has no MTP tensors", "no MTP head")
def checkpoint_without_mtp_tensors(src: Sources, work: Path) -> Inputs:
    folder = _checkpoint(src, work)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for weights in _weight_files(folder):
        header = _safetensors_header(weights)
        _rewrite_safetensors(weights, {k.replace("mtp.", "xyz.", 1): v for k, v in header.items()})
    index["weight_map"] = {k.replace("mtp.", "xyz.", 1): v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    return _convert_case(src, folder, folder)
