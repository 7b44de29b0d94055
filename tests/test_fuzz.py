"""Property-based tests: random valid GGUF models compose byte-exactly, and random damage to a header
gives either a valid result or a clean :class:`GGUFMTPError`, never another exception or a hang.

The generators build GGUF files from scratch: every value type, arrays of every element type, nested
and empty arrays, strings that are not valid UTF-8, keys in random order, versions 2 and 3, any
power-of-two alignment, random architecture names, integer types of ``block_count`` and the split
keys, 1..3 shards, random tensor tables of every ggml type, and drafts with one or two NextN blocks at
``blk.0`` or ``blk.N`` laid out in any order. Each file is also read with gguf-py's ``GGUFReader`` to
check that our header codec agrees with it byte for byte.

The number of examples per test is small by default (the file runs in seconds); set
``GGUF_MTP_FUZZ_EXAMPLES`` (e.g. 20000) for a long run.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from support.helpers import no_hang
from support.malformed import SMALL, TRUNK

from gguf_mtp.constants import split_file_name
from gguf_mtp.errors import GGUFMTPError
from gguf_mtp.format.header import (
    GGUFArray,
    GGUFHeader,
    KeyValue,
    TensorInfo,
    align_up,
    encode_kv,
    parse_header,
    read_header,
    serialize_header,
    tensor_nbytes,
)
from gguf_mtp.format.kv_edit import INT_RANGES
from gguf_mtp.format.layout import PAD_KEY
from gguf_mtp.jobs.compose import compose
from gguf_mtp.model.set_id import SET_ID_KEY
from gguf_mtp.model.shards import open_model
from gguf_mtp.testing.tiny_models import write_draft, write_target

pytestmark = pytest.mark.slow  # property-based runs of many examples

EXAMPLES = int(os.environ.get("GGUF_MTP_FUZZ_EXAMPLES", "0")) or None
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: A run longer than this is a hang (a parse reads a few KB; a compose writes a few MB).
HANG_SECONDS = 60


def fuzz_settings(default_examples: int) -> settings:
    return settings(
        max_examples=EXAMPLES or default_examples,
        deadline=None,
        database=None,  # keep the work tree clean; a failure prints its seed and minimal example
        derandomize=IN_CI and EXAMPLES is None,  # CI runs the same examples every time
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )



# ------------------------------------------------------------------------------------ value strategies

T = GGUFValueType
SCALARS = [T.UINT8, T.INT8, T.UINT16, T.INT16, T.UINT32, T.INT32, T.UINT64, T.INT64, T.FLOAT32, T.FLOAT64, T.BOOL]
NUMERIC = [t for t in SCALARS if t != T.BOOL]


def plain_values(vtype: GGUFValueType) -> st.SearchStrategy[Any]:
    """Values of a scalar type or of STRING (including byte strings that are not valid UTF-8)."""
    if vtype in INT_RANGES:
        lo, hi = INT_RANGES[vtype]
        return st.integers(lo, hi)
    if vtype == T.FLOAT32:
        return st.floats(width=32)
    if vtype == T.FLOAT64:
        return st.floats()
    if vtype == T.BOOL:
        return st.booleans()
    return st.one_of(
        st.text(max_size=12), st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape"))
    )


@st.composite
def arrays(draw: st.DrawFn, depth: int = 3) -> GGUFArray:
    """A typed array; with ``depth`` > 0 its items may be arrays again (each with its own element type)."""
    element_types = [*SCALARS, T.STRING] + ([T.ARRAY] if depth > 0 else [])
    etype = draw(st.sampled_from(element_types))
    count = draw(st.integers(0, 4))
    if etype == T.ARRAY:
        return GGUFArray(etype, tuple(draw(arrays(depth - 1)) for _ in range(count)))
    return GGUFArray(etype, tuple(draw(st.lists(plain_values(etype), min_size=count, max_size=count))))


@st.composite
def values(draw: st.DrawFn) -> tuple[GGUFValueType, Any]:
    vtype = draw(st.sampled_from([*SCALARS, T.STRING, T.ARRAY]))
    return vtype, draw(arrays() if vtype == T.ARRAY else plain_values(vtype))


def random_kvs(prefix: str, max_size: int = 6) -> st.SearchStrategy[list[KeyValue]]:
    """Unrelated metadata under ``prefix`` (never a key gguf-mtp manages, never under ``{arch}.``: random
    architecture names have no ``-``), of every type."""
    entry = st.tuples(st.text(max_size=10), values())
    return st.lists(entry, max_size=max_size, unique_by=lambda e: e[0]).map(
        lambda entries: [encode_kv(prefix + key, vtype, value) for key, (vtype, value) in entries]
    )


# ---------------------------------------------------------------------------------- model strategies

QUANT_TYPES = sorted(GGML_QUANT_SIZES, key=int)
ALIGNMENTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096]


@st.composite
def tensor_shapes(draw: st.DrawFn, ggml_type: GGMLQuantizationType) -> tuple[int, ...]:
    block_size = GGML_QUANT_SIZES[ggml_type][0]
    n_dims = draw(st.integers(1, 4))
    return (block_size * draw(st.integers(1, 2)), *draw(st.lists(st.integers(1, 3), min_size=n_dims - 1,
                                                                    max_size=n_dims - 1)))


@st.composite
def tensor_specs(draw: st.DrawFn, names: Sequence[str]) -> list[tuple[str, tuple[int, ...], int]]:
    specs = []
    for name in names:
        ggml_type = draw(st.sampled_from(QUANT_TYPES))
        specs.append((name, draw(tensor_shapes(ggml_type)), int(ggml_type)))
    return specs


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file to write: its header parts and its data section."""

    version: int
    kvs: list[KeyValue]
    tensors: list[TensorInfo]
    alignment: int
    data: bytes

    def to_bytes(self) -> bytes:
        return serialize_header(self.version, self.kvs, self.tensors, self.alignment) + self.data


def layout(
    specs: Sequence[tuple[str, tuple[int, ...], int]], alignment: int, rng: random.Random, *, packed: bool
) -> tuple[list[TensorInfo], bytes]:
    """Place tensors with random contents: back to back in table order (``packed``, what llama.cpp and
    compose need of a target), or in a random order with random gaps (legal GGUF, as a draft may be)."""
    order = list(range(len(specs)))
    if not packed:
        rng.shuffle(order)
    offsets: dict[int, int] = {}
    data = bytearray()
    for i in order:
        _, shape, ggml_type = specs[i]
        if not packed:
            data += bytes(alignment * rng.randint(0, 2))
        offsets[i] = len(data)
        data += rng.randbytes(tensor_nbytes(shape, ggml_type))
        data += bytes(align_up(len(data), alignment) - len(data))
    if data and rng.random() < 0.3:  # the file may end without the last tensor's padding
        _, shape, ggml_type = specs[order[-1]]
        data = data[: offsets[order[-1]] + tensor_nbytes(shape, ggml_type)]
    infos = [
        TensorInfo(name, shape, ggml_type, offsets[i], tensor_nbytes(shape, ggml_type))
        for i, (name, shape, ggml_type) in enumerate(specs)
    ]
    return infos, bytes(data)


@dataclass(frozen=True)
class FuzzModel:
    """A random target (1..3 shards) and a matching draft, as bytes."""

    arch: str
    block_count: int
    nextn_blocks: int
    draft_first: int
    shards: list[GGUFFile]
    draft: GGUFFile
    per_layer: dict[str, tuple[GGUFValueType, tuple[Any, ...], tuple[Any, ...]]]  # key -> (etype, trunk, nextn)

    def write(self, folder: Path) -> tuple[Path, Path]:
        """Write target and draft; returns (path of the target's first file, path of the draft)."""
        folder.mkdir(parents=True, exist_ok=True)
        count = len(self.shards)
        names = ["fuzz.gguf"] if count == 1 else [split_file_name("fuzz", i, count) for i in range(1, count + 1)]
        for name, shard in zip(names, self.shards):
            (folder / name).write_bytes(shard.to_bytes())
        draft = folder / "draft" / "mtp.gguf"
        draft.parent.mkdir(exist_ok=True)
        draft.write_bytes(self.draft.to_bytes())
        return folder / names[0], draft


def int_kv(key: str, vtype: GGUFValueType, value: int) -> KeyValue:
    return encode_kv(key, vtype, value)


@st.composite
def int_types_holding(draw: st.DrawFn, *values: int) -> GGUFValueType:
    fitting = [t for t, (lo, hi) in INT_RANGES.items() if all(lo <= v <= hi for v in values)]
    return draw(st.sampled_from(fitting))


@st.composite
def fuzz_models(draw: st.DrawFn) -> FuzzModel:
    rng = random.Random(draw(st.integers(0, 2**32)))
    arch = draw(st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12))
    version = draw(st.sampled_from([2, 3]))
    block_count = draw(st.integers(1, 4))
    nextn_blocks = draw(st.integers(1, 2))
    draft_first = draw(st.sampled_from([0, block_count]))
    width = draw(st.integers(1, 2**16))

    # per-layer arrays: the target's trunk values and the draft's values for its blocks
    per_layer: dict[str, tuple[GGUFValueType, tuple[Any, ...], tuple[Any, ...]]] = {}
    for i in range(draw(st.integers(0, 2))):
        etype = draw(st.sampled_from([*NUMERIC, T.BOOL]))
        trunk = tuple(draw(st.lists(plain_values(etype), min_size=block_count, max_size=block_count)))
        nextn = tuple(draw(st.lists(plain_values(etype), min_size=nextn_blocks, max_size=nextn_blocks)))
        per_layer[f"{arch}.layer_{i}"] = (etype, trunk, nextn)

    # target model KVs (shard 1), in random order among unrelated keys
    model_kvs = [
        encode_kv("general.architecture", T.STRING, arch),
        int_kv(f"{arch}.block_count", draw(int_types_holding(block_count + nextn_blocks)), block_count),
        int_kv(f"{arch}.embedding_length", draw(int_types_holding(width)), width),
        *(encode_kv(key, T.ARRAY, GGUFArray(etype, trunk)) for key, (etype, trunk, _) in per_layer.items()),
    ]
    if draw(st.booleans()):
        model_kvs.append(int_kv(f"{arch}.nextn_predict_layers", draw(int_types_holding(nextn_blocks)), 0))

    # target tensors, spread over 1..3 shards (a shard may hold none, like gguf-split's metadata shard)
    n_shards = draw(st.integers(1, 3))
    # every trunk block holds a tensor: a block_count that disagrees with the tensors is refused (llama.cpp too)
    names = [f"blk.{b}.fuzz_{i}" for b in range(block_count) for i in range(draw(st.integers(1, 2)))]
    names += [f"fuzz.global_{i}" for i in range(draw(st.integers(0, 2)))]
    specs = draw(tensor_specs(names))
    cuts = sorted(draw(st.lists(st.integers(0, len(specs)), min_size=n_shards - 1, max_size=n_shards - 1)))
    groups = [specs[a:b] for a, b in zip([0, *cuts], [*cuts, len(specs)])]
    split_types = [draw(int_types_holding(n_shards - 1)), draw(int_types_holding(n_shards)),
                   draw(int_types_holding(len(specs) + 2 * 2 * 4))]  # room for the added tensors

    shards = []
    for number, group in enumerate(groups):
        alignment = draw(st.sampled_from(ALIGNMENTS))
        kvs = draw(random_kvs(f"x-fuzz.s{number}."))
        if number == 0:
            kvs += model_kvs
        if alignment != 32 or draw(st.booleans()):
            kvs.append(encode_kv("general.alignment", T.UINT32, alignment))
        if n_shards > 1:
            kvs += [
                int_kv("split.no", split_types[0], number),
                int_kv("split.count", split_types[1], n_shards),
                int_kv("split.tensors.count", split_types[2], len(specs)),
            ]
        rng.shuffle(kvs)
        tensors, data = layout(group, alignment, rng, packed=True)
        shards.append(GGUFFile(version, kvs, tensors, alignment, data))

    # the draft: its blocks (and maybe the globals a --mtp export carries), laid out in any order
    draft_names = [f"blk.{draft_first + b}.nextn.fuzz_{i}" for b in range(nextn_blocks) for i in range(2)]
    if draw(st.booleans()):
        draft_names += ["token_embd.weight", "output.weight"]
    rng.shuffle(draft_names)
    draft_alignment = draw(st.sampled_from(ALIGNMENTS))
    draft_kvs = [
        encode_kv("general.architecture", T.STRING, arch),
        int_kv(f"{arch}.embedding_length", T.UINT32, width),
        *draw(random_kvs("x-fuzz.draft.")),
    ]
    for key, (etype, _, nextn) in per_layer.items():
        # the draft's array has an entry for each of its blocks at its own block index
        filler = draw(st.lists(plain_values(etype), min_size=draft_first, max_size=draft_first))
        draft_kvs.append(encode_kv(key, T.ARRAY, GGUFArray(etype, (*filler, *nextn))))
    if draw(st.booleans()):
        draft_kvs.append(int_kv(f"{arch}.nextn_predict_layers", T.UINT32, nextn_blocks))
    if draft_alignment != 32:
        draft_kvs.append(encode_kv("general.alignment", T.UINT32, draft_alignment))
    rng.shuffle(draft_kvs)
    draft_tensors, draft_data = layout(draw(tensor_specs(draft_names)), draft_alignment, rng, packed=False)
    draft = GGUFFile(version, draft_kvs, draft_tensors, draft_alignment, draft_data)
    return FuzzModel(arch, block_count, nextn_blocks, draft_first, shards, draft, per_layer)


# ------------------------------------------------------------------------------------------ checking


def gguf_py_reader(path: Path) -> GGUFReader | None:
    """gguf-py's reader of ``path``, or None where it cannot read the file (it is stricter about UTF-8
    than llama.cpp and gguf-mtp, and it is not the code under test)."""
    try:
        return GGUFReader(path)
    except Exception:
        return None


def assert_reader_agrees(path: Path, header: GGUFHeader, reader: GGUFReader | None = None) -> None:
    """gguf-py's GGUFReader sees the same KVs (byte for byte), tensors and data offset as our codec."""
    reader = reader or GGUFReader(path)
    fields = [f for name, f in reader.fields.items() if not name.startswith("GGUF.")]
    assert [f.name for f in fields] == list(header.kvs)
    for f in fields:
        kv = header.kvs[f.name]
        span = sum(int(part.nbytes) for part in f.parts)
        assert bytes(reader.data[f.offset : f.offset + span]) == kv.raw, f.name
        assert f.types[0] == kv.vtype
        if kv.is_array and len(f.types) > 1:
            assert f.types[1] == kv.element_type
    assert int(reader.alignment) == header.alignment
    assert int(reader.data_offset) == header.data_offset
    theirs = [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset) - header.data_offset,
         int(t.n_bytes))
        for t in reader.tensors
    ]
    assert theirs == [(t.name, t.shape, t.ggml_type, t.offset, t.nbytes) for t in header.tensors]


def tensor_bytes(path: Path, header: GGUFHeader, info: TensorInfo) -> bytes:
    with open(path, "rb") as f:
        f.seek(header.data_offset + info.offset)
        return f.read(info.nbytes)


def expected_kv(model: FuzzModel, kv: KeyValue, *, added: int) -> KeyValue:
    """What compose must make of target KV ``kv`` in shard 1 (``added`` tensors appended)."""
    arch = model.arch
    if kv.key == f"{arch}.block_count":
        return encode_kv(kv.key, kv.vtype, kv.value + model.nextn_blocks)
    if kv.key == f"{arch}.nextn_predict_layers":
        return encode_kv(kv.key, kv.vtype, model.nextn_blocks)
    if kv.key in model.per_layer:
        etype, trunk, nextn = model.per_layer[kv.key]
        return encode_kv(kv.key, T.ARRAY, GGUFArray(etype, trunk + nextn))
    if kv.key == "split.tensors.count":
        return encode_kv(kv.key, kv.vtype, kv.value + added)
    return kv


def check_composite(model: FuzzModel, target: Path, draft: Path, out: Path) -> None:
    sources = open_model(target)
    draft_header = read_header(draft)
    draft_blocks = [t for t in draft_header.tensors if t.name.startswith("blk.")]
    composite = open_model(out / target.name)
    assert len(composite.headers) == len(sources.headers)

    for index, (source, result) in enumerate(zip(sources.headers, composite.headers)):
        added = len(draft_blocks)
        if index == 0:
            expected = [expected_kv(model, kv, added=added) for kv in source.kvs.values()]
            nextn_key = f"{model.arch}.nextn_predict_layers"
            if nextn_key not in source.kvs:
                expected.append(encode_kv(nextn_key, T.UINT32, model.nextn_blocks))
        else:
            expected = [expected_kv(model, kv, added=added) if kv.key == "split.tensors.count" else kv
                        for kv in source.kvs.values()]
        # compose adds its set id and may add its padding KV (last) so that copied data keeps its block offsets
        assert [key for key in result.kvs if key not in (PAD_KEY, SET_ID_KEY)] == [kv.key for kv in expected]
        for kv in expected:
            assert result.kvs[kv.key].raw == kv.raw, kv.key
        assert result.version == source.version and result.alignment == source.alignment

        # every target tensor where it was, with the same bytes
        assert result.tensors[: len(source.tensors)] == source.tensors
        for info in source.tensors:
            assert tensor_bytes(Path(result.path), result, info) == tensor_bytes(Path(source.path), source, info)
        assert_reader_agrees(Path(result.path), result)

    # the draft's block tensors, renamed to follow the trunk, appended to the last shard, packed
    last = composite.headers[-1]
    appended = last.tensors[len(sources.headers[-1].tensors) :]
    assert len(appended) == len(draft_blocks)
    assert last.first_misplaced_tensor() is None
    by_name = {t.name: t for t in draft_blocks}
    for info in appended:
        block, rest = info.name.split(".", 2)[1:]
        assert int(block) >= model.block_count
        original = by_name[f"blk.{int(block) - model.block_count + model.draft_first}.{rest}"]
        assert (info.shape, info.ggml_type) == (original.shape, original.ggml_type)
        assert tensor_bytes(Path(last.path), last, info) == tensor_bytes(draft, draft_header, original)


# --------------------------------------------------------------------------------------------- tests


@fuzz_settings(40)
@given(model=fuzz_models())
def test_random_valid_models_compose_byte_exactly(model: FuzzModel) -> None:
    with tempfile.TemporaryDirectory() as tmp, no_hang(HANG_SECONDS):
        folder = Path(tmp)
        target, draft = model.write(folder / "in")
        for path in [*open_model(target).paths, draft]:
            assert_reader_agrees(path, read_header(path))

        compose(target, draft, folder / "out", progress=False)

        check_composite(model, target, draft, folder / "out")


@fuzz_settings(200)
@given(vtype_value=values(), version=st.sampled_from([2, 3]), alignment=st.sampled_from(ALIGNMENTS))
def test_any_value_round_trips_through_our_codec_and_gguf_py(
    vtype_value: tuple[GGUFValueType, Any], version: int, alignment: int
) -> None:
    vtype, value = vtype_value
    kvs = [encode_kv("general.alignment", T.UINT32, alignment), encode_kv("fuzz.value", vtype, value)]
    data = serialize_header(version, kvs, [], alignment)
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(data)
        f.flush()
        header = read_header(f.name)
        assert header.kvs["fuzz.value"].raw == kvs[1].raw
        assert encode_kv("fuzz.value", vtype, header.kvs["fuzz.value"].typed_value).raw == kvs[1].raw
        assert_reader_agrees(Path(f.name), header)


# ------------------------------------------------------------------------------------------ mutations

INTERESTING = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 31, 32, 63, 255, 256, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1,
               2**32, 2**60, 2**63, 2**64 - 1]


@st.composite
def mutations(draw: st.DrawFn, data: bytes, header_end: int) -> bytes:
    """1..4 random edits of ``data``, mostly inside its first ``header_end`` bytes."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.integers(0, max(min(len(buf), header_end + 64) - 1, 0)))
        kind = draw(st.sampled_from(["flip", "u32", "u64", "truncate", "insert", "delete"]))
        if kind == "flip" and buf:
            buf[where] ^= draw(st.integers(1, 255))
        elif kind in ("u32", "u64"):
            size = 4 if kind == "u32" else 8
            value = draw(st.sampled_from([*INTERESTING, len(buf), len(buf) - where]))
            buf[where : where + size] = struct.pack("<Q", value % 2**64)[:size]
        elif kind == "truncate":
            del buf[where:]
        elif kind == "insert":
            buf[where:where] = draw(st.binary(min_size=1, max_size=8))
        else:
            del buf[where : where + draw(st.integers(1, 8))]
    return bytes(buf)


@dataclass(frozen=True, repr=False)
class Seeds:
    """Valid files the mutation tests damage: a real tiny model and its draft."""

    target: bytes
    target_header_end: int
    draft: bytes
    draft_header_end: int

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"Seeds(target={len(self.target):,} bytes, draft={len(self.draft):,} bytes)"


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Seeds:
    folder = tmp_path_factory.mktemp("fuzz-seeds")
    # the smallest real model: one block of each kind, narrow tensors
    target = write_target(folder, hparams=SMALL, pattern=TRUNK, name="seed")
    draft = write_draft(folder / "seed-mtp.gguf", hparams=SMALL, trunk_pattern=TRUNK)
    return Seeds(
        target.read_bytes(), read_header(target).header_size, draft.read_bytes(), read_header(draft).header_size
    )


def parse_bytes(data: bytes, name: str) -> GGUFHeader:
    reads: list[int] = []

    def read_at(offset: int, size: int) -> bytes:
        reads.append(size)
        return data[offset : offset + size]

    try:
        return parse_header(read_at, len(data), name, min_read=4096)
    finally:
        assert sum(reads) <= len(data)  # never asks for more than the file holds


def exercise(header: GGUFHeader) -> None:
    """Touch everything a caller may touch on a parsed header: none of it may raise."""
    for kv in header.kvs.values():
        _ = (kv.value, kv.type_name, kv.array_length, kv.element_type)
    for info in header.tensors:
        _ = (info.type_name, info.n_elements)
    _ = (header.tensor_by_name, header.packed_data_size, header.first_misplaced_tensor(), header.tensor_data_end)


@fuzz_settings(300)
@given(data=st.data())
def test_damaged_header_parses_or_fails_cleanly(seeds: Seeds, data: st.DataObject) -> None:
    which = data.draw(st.sampled_from(["target", "draft"]))
    original = seeds.target if which == "target" else seeds.draft
    end = seeds.target_header_end if which == "target" else seeds.draft_header_end
    mutant = data.draw(mutations(original, end))
    with no_hang(HANG_SECONDS):
        try:
            header = parse_bytes(mutant, "mutant.gguf")
        except GGUFMTPError as e:
            assert str(e).startswith("mutant.gguf: ") and "\n" not in str(e)
            event("refused")
            return
        exercise(header)
        with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
            f.write(mutant)
            f.flush()
            reader = gguf_py_reader(Path(f.name))
            if reader is not None:  # both accept the damaged file: they must see the same thing
                assert_reader_agrees(Path(f.name), header, reader)
        event("accepted, gguf-py agrees" if reader is not None else "accepted, gguf-py cannot read it")


@fuzz_settings(300)
@given(model=fuzz_models(), data=st.data())
def test_damaged_random_model_parses_or_fails_cleanly(model: FuzzModel, data: st.DataObject) -> None:
    original = model.shards[0].to_bytes()
    end = len(serialize_header(model.shards[0].version, model.shards[0].kvs, model.shards[0].tensors, 1))
    mutant = data.draw(mutations(original, end))
    with no_hang(HANG_SECONDS):
        try:
            header = parse_bytes(mutant, "mutant.gguf")
        except GGUFMTPError as e:
            assert "\n" not in str(e)
            event("refused")
            return
        exercise(header)
        event("accepted")


@fuzz_settings(40)
@given(data=st.data())
def test_damaged_inputs_compose_or_fail_cleanly_and_write_nothing_on_failure(
    seeds: Seeds, data: st.DataObject
) -> None:
    damage_target = data.draw(st.booleans())
    target = data.draw(mutations(seeds.target, seeds.target_header_end)) if damage_target else seeds.target
    draft = seeds.draft if damage_target else data.draw(mutations(seeds.draft, seeds.draft_header_end))
    with tempfile.TemporaryDirectory() as tmp, no_hang(HANG_SECONDS):
        folder = Path(tmp)
        (folder / "in").mkdir()
        (folder / "in" / "seed.gguf").write_bytes(target)
        (folder / "in" / "mtp.gguf").write_bytes(draft)
        out = folder / "out"
        try:
            compose(folder / "in" / "seed.gguf", folder / "in" / "mtp.gguf", out, progress=False)
        except GGUFMTPError as e:
            assert "\n" not in str(e)
            assert not out.exists() or os.listdir(out) == []
            event(f"refused ({type(e).__name__})")
        else:
            event("composed")
            # what compose wrote is a well-formed GGUF holding the (damaged but acceptable) target's bytes
            source = read_header(folder / "in" / "seed.gguf")
            composite = read_header(out / "seed.gguf")
            exercise(composite)
            assert composite.tensors[: len(source.tensors)] == source.tensors
            for info in source.tensors:
                assert tensor_bytes(out / "seed.gguf", composite, info) == tensor_bytes(
                    folder / "in" / "seed.gguf", source, info
                )
            if all(gguf_py_reader(folder / "in" / name) is not None for name in ("seed.gguf", "mtp.gguf")):
                assert_reader_agrees(out / "seed.gguf", composite)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        assert (folder / "in" / "seed.gguf").read_bytes() == target
        assert (folder / "in" / "mtp.gguf").read_bytes() == draft
