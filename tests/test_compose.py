"""compose: the composite keeps every target byte, adds the draft block, and patches metadata right."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import file_hashes, reader_kvs, reader_tensors, shard_files

from gguf_mtp import IncompatibleDraftError, KVEditError, UnsafeOutputError, compose, plan, plan_compose
from gguf_mtp.cli import main
from gguf_mtp.format.header import read_header
from gguf_mtp.testing.tiny_models import GLM4MOE, TinyHparams, write_draft, write_target

ARCH = "nemotron_h_moe"


@pytest.fixture(params=["nemotron_split", "nemotron_metaonly", "nemotron_single"])
def target(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


def _draft_for(target: Path, models: Path) -> Path:
    """A blk.0 draft (with globals) fitting the target's trunk."""
    return write_draft(models / "drafts" / f"d0-{target.stem}.gguf", block=0, with_globals=True)


def test_every_target_tensor_keeps_its_bytes(target: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    report = compose(target, nemotron_draft0, tmp_path / "out")
    before = reader_tensors(target)
    after = reader_tensors(report.output_paths[0])
    for name, (ggml_type, shape, data) in before.items():
        assert after[name] == (ggml_type, shape, data), name


def test_draft_block_tensors_keep_their_bytes_under_the_new_name(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    draft = reader_tensors(nemotron_draft0)
    after = reader_tensors(report.output_paths[0])
    block_tensors = [n for n in draft if n.startswith("blk.0.")]
    assert len(block_tensors) == 18
    for name in block_tensors:
        assert after["blk.3." + name.removeprefix("blk.0.")] == draft[name]
    assert not any(n.startswith("blk.0.nextn") for n in after)


def test_blk_n_draft_is_kept_as_is(nemotron_split: Path, nemotron_draftN: Path, tmp_path: Path) -> None:
    report = compose(nemotron_split, nemotron_draftN, tmp_path / "out")
    assert report.plan.renamed[0][0] == report.plan.renamed[0][1]
    draft = reader_tensors(nemotron_draftN)
    after = reader_tensors(report.output_paths[0])
    assert all(after[name] == value for name, value in draft.items())


def test_draft_globals_are_left_out_and_reported(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    assert set(report.plan.dropped) == {"token_embd.weight", "output_norm.weight", "output.weight"}
    assert any("token_embd.weight" in note for note in report.notes)
    after = reader_tensors(report.output_paths[0])
    assert after["token_embd.weight"] == reader_tensors(nemotron_split)["token_embd.weight"]


def test_untouched_kvs_keep_type_value_and_order(target: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    report = compose(target, nemotron_draft0, tmp_path / "out")
    changed = {c.key for c in report.plan.kv_changes}
    for source, output in zip(shard_files(target), report.output_paths):
        before, after = read_header(source), read_header(output)
        kept = [k for k in before.kvs if k not in changed]
        assert [k for k in after.kvs if k in kept] == kept
        for key in kept:
            assert after.kvs[key].raw == before.kvs[key].raw, key
        # the independent reader agrees
        ours, theirs = reader_kvs(source), reader_kvs(output)
        for key in kept:
            assert theirs[key] == ours[key]


def test_block_count_grows_by_one_and_keeps_its_type(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    kvs = reader_kvs(report.output_paths[0])
    types, value = kvs[f"{ARCH}.block_count"]
    assert (types, value) == ([GGUFValueType.UINT32], 4)
    assert kvs[f"{ARCH}.nextn_predict_layers"] == ([GGUFValueType.UINT32], 1)


def test_per_layer_arrays_get_the_draft_block_values_not_the_last_trunk_layer(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    kvs = reader_kvs(report.output_paths[0])
    hp = TinyHparams()
    # trunk M,*,E: the last trunk layer is MoE (head_count_kv 0); the NextN block is attention AND MoE
    assert kvs[f"{ARCH}.attention.head_count_kv"] == (
        [GGUFValueType.ARRAY, GGUFValueType.INT32],
        [0, hp.n_head_kv, 0, hp.n_head_kv],
    )
    assert kvs[f"{ARCH}.feed_forward_length"][1] == [0, 0, hp.n_ff_exp, hp.n_ff_exp]


def test_split_tensors_count_is_total_in_every_shard(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    total = sum(len(read_header(p).tensors) for p in report.output_paths)
    assert total == 26 + 18
    for path in report.output_paths:
        assert reader_kvs(path)["split.tensors.count"] == ([GGUFValueType.INT32], total)


def test_draft_tensors_go_to_the_last_shard(nemotron_metaonly: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    report = compose(nemotron_metaonly, nemotron_draft0, tmp_path / "out")
    added = [f.added_tensors for f in report.plan.files]
    assert [len(a) for a in added] == [0, 0, 18]
    assert len(read_header(report.output_paths[0]).tensors) == 0  # metadata-only shard 1 stays so


def test_outputs_take_the_target_names_or_the_basename(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    default = compose(nemotron_split, nemotron_draft0, tmp_path / "a", dry_run=True)
    assert [p.name for p in default.output_paths] == [p.name for p in shard_files(nemotron_split)]
    named = compose(nemotron_split, nemotron_draft0, tmp_path / "b", basename="Model-MTP", dry_run=True)
    assert [p.name for p in named.output_paths] == [f"Model-MTP-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


def test_inputs_are_never_modified(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    before = file_hashes(nemotron_split.parent) | file_hashes(nemotron_draft0.parent)
    compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    assert file_hashes(nemotron_split.parent) | file_hashes(nemotron_draft0.parent) == before


def test_plan_is_pure_and_matches_what_is_written(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    planned = plan_compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert plan is plan_compose  # the name it had before, kept for existing callers
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    for planned_file, path in zip(planned.files, report.output_paths):
        assert os.path.getsize(path) == planned_file.output.size
        assert [t.name for t in read_header(path).tensors] == [t.name for t in planned_file.tensors]


def test_glm4moe_composes_through_the_same_path(glm_target: Path, glm_draft: Path, tmp_path: Path) -> None:
    report = compose(glm_target, glm_draft, tmp_path / "out")
    assert report.plan.block == 2 and len(report.plan.renamed) == 18
    after = reader_tensors(report.output_paths[0])
    assert all(after[n] == v for n, v in reader_tensors(glm_target).items())
    assert reader_kvs(report.output_paths[0])["glm4moe.nextn_predict_layers"][1] == 1


# ------------------------------------------------------------------------------------- refusals


def test_draft_of_another_architecture_is_refused(nemotron_split: Path, glm_draft: Path, tmp_path: Path) -> None:
    with pytest.raises(IncompatibleDraftError, match="architecture 'glm4moe'"):
        compose(nemotron_split, glm_draft, tmp_path / "out")


def test_draft_of_another_width_is_refused(nemotron_split: Path, tmp_path: Path) -> None:
    draft = write_draft(tmp_path / "wide.gguf", hparams=TinyHparams(n_embd=768))
    with pytest.raises(IncompatibleDraftError, match="embedding_length = 768"):
        compose(nemotron_split, draft, tmp_path / "out")


def test_draft_of_another_vocabulary_is_refused(nemotron_split: Path, tmp_path: Path) -> None:
    draft = write_draft(tmp_path / "vocab.gguf", hparams=TinyHparams(n_vocab=1024))
    with pytest.raises(IncompatibleDraftError, match="1024 tokens"):
        compose(nemotron_split, draft, tmp_path / "out")


def test_target_that_already_has_mtp_is_refused(nemotron_draft0: Path, tmp_path: Path) -> None:
    with_mtp = write_target(tmp_path / "mtp", with_nextn=True)
    with pytest.raises(IncompatibleDraftError, match="already has 1 NextN block"):
        compose(with_mtp, nemotron_draft0, tmp_path / "out")


def test_existing_output_is_refused_without_force(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    with pytest.raises(UnsafeOutputError, match=r"use force to replace it"):
        compose(nemotron_split, nemotron_draft0, tmp_path / "out")
    report = compose(nemotron_split, nemotron_draft0, tmp_path / "out", force=True)
    assert report.bytes_written == report.plan.bytes_to_write


# --------------------------------------------------------------------------------------------- CLI


def test_cli_dry_run_prints_the_plan_and_writes_nothing(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["compose", str(nemotron_split), str(nemotron_draft0), "-o", str(tmp_path / "out"), "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "would write" in out and "block_count (u32): 3 -> 4" in out and "+18 NextN" in out
    assert not (tmp_path / "out").exists()


def test_cli_json_report_is_machine_readable(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["compose", str(nemotron_split), str(nemotron_draft0), "-o", str(tmp_path / "out"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert report["tensors"] == {"target": 26, "added": 18, "removed": 0, "total": 44}
    assert report["bytes_written"] == sum(f["bytes"] for f in report["files"]) > 0
    changes = {(c["file"], c["key"]): (c["old"], c["new"]) for c in report["kv_changes"]}
    assert changes[(nemotron_split.name, f"{ARCH}.block_count")] == (3, 4)
    assert report["seconds"] >= 0


def test_cli_bad_input_is_one_line_and_exit_2(
    nemotron_split: Path, glm_draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["compose", str(nemotron_split), str(glm_draft), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and str(glm_draft) in err and "architecture" in err
    assert not (tmp_path / "out").exists()


def test_cli_missing_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compose", str(tmp_path / "nope.gguf"), str(tmp_path / "d.gguf"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == f"gguf-mtp: error: {tmp_path / 'nope.gguf'}: no such file"


def test_set_kv_changes_are_typed_and_reported(nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path) -> None:
    report = compose(
        nemotron_split,
        nemotron_draft0,
        tmp_path / "out",
        set_kv=["general.name=Tiny MTP", f"{ARCH}.expert_used_count=3", "general.note:str=unit test"],
    )
    kvs = reader_kvs(report.output_paths[0])
    assert kvs["general.name"] == ([GGUFValueType.STRING], "Tiny MTP")
    assert kvs[f"{ARCH}.expert_used_count"] == ([GGUFValueType.UINT32], 3)
    assert kvs["general.note"] == ([GGUFValueType.STRING], "unit test")
    changed = {c.key: (c.old, c.new) for c in report.plan.kv_changes}
    assert changed["general.name"] == ("tiny-nemotron_h_moe", "Tiny MTP")
    assert changed["general.note"] == (None, "unit test")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (f"{ARCH}.expert_used_count=two", "not an integer"),
        (f"{ARCH}.expert_used_count=-1", "does not fit u32"),
        (f"{ARCH}.expert_used_count:f32=2", "its type cannot change"),
        ("brand.new.key=1", "give its type"),
        ("brand.new.key:u7=1", "unknown type"),
        ("brand.new.key:f32=1e39", r"does not fit f32 \(f32 holds at most 3.403e\+38\)"),
        (f"{ARCH}.attention.head_count_kv=2", "arrays cannot be set"),
        ("split.count=4", "managed by compose"),
        (f"{ARCH}.block_count=9", "managed by compose"),
        ("gguf_mtp.pad:u8=1", "managed by compose"),
        ("gguf_mtp.set_id=abc", "managed by compose"),
        ("gguf_mtp.source:str=x", "managed by compose"),
        ("general.alignment=64", "managed by compose"),
        (f"{ARCH}.nextn_predict_layers=2", "must be 1"),
        ("no-equals-sign", "KEY=VALUE"),
    ],
)
def test_bad_set_kv_is_refused(
    spec: str, message: str, nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path
) -> None:
    with pytest.raises(KVEditError, match=message):
        compose(nemotron_split, nemotron_draft0, tmp_path / "out", set_kv=[spec])


def test_glm4moe_target_without_per_layer_arrays_needs_no_draft_values(tmp_path: Path) -> None:
    target = write_target(tmp_path / "glm1", family=GLM4MOE)
    draft = write_draft(tmp_path / "glm-d.gguf", family=GLM4MOE, block="N")
    report = compose(target, draft, tmp_path / "out")
    assert {c.key for c in report.plan.kv_changes} == {"glm4moe.block_count", "glm4moe.nextn_predict_layers"}


def test_every_managed_key_pattern_is_refused_in_one_line_naming_the_key(
    nemotron_split: Path, nemotron_draft0: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gguf_mtp.jobs.compose_plan import MANAGED_KEYS

    out = tmp_path / "out"
    for pattern, holds in MANAGED_KEYS:
        key = pattern.format(arch=ARCH).replace("*", "anything")
        argv = ["compose", str(nemotron_split), str(nemotron_draft0), "-o", str(out), "--set-kv", f"{key}:u32=1"]
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"gguf-mtp: error: --set-kv {key}:u32=1: {key} is managed by compose ({holds}) and cannot be set\n"
        )
        assert not out.exists()
