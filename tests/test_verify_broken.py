"""verify catches each way a composite can be wrong, with a message that names the culprit.

Each broken composite is a copy of a good one with exactly one defect, made the way a buggy tool would
make it: headers re-serialised with ``serialize_header`` and the tensor data re-packed after them, a
byte flipped, a file cut short or removed. Session fixtures are never touched.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import copy_model, flip_byte, shard_files

from gguf_mtp import compose
from gguf_mtp.check.llama_check import llama_reason
from gguf_mtp.check.verify import VerifyReport, verify
from gguf_mtp.format.header import GGUFArray, KeyValue, align_up, encode_kv, read_header, serialize_header
from gguf_mtp.testing.tiny_models import add_raw_kvs, write_target

ARCH = "nemotron_h_moe"
COUNT = "split.tensors.count"


@pytest.fixture(scope="module")
def good(nemotron_split: Path, nemotron_draft0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good 3-shard composite (26 target tensors + 18 NextN tensors as blk.3)."""
    report = compose(nemotron_split, nemotron_draft0, tmp_path_factory.mktemp("good"), progress=False)
    return report.output_paths[0]


@pytest.fixture
def broken(good: Path, tmp_path: Path) -> list[Path]:
    """A fresh copy of the good composite's files, to break."""
    return shard_files(copy_model(good, tmp_path / "broken"))


def rewrite(path: Path, *, kvs: dict[str, KeyValue] | None = None, drop: tuple[str, ...] = ()) -> None:
    """Rewrite one GGUF in place with some KVs replaced and some tensors removed, the rest re-packed."""
    header = read_header(path)
    new_kvs = [(kvs or {}).get(key, kv) for key, kv in header.kvs.items()]
    kept = [t for t in header.tensors if t.name not in drop]
    placed, offset = [], 0
    for t in kept:
        placed.append(replace(t, offset=offset))
        offset = align_up(offset + t.nbytes, header.alignment)
    data = path.read_bytes()
    with open(path, "wb") as out:
        out.write(serialize_header(header.version, new_kvs, placed, header.alignment))
        for old, new in zip(kept, placed):
            start = header.data_offset + old.offset
            out.write(data[start : start + old.nbytes])
            out.write(b"\0" * (align_up(new.offset + new.nbytes, header.alignment) - new.offset - new.nbytes))


def tensor_offset(path: Path, name: str) -> int:
    """Absolute offset of a tensor's first byte in its file."""
    header = read_header(path)
    return header.data_offset + header.tensor_by_name[name].offset


def run(first: Path, target: Path | None = None, draft: Path | None = None, **kwargs: object) -> VerifyReport:
    return verify(first, target=target, draft=draft, llama=False, progress=False, **kwargs)  # type: ignore[arg-type]


def failed(report: VerifyReport) -> dict[str, str]:
    return {c.name: c.detail for c in report.failures}


# ----------------------------------------------------------------------------------------------- defects


def test_flipped_byte_in_a_target_tensor_names_the_tensor(broken: list[Path], nemotron_split: Path) -> None:
    flip_byte(broken[1], tensor_offset(broken[1], "blk.1.attn_q.weight") + 1000)
    report = run(broken[0], nemotron_split)
    assert failed(report) == {
        "target tensors": "target tensor 'blk.1.attn_q.weight' differs from its copy in the composite"
    }


def test_flipped_byte_in_a_draft_tensor_names_the_tensor(broken: list[Path], nemotron_draft0: Path) -> None:
    flip_byte(broken[2], tensor_offset(broken[2], "blk.3.ffn_up_exps.weight") + 7)
    report = run(broken[0], draft=nemotron_draft0)
    assert failed(report) == {
        "draft tensors": "draft tensor 'blk.3.ffn_up_exps.weight' differs from its copy in the composite"
    }


def test_dropped_nextn_tensor_is_named(broken: list[Path], nemotron_draft0: Path) -> None:
    count = encode_kv(COUNT, GGUFValueType.INT32, 43)
    for path in broken:  # consistent counts: the missing tensor is the only defect
        rewrite(path, kvs={COUNT: count}, drop=("blk.3.nextn.eh_proj.weight",))
    report = run(broken[0], draft=nemotron_draft0)
    assert failed(report) == {
        "NextN tensors": "blk.3 lacks blk.3.nextn.eh_proj.weight; "
        "draft tensor(s) not in the composite: blk.3.nextn.eh_proj.weight",
        "draft tensors": "1 draft tensor(s) missing from the composite, first 'blk.3.nextn.eh_proj.weight'",
    }


def test_dropped_nextn_tensor_is_caught_without_the_draft(broken: list[Path]) -> None:
    count = encode_kv(COUNT, GGUFValueType.INT32, 43)
    for path in broken:
        rewrite(path, kvs={COUNT: count}, drop=("blk.3.nextn.hnorm.weight",))
    assert failed(run(broken[0])) == {"NextN tensors": "blk.3 lacks blk.3.nextn.hnorm.weight"}


def test_stale_split_tensors_count_in_one_shard_names_the_shard(broken: list[Path], nemotron_split: Path) -> None:
    rewrite(broken[1], kvs={COUNT: encode_kv(COUNT, GGUFValueType.INT32, 26)})
    report = run(broken[0], nemotron_split)
    assert failed(report) == {
        "split.tensors.count": f"shard 2 ({broken[1].name}): {COUNT} = 26, but the 3 shards hold 44 tensors",
        "target metadata": f"split.tensors.count in shard 2 ({broken[1].name}) is 26 (i32), expected 44 (i32)",
    }


def test_unextended_per_layer_array_is_named(broken: list[Path], nemotron_split: Path) -> None:
    key = f"{ARCH}.feed_forward_length"
    rewrite(broken[0], kvs={key: encode_kv(key, GGUFValueType.ARRAY, [0, 0, 256], GGUFValueType.INT32)})
    report = run(broken[0], nemotron_split)
    assert failed(report) == {
        "per-layer arrays": f"{key} has 3 entries, but block_count is 4 (not extended for the NextN block)",
        "target metadata": f"{key} has 3 entries, block_count is 4",
    }


def test_nextn_entry_copied_from_the_last_trunk_layer_is_caught(broken: list[Path]) -> None:
    key = f"{ARCH}.attention.head_count_kv"  # blk.2 is a MoE layer: its 0 makes blk.3 MoE-only
    rewrite(broken[0], kvs={key: encode_kv(key, GGUFValueType.ARRAY, [0, 2, 0, 0], GGUFValueType.INT32)})
    assert failed(run(broken[0])) == {
        "per-layer arrays": "blk.3: attention.head_count_kv and feed_forward_length make it 'E', but a NextN block "
        "is both attention and feed-forward ('*E': both entries > 0)"
    }


def test_truncated_last_shard_names_the_cut_tensor(broken: list[Path], nemotron_split: Path) -> None:
    size = broken[2].stat().st_size
    os.truncate(broken[2], size - 4096)
    report = run(broken[0], nemotron_split)
    assert failed(report) == {
        "tensor data": f"shard 3 ({broken[2].name}): truncated at {size - 4096:,} bytes: 2 tensor(s) end past it, "
        f"first 'blk.3.ffn_down_shexp.weight' (BF16, 524,288 bytes, ends at byte {size - 2048:,})"
    }


def test_truncated_last_shard_fails_the_draft_comparison(broken: list[Path], nemotron_draft0: Path) -> None:
    os.truncate(broken[2], broken[2].stat().st_size - 4096)
    report = run(broken[0], draft=nemotron_draft0)
    assert failed(report)["draft tensors"] == (
        "draft tensor 'blk.3.ffn_down_shexp.weight' differs from its copy in the composite (and 1 more)"
    )


def test_missing_middle_shard_is_named(broken: list[Path], nemotron_split: Path) -> None:
    broken[1].unlink()
    report = run(broken[0], nemotron_split)
    details = failed(report)
    assert details["files"] == f"shard 2 ({broken[1].name}) is missing (3 files expected)"
    assert details["split.tensors.count"].startswith(f"shard 1 ({broken[0].name}): split.tensors.count = 44, but")
    assert details["target tensors"] == "9 target tensor(s) missing from the composite, first 'blk.0.ssm_out.weight'"
    assert set(details) == {"files", "split.tensors.count", "target tensors"}


def test_changed_kv_is_named_unless_allowed(broken: list[Path], nemotron_split: Path) -> None:
    rewrite(broken[0], kvs={"general.name": encode_kv("general.name", GGUFValueType.STRING, "renamed")})
    report = run(broken[0], nemotron_split)
    assert failed(report) == {
        "target metadata": "general.name changed: 'tiny-nemotron_h_moe' (str) -> 'renamed' (str)"
    }
    assert run(broken[0], nemotron_split, allow_kv=["general.name"]).ok


def test_changed_kv_type_is_caught(broken: list[Path], nemotron_split: Path) -> None:
    key = f"{ARCH}.block_count"
    rewrite(broken[0], kvs={key: encode_kv(key, GGUFValueType.UINT64, 4)})
    assert failed(run(broken[0], nemotron_split)) == {"target metadata": f"{key} is 4 (u64), expected 4 (u32)"}


def test_tensor_not_where_llama_cpp_expects_it(broken: list[Path]) -> None:
    header = read_header(broken[1])
    moved = [replace(t, offset=t.offset + header.alignment) for t in header.tensors]
    data = broken[1].read_bytes()[header.data_offset :]
    with open(broken[1], "wb") as out:  # a gap of one alignment unit before the first tensor
        out.write(serialize_header(header.version, header.kvs.values(), moved, header.alignment))
        out.write(b"\0" * header.alignment + data)
    detail = failed(run(broken[0]))["tensor data"]
    assert detail == (
        f"shard 2 ({broken[1].name}): tensor 'blk.0.ssm_out.weight' is at data offset 32, llama.cpp expects 0 "
        "(tensors back to back in table order)"
    )


def test_a_broken_composite_still_passes_the_checks_it_should(broken: list[Path], nemotron_split: Path) -> None:
    flip_byte(broken[1], tensor_offset(broken[1], "blk.1.attn_q.weight"))
    report = run(broken[0], nemotron_split)
    assert [c.name for c in report.checks if c.ok] == [
        "files", "split keys", "split.tensors.count", "tensor names", "tensor data", "per-layer arrays",
        "NextN tensors", "target metadata",
    ]


# ------------------------------------------------------------------------------------ llama.cpp agrees


@pytest.mark.llama
def test_llama_cpp_refuses_a_composite_without_eh_proj(broken: list[Path]) -> None:
    count = encode_kv(COUNT, GGUFValueType.INT32, 43)
    for path in broken:
        rewrite(path, kvs={COUNT: count}, drop=("blk.3.nextn.eh_proj.weight",))
    report = verify(broken[0], llama=True, progress=False)
    assert report.check("llama.cpp").status == "fail"


@pytest.mark.llama
def test_llama_cpp_misses_a_stale_count_in_shard_2_but_verify_does_not(broken: list[Path]) -> None:
    rewrite(broken[1], kvs={COUNT: encode_kv(COUNT, GGUFValueType.INT32, 26)})
    report = verify(broken[0], llama=True, progress=False)
    assert report.check("llama.cpp").status == "pass"  # llama.cpp reads shard 1's count only
    assert [c.name for c in report.failures] == ["split.tensors.count"]


@pytest.mark.llama
def test_llama_cpp_refuses_an_unextended_array(broken: list[Path]) -> None:
    key = f"{ARCH}.feed_forward_length"
    rewrite(broken[0], kvs={key: encode_kv(key, GGUFValueType.ARRAY, [0, 0, 256], GGUFValueType.INT32)})
    llama = verify(broken[0], llama=True, progress=False).check("llama.cpp")
    assert llama.status == "fail"
    assert "feed_forward_length has wrong array length; expected 4, got 3" in llama.detail


# ------------------------------------------------------------------------------- llama.cpp's own reason

NESTED = "general.nested"


def nested_array_target(folder: Path) -> Path:
    """A single-file tiny target carrying an array of arrays, which this llama.cpp's GGUF reader refuses
    ("key '...' has invalid GGUF type 9": type 9 is ARRAY, an array's items may not be arrays)."""
    target = write_target(folder, name="tiny-nested")
    inner = GGUFArray(GGUFValueType.INT32, (1, 2))
    add_raw_kvs(target, [encode_kv(NESTED, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.ARRAY, (inner,)))])
    return target


@pytest.mark.llama
def test_llama_cpp_refusal_names_its_cause_and_the_target_refused_too(nemotron_draft0: Path, tmp_path: Path) -> None:
    target = nested_array_target(tmp_path / "target")
    composite = compose(target, nemotron_draft0, tmp_path / "composite", progress=False).output_paths[0]
    report = verify(composite, target=target, llama=True, progress=False)
    llama, build = report.check("llama.cpp"), report.llama.llama_cpp_build if report.llama else None
    cause = f"key '{NESTED}' has invalid GGUF type 9"
    assert llama.status == "fail"
    assert llama.detail == (
        f"llama.cpp refused it: {cause}; the target {target} is refused by this llama.cpp too: {cause}; checked with "
        f"{build}"
    )


@pytest.mark.llama
def test_llama_cpp_refusal_of_a_composite_whose_target_loads_blames_the_composite(broken: list[Path],
                                                                                  nemotron_split: Path) -> None:
    key = f"{ARCH}.feed_forward_length"
    rewrite(broken[0], kvs={key: encode_kv(key, GGUFValueType.ARRAY, [0, 0, 256], GGUFValueType.INT32)})
    report = verify(broken[0], target=nemotron_split, llama=True, progress=False)
    build = report.llama.llama_cpp_build if report.llama else None
    assert report.check("llama.cpp").detail == (
        f"llama.cpp refused it: error loading model hyperparameters: key {key} has wrong array length; expected 4, "
        f"got 3; checked with {build}"
    )


#: llama.cpp's log (llama-cpp-python 0.3.36) loading a file with an array of arrays, as the check's child kept it.
NESTED_LOG = """gguf_init_from_reader: key 'general.nested' has invalid GGUF type 9
gguf_init_from_reader: failed to read key-value pairs
llama_model_load: error loading model: llama_model_loader: failed to load model from /tmp/t/tiny-nested.gguf
llama_model_load_from_file_impl: failed to load model
"""
#: The same, the array of arrays in shard 2 of a split set.
NESTED_SPLIT_LOG = """gguf_init_from_reader: key 'general.nested' has invalid GGUF type 9
gguf_init_from_reader: failed to read key-value pairs
llama_model_load: error loading model: llama_model_loader: failed to load GGUF split from /tmp/s/s-00002-of-00003.gguf
llama_model_load_from_file_impl: failed to load model
"""


def test_llama_reason_is_the_gguf_readers_first_complaint_not_the_loaders_wrapper() -> None:
    assert llama_reason(NESTED_LOG) == "key 'general.nested' has invalid GGUF type 9"


def test_llama_reason_names_the_split_the_gguf_reader_refused() -> None:
    assert llama_reason(NESTED_SPLIT_LOG) == (
        "key 'general.nested' has invalid GGUF type 9 (in /tmp/s/s-00002-of-00003.gguf)"
    )


def test_llama_reason_keeps_a_loader_cause_that_says_why() -> None:
    log = ("llama_model_load: error loading model: error loading model hyperparameters: key "
           "nemotron_h_moe.feed_forward_length has wrong array length; expected 4, got 3\n"
           "llama_model_load_from_file_impl: failed to load model\n")
    assert llama_reason(log) == (
        "error loading model hyperparameters: key nemotron_h_moe.feed_forward_length has wrong array length; "
        "expected 4, got 3"
    )


def test_llama_reason_does_not_take_ggmls_failed_to_load_model_with_a_why_for_a_wrapper() -> None:
    log = ("gguf_init_from_reader: failed to load model: this GGUF file version 50331648 is extremely large, is there "
           "a mismatch between the host and model endianness?\n"
           "llama_model_load: error loading model: llama_model_loader: failed to load model from /tmp/m.gguf\n")
    assert llama_reason(log) == ("failed to load model: this GGUF file version 50331648 is extremely large, is there "
                                 "a mismatch between the host and model endianness?")
