"""The header codec and the shard-set rules on hostile counts and on files llama.cpp's own tools write
(issue 11: items 5 and 6 at the header level, 10, 12)."""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, TokenType
from support.helpers import no_hang
from support.malformed import SMALL, edit_kvs, rewrite

from gguf_mtp.cli import main
from gguf_mtp.constants import ENV_MAX_HEADER_BYTES, MAX_ALIGNMENT, MAX_TENSORS
from gguf_mtp.format.header import (
    SUPPLEMENT_QUANT_SIZES,
    KVTable,
    TensorInfo,
    encode_kv,
    parse_header,
    read_header,
    serialize_header,
    tensor_nbytes,
)
from gguf_mtp.model.shard_scan import consistency_problems, scan_model
from gguf_mtp.model.shards import open_model
from gguf_mtp.testing.tiny_models import write_target

U16, U32, I32, STR, ARR = (
    GGUFValueType.UINT16,
    GGUFValueType.UINT32,
    GGUFValueType.INT32,
    GGUFValueType.STRING,
    GGUFValueType.ARRAY,
)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_target(tmp_path_factory.mktemp("bounds"), hparams=SMALL, pattern="M*E", name="tiny")


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    with no_hang():
        status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def one_line(status: int, err: str, *phrases: str) -> str:
    assert "Traceback" not in err
    assert status == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, lines
    for phrase in phrases:
        assert phrase in lines[0], (phrase, lines[0])
    return lines[0]


def tiny_kv_header(n: int, *, tensors: int = 0) -> bytes:
    """A valid GGUF of ``n`` distinct tiny u8 KVs (and ``tensors`` tiny F32 tensors)."""
    parts = [struct.pack("<IIQQ", 0x46554747, 3, tensors, n)]
    for i in range(n):
        key = f"k{i}".encode()
        parts.append(struct.pack("<Q", len(key)) + key + struct.pack("<IB", 0, i & 0xFF))
    for i in range(tensors):
        name = f"t{i}".encode()
        parts.append(struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, 8, 0, 32 * i))
    head = b"".join(parts)
    head += b"\0" * (-len(head) % 32)
    return head + b"\0" * (32 * tensors)


# ------------------------------------------------------------------------------------------- alignment


@pytest.mark.parametrize("alignment", [2**31, 2 * MAX_ALIGNMENT])
def test_huge_power_of_two_alignment_is_refused_before_anything_pads_to_it(
    alignment: int, target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = edit_kvs(target, tmp_path / "tiny.gguf", set_=[encode_kv("general.alignment", U32, alignment)])
    tracemalloc.start()
    try:
        args = ["compose", str(broken), str(broken), "-o", str(tmp_path / "out"), "--dry-run"]
        status, _, err = run_cli(args, capsys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_line(status, err, "tiny.gguf", f"general.alignment = {alignment:,} is larger than the {MAX_ALIGNMENT:,}")
    assert peak < 64 << 20  # nothing sized by the alignment was allocated
    assert not (tmp_path / "out").exists()


def test_largest_accepted_alignment_still_parses(target: Path, tmp_path: Path) -> None:
    header = read_header(target)
    kvs = [*header.kvs.values(), encode_kv("general.alignment", U32, MAX_ALIGNMENT)]
    head = serialize_header(header.version, kvs, [], MAX_ALIGNMENT)
    path = tmp_path / "aligned.gguf"
    path.write_bytes(head)
    parsed = read_header(path)
    assert parsed.alignment == MAX_ALIGNMENT and parsed.data_offset == len(head) and parsed.tensors == ()


# ------------------------------------------------------------------------------------------ counts


def test_tensor_count_beyond_the_cap_is_refused_before_reading_the_table() -> None:
    data = tiny_kv_header(1)[:24 + 15] + b"\0" * (40 * (MAX_TENSORS + 1))
    data = data[:8] + struct.pack("<Q", MAX_TENSORS + 1) + data[16:]
    requested: list[int] = []

    def read_at(offset: int, size: int) -> bytes:
        requested.append(size)
        return data[offset : offset + size]

    with pytest.raises(Exception, match=f"tensor_count {MAX_TENSORS + 1:,} is more than the {MAX_TENSORS:,}"):
        parse_header(read_at, len(data), "t.gguf", min_read=4096)
    assert sum(requested) <= 4096


def test_tensor_count_is_bounded_by_the_bytes_after_the_kv_table() -> None:
    data = tiny_kv_header(2000, tensors=0)
    # 500 tensors would fit in the whole file (~30 KB) but not in what follows the KV table
    data = data[:8] + struct.pack("<Q", 500) + data[16:]
    with pytest.raises(Exception, match="truncated in the tensor table: tensor_count 500 needs at least 16,000"):
        parse_header(lambda o, n: data[o : o + n], len(data), "t.gguf")


def test_an_overlong_tensor_name_is_refused_without_reading_it() -> None:
    data = bytearray(tiny_kv_header(1, tensors=1))
    name_at = 24 + 8 + 2 + 4 + 1
    data[name_at : name_at + 8] = struct.pack("<Q", 2**40)
    with pytest.raises(Exception, match="has a name of 1,099,511,627,776 bytes, longer than the 63 bytes llama.cpp"):
        parse_header(lambda o, n: bytes(data[o : o + n]), len(data), "t.gguf")


# ------------------------------------------------------------------------------------------ memory (item 6)


@pytest.mark.slow
def test_kv_table_of_many_tiny_kvs_parses_in_a_small_multiple_of_its_size() -> None:
    n = 150_000
    data = tiny_kv_header(n)
    size = len(data)
    tracemalloc.start()
    try:
        header = parse_header(lambda o, k: data[o : o + k], size, "many.gguf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 4 * size, f"peak {peak:,} bytes for a {size:,}-byte header"
    # ... and it is still a complete, exact table
    assert len(header.kvs) == n
    assert header.kvs["k123456"].value == 123456 & 0xFF
    assert "k150000" not in header.kvs
    assert list(header.kvs)[:3] == ["k0", "k1", "k2"]
    assert b"".join(kv.raw for kv in header.kvs.values()) == data[24 : header.header_size]


def test_kv_table_behaves_as_a_read_only_mapping_in_file_order() -> None:
    kvs = [encode_kv("b", U32, 7), encode_kv("a", STR, "x"), encode_kv("c", ARR, [1, 2], element_type=I32)]
    table = KVTable.of(kvs)
    assert list(table) == ["b", "a", "c"]
    assert [kv.raw for kv in table.values()] == [kv.raw for kv in kvs]
    assert [(k, v.value) for k, v in table.items()] == [("b", 7), ("a", "x"), ("c", [1, 2])]
    assert table.get("a").value == "x" and table.get("z") is None and 1 not in table
    assert table.first_duplicate() is None
    assert KVTable.of([*kvs, encode_kv("a", U32, 1)]).first_duplicate() == "a"


def test_duplicate_key_far_apart_is_refused() -> None:
    data = bytearray(tiny_kv_header(5000))
    # rename the last key ("k4999") to "k0000"? Same length keys: make it repeat "k1234"
    key_at = data.rindex(b"k4999")
    data[key_at : key_at + 5] = b"k1234"
    with pytest.raises(Exception, match="duplicate key 'k1234'"):
        parse_header(lambda o, n: bytes(data[o : o + n]), len(data), "d.gguf")


HOSTILE_RUN = textwrap.dedent(
    """
    import resource, sys
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    if resource.getrlimit(resource.RLIMIT_AS) != (limit, limit):
        sys.exit(f"the address-space limit {limit} is not in force")  # exit 1: the test's exit-2 check fails
    from gguf_mtp.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.mark.slow
def test_hostile_kv_table_under_an_address_space_limit_ends_with_one_line(tmp_path: Path) -> None:
    # ~21 MB of tiny KVs (1.5 million): one object per entry needed ~300 MB; the limit leaves ~250 MB
    # above what an idle interpreter with numpy maps.
    ours = resource.getrlimit(resource.RLIMIT_AS)
    path = tmp_path / "hostile.gguf"
    path.write_bytes(tiny_kv_header(1_500_000))
    env = {**os.environ, "GGUF_MTP_DISABLE_PROGRESS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    idle = subprocess.run(
        [sys.executable, "-c", "import resource, gguf_mtp.cli, numpy;"
         "print(open('/proc/self/status').read().split('VmPeak:')[1].split()[0])"],
        capture_output=True, text=True, env=env, check=True,
    )
    limit = int(idle.stdout) * 1024 + (250 << 20)
    result = subprocess.run(
        [sys.executable, "-c", HOSTILE_RUN, str(limit), "compose", str(path), str(path), "-o", str(tmp_path / "o"),
         "--dry-run"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert "Traceback" not in result.stderr and "MemoryError" not in result.stderr
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.splitlines()) == 1 and "hostile.gguf" in result.stderr
    assert resource.getrlimit(resource.RLIMIT_AS) == ours  # the limit was the child's only


# ------------------------------------------------------------------------------------------ item 10


def test_malformed_max_header_bytes_variable_is_one_line_naming_it(
    target: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_MAX_HEADER_BYTES, "512M")
    status, _, err = run_cli(["inspect", str(target)], capsys)
    one_line(status, err, "GGUF_MTP_MAX_HEADER_BYTES='512M' is not a positive whole number of bytes")


def test_malformed_max_header_bytes_variable_in_a_real_process(target: Path) -> None:
    env = {**os.environ, ENV_MAX_HEADER_BYTES: "512M", "GGUF_MTP_DISABLE_PROGRESS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "gguf_mtp", "inspect", str(target)], capture_output=True, text=True, env=env, timeout=120
    )
    one_line(result.returncode, result.stderr, "GGUF_MTP_MAX_HEADER_BYTES")


def test_max_header_bytes_variable_still_limits(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_MAX_HEADER_BYTES, "100")
    with pytest.raises(Exception, match="header larger than the 100-byte limit"):
        read_header(target)


@pytest.mark.parametrize(
    ("key", "kv", "type_name"),
    [
        ("split.tensors.count", encode_kv("split.tensors.count", STR, "26"), "str"),
        ("split.tensors.count", encode_kv("split.tensors.count", ARR, list(range(1000)), element_type=I32), "arr[i32]"),
        ("split.count", encode_kv("split.count", STR, "1"), "str"),
        ("split.no", encode_kv("split.no", ARR, [0], element_type=U16), "arr[u16]"),
    ],
)
def test_single_file_with_a_split_key_of_the_wrong_type_is_one_line(
    key: str, kv: object, type_name: str, target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = edit_kvs(target, tmp_path / "tiny.gguf", set_=[kv])
    status, _, err = run_cli(["compose", str(broken), str(broken), "-o", str(tmp_path / "out")], capsys)
    line = one_line(status, err, "tiny.gguf", f"{key} must be an integer, not {type_name}")
    assert len(line) < 300  # the array is not printed
    problems = consistency_problems(scan_model(broken))
    assert f"tiny.gguf: {key} must be an integer, not {type_name}" in problems


# ------------------------------------------------------------------------------------------ item 12


def merged_like_gguf_split(target: Path, dest: Path) -> Path:
    """The single file ``llama-gguf-split --merge`` writes: split.no = 0, split.count = 0 (u16) and
    split.tensors.count (i32), as gguf-split.cpp's merge sets them."""
    n = len(read_header(target).tensors)
    return edit_kvs(
        target,
        dest,
        set_=[
            encode_kv("split.no", U16, 0), encode_kv("split.count", U16, 0), encode_kv("split.tensors.count", I32, n)
        ],
    )


def test_merged_file_with_split_count_0_is_a_single_file_everywhere(
    target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    merged = merged_like_gguf_split(target, tmp_path / "merged.gguf")
    model = open_model(merged)
    assert not model.is_split and model.tensor_count == len(read_header(target).tensors)
    assert consistency_problems(scan_model(merged)) == []
    status, out, err = run_cli(["inspect", str(merged)], capsys)
    assert status == 0 and err == "", err
    assert "problems" not in out


@pytest.mark.parametrize("count", [2, 65535])
def test_single_file_claiming_more_shards_is_still_refused(
    count: int, target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = edit_kvs(target, tmp_path / "tiny.gguf", set_=[encode_kv("split.count", U16, count)])
    status, _, err = run_cli(["compose", str(broken), str(broken), "-o", str(tmp_path / "out")], capsys)
    one_line(status, err, f"split.count = {count}, but the name does not follow", "siblings cannot be found")


def write_vocab_only(path: Path) -> Path:
    """A vocab-only GGUF as llama.cpp's convert_hf_to_gguf.py --vocab-only writes it: the tokenizer KVs
    through GGUFWriter, no tensors (so the file ends right after the empty tensor table)."""
    writer = GGUFWriter(path, "llama")
    writer.add_name("vocab-only test")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    tokens = [b"<unk>", b"<s>", b"</s>", *(f"tok{i}".encode() for i in range(61))]
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types([TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.NORMAL] * 61)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


def test_vocab_only_file_as_gguf_py_writes_it_is_read_and_inspected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_vocab_only(tmp_path / "ggml-vocab-test.gguf")
    header = read_header(path)
    assert header.tensors == () and header.file_size == header.header_size  # no padding, no data
    assert header.data_offset > header.file_size and header.data_size == 0
    assert len(header.get("tokenizer.ggml.tokens")) == 64
    assert consistency_problems(scan_model(path)) == []

    status, out, err = run_cli(["inspect", str(path)], capsys)
    assert status == 0 and err == "", err
    assert "0 tensors" in out, out


def test_a_file_with_tensors_still_needs_its_data_section(target: Path, tmp_path: Path) -> None:
    header = read_header(target)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(target.read_bytes()[: header.header_size])
    with pytest.raises(Exception, match="truncated before the data section"):
        read_header(cut)


def test_supplement_type_sizes_agree_with_ggml_and_do_not_shadow_gguf_py() -> None:
    # facts from llama.cpp's ggml.h (GGML_TYPE_Q2_0 = 42, GGML_TYPE_COUNT = 43) and ggml-common.h
    # (block_q2_0: ggml_half d + uint8_t qs[QK2_0 / 4], QK2_0 = 64)
    assert SUPPLEMENT_QUANT_SIZES == {42: ("Q2_0", 64, 2 + 64 // 4)}
    known = {int(t) for t in GGMLQuantizationType if t in GGML_QUANT_SIZES}
    assert not known & set(SUPPLEMENT_QUANT_SIZES)  # gguf-py's own table always wins
    assert tensor_nbytes((256, 3), 42) == 256 * 3 // 64 * 18


def test_type_42_tensor_is_read_and_sized(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = read_header(target)
    nbytes = 256 * 4 // 64 * 18  # 16 blocks of 18 bytes
    q2 = TensorInfo("blk.0.q2_test.weight", (256, 4), 42, 0, nbytes)
    path = tmp_path / "q2.gguf"
    head = serialize_header(header.version, header.kvs.values(), [q2], header.alignment)
    path.write_bytes(head + bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256))
    parsed = read_header(path)
    assert parsed.tensors == (q2,)
    assert parsed.tensors[0].type_name == "Q2_0" and parsed.tensors[0].nbytes == 288
    _status, out, err = run_cli(["inspect", str(path)], capsys)
    assert "Traceback" not in err and "unknown ggml type" not in err
    assert "Q2_0" in out


@pytest.mark.parametrize("ggml_type", [43, 99])
def test_types_neither_table_knows_are_still_refused(
    ggml_type: int, target: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    header = read_header(target)
    first = header.tensors[0]
    tensors = [TensorInfo(first.name, first.shape, ggml_type, first.offset, first.nbytes), *header.tensors[1:]]
    broken = rewrite(target, tmp_path / "tiny.gguf", tensors=tensors)
    status, _, err = run_cli(["inspect", str(broken)], capsys)
    one_line(status, err, "tiny.gguf", f"unknown ggml type {ggml_type}")
