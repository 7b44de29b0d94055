"""``compose --replace-head`` and ``graft --replace-head``: a target's own (low-type) head replaced in one pass.

The result must be byte for byte what ``strip`` followed by ``compose`` (or ``graft``) write: on every shard
shape the tiny families have (3 shards, a metadata-only first shard, one file at alignment 64, the NextN
block in the middle of a converted set, 2-shard glm4moe), with and without ``outtype``; also when the block
count changes (1 -> a 3-block chain and back), and llama.cpp runs the result's MTP decode.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import file_hashes, shard_files

from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.cli import main
from gguf_mtp.errors import IncompatibleDraftError
from gguf_mtp.files.kernel_copy import SHARE_BLOCK
from gguf_mtp.format.header import GGUFArray, encode_kv, read_header
from gguf_mtp.format.layout import placements
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.graft import graft
from gguf_mtp.jobs.replace_head import VIRTUAL_FOLDER
from gguf_mtp.jobs.strip import strip
from gguf_mtp.testing.tiny_models import GLM4MOE, TinyHparams, relabel_arch, write_draft, write_target


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("replace_head")


@pytest.fixture(scope="module")
def q2k_nemotron_draft(work: Path) -> Path:
    """A nemotron head quantized to Q2_K: what a quantizer that ignored the layer ships."""
    return write_draft(work / "drafts" / "nemotron-q2_k.gguf", quant="Q2_K", seed=21)


@pytest.fixture(scope="module")
def q2k_glm_draft(work: Path) -> Path:
    return write_draft(work / "drafts" / "glm-q2_k.gguf", family=GLM4MOE, quant="Q2_K", seed=22)


#: shape -> how the model with a low-type head is made (from the session's trunk fixtures, or as a converter
#: writes it), and which replacement draft fixture fits it.
SHAPES = ("nemotron-3-shards", "nemotron-metadata-only-first", "nemotron-one-file-align-64",
          "nemotron-converted-head-mid-set", "glm4moe-2-shards")


@pytest.fixture(scope="module", params=SHAPES)
def shipped(request: pytest.FixtureRequest, work: Path) -> tuple[Path, Path]:
    """(a model that ships with a Q2_K head, a better head for it)."""
    shape = request.param
    out = work / "shipped" / shape
    if shape == "nemotron-converted-head-mid-set":
        model = write_target(out, with_nextn=True, shards=3, quant="Q2_K", name="Nemotron-Q2_K-MTP", seed=23)
        return model, request.getfixturevalue("nemotron_draft0")
    if shape == "glm4moe-2-shards":
        trunk, low, good = "glm_target", "q2k_glm_draft", "glm_draft"
    else:
        trunk = {"nemotron-3-shards": "nemotron_split", "nemotron-metadata-only-first": "nemotron_metaonly",
                 "nemotron-one-file-align-64": "nemotron_single"}[shape]
        low, good = "q2k_nemotron_draft", "nemotron_draft0"
    model = compose(request.getfixturevalue(trunk), request.getfixturevalue(low), out, progress=False)
    return model.output_paths[0], request.getfixturevalue(good)


def _strip_then_compose(model: Path, draft: Path, out: Path, **options: object) -> Path:
    trunk = strip(model, out / "trunk", progress=False).output_paths[0]
    compose(trunk, draft, out / "composed", progress=False, **options)  # type: ignore[arg-type]
    return out / "composed"


@pytest.mark.parametrize("outtype", [None, "q8_0"])
def test_replace_head_equals_strip_then_compose_byte_for_byte(
    shipped: tuple[Path, Path], outtype: str | None, tmp_path: Path
) -> None:
    model, draft = shipped
    before = file_hashes(model.parent)
    report = compose(model, draft, tmp_path / "replaced", outtype=outtype, replace_head=True, progress=False)
    expected = _strip_then_compose(model, draft, tmp_path / "two-steps", outtype=outtype)
    assert file_hashes(tmp_path / "replaced") == file_hashes(expected)
    assert file_hashes(model.parent) == before  # the input is untouched
    # One pass: every byte comes from the model or the draft, never from the trunk-only set it stands for.
    sources = {s for output in report.plan.outputs for s in output.sources}
    assert sources <= {*shard_files(model), draft} and not any(VIRTUAL_FOLDER in str(s) for s in sources)
    # Zero-copy where the file system shares extents: every range read from the model lands in step with it.
    from_model = [(at, r) for o in report.plan.outputs for at, r in placements(o) if r.source in shard_files(model)]
    assert from_model and all((at - r.offset) % SHARE_BLOCK == 0 for at, r in from_model)
    assert [p.name for p in report.output_paths] == [p.name for p in shard_files(model)]
    assert not any(c.key.endswith((".block_count", ".nextn_predict_layers", "split.tensors.count"))
                   for c in report.plan.kv_changes)  # one block for one: the counts stay
    replaced = report.plan.replaced
    assert replaced is not None and replaced.head.main_type == "Q2_K" and replaced.count == 1
    assert report.plan.head.main_type == ("Q8_0" if outtype else report.plan.head.main_type)


def test_the_plan_says_what_is_replaced_old_types_and_size_to_new(
    shipped: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, draft = shipped
    rc = main(["compose", str(model), str(draft), "--replace-head", "-o", str(tmp_path / "out"), "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and not (tmp_path / "out").exists()
    line = next(line for line in out.splitlines() if line.startswith("replace: "))
    old, new = line.split(" -> ")
    assert "Q2_K head" in old and "blk." in new and "Q2_K" not in new.split("(")[1].split(" head")[0]
    rc = main(["compose", str(model), str(draft), "--replace-head", "-o", str(tmp_path / "out"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["replaced_head"]["type"] == "Q2_K" and report["replaced_head"]["bytes"] > 0
    assert report["tensors"]["total"] == sum(len(read_header(p).tensors) for p in shard_files(tmp_path / "out"
                                                                                               / model.name))


@pytest.fixture(scope="module")
def donors(work: Path) -> dict[str, Path]:
    """Q8_0 models with their NextN block (graft's sources), by architecture."""
    return {
        "nemotron_h_moe": write_target(work / "donors" / "nemotron", with_nextn=True, quant="Q8_0", name="N-Q8_0",
                                       seed=31),
        "glm4moe": write_target(work / "donors" / "glm", family=GLM4MOE, with_nextn=True, quant="Q8_0",
                                name="G-Q8_0", seed=32),
    }


@pytest.mark.parametrize("shipped", ["nemotron-3-shards", "nemotron-converted-head-mid-set", "glm4moe-2-shards"],
                         indirect=True)
@pytest.mark.parametrize("outtype", [None, "q4_0"])
def test_graft_replace_head_equals_strip_then_graft(
    shipped: tuple[Path, Path], outtype: str | None, donors: dict[str, Path], tmp_path: Path
) -> None:
    model, _ = shipped
    donor = donors[read_header(model).get("general.architecture")]
    report = graft(donor, model, tmp_path / "replaced", outtype=outtype, replace_head=True, verify=False,
                   progress=False)
    trunk = strip(model, tmp_path / "trunk", progress=False).output_paths[0]
    graft(donor, trunk, tmp_path / "two-steps", outtype=outtype, verify=False, progress=False)
    assert file_hashes(tmp_path / "replaced") == file_hashes(tmp_path / "two-steps")
    sources = {s for output in report.plan.outputs for s in output.sources}
    assert sources <= {*shard_files(model), *shard_files(donor)}
    assert report.to_dict()["replaced_head"]["type"] == "Q2_K"


# ------------------------------------------------------------------------------------- a different block count

SWA = "mimo2.attention.sliding_window_pattern"


def _swa(values: tuple[int, ...]) -> object:
    return encode_kv(SWA, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.INT32, values))


@pytest.fixture(scope="module")
def chain(work: Path) -> dict[str, Path]:
    """MiMo-V2-shaped files (llama.cpp chains its NextN blocks): a model shipped with one Q2_K NextN block, a
    3-block head and a 1-block head, each with its per-layer SWA entries (tiny glm4moe files relabelled)."""
    one = write_target(work / "chain" / "src", family=GLM4MOE, with_nextn=True, quant="Q2_K", name="one", seed=41)
    three = write_draft(work / "chain" / "src" / "d3.gguf", family=GLM4MOE, nextn=3, quant="Q8_0", seed=42)
    single = write_draft(work / "chain" / "src" / "d1.gguf", family=GLM4MOE, quant="Q8_0", seed=43)
    return {
        "model": relabel_arch(one, work / "chain" / "model" / "MiMo-Q2_K.gguf", "mimo2", set_kvs=[_swa((0, 1, 1))]),
        "draft3": relabel_arch(three, work / "chain" / "mtp-x3.gguf", "mimo2", set_kvs=[_swa((1, 1, 1))]),
        "draft1": relabel_arch(single, work / "chain" / "mtp-x1.gguf", "mimo2", set_kvs=[_swa((1,))]),
    }


def test_one_block_replaced_by_a_three_block_chain_and_back_equals_strip_then_compose(
    chain: dict[str, Path], tmp_path: Path
) -> None:
    three = compose(chain["model"], chain["draft3"], tmp_path / "three", replace_head=True, progress=False)
    assert file_hashes(tmp_path / "three") == file_hashes(
        _strip_then_compose(chain["model"], chain["draft3"], tmp_path / "three-by-hand"))
    header = read_header(three.output_paths[0])
    assert (header.get("mimo2.block_count"), header.get("mimo2.nextn_predict_layers")) == (5, 3)
    assert header.get(SWA) == [0, 1, 1, 1, 1]
    assert three.plan.replaced is not None and three.plan.replaced.count == 1 and three.plan.nextn_blocks == 3
    # The plan's metadata changes are the target's to the output's, not the trunk-only set's in between.
    changes = sorted((c.key, c.old, c.new) for c in three.plan.kv_changes)
    assert changes == [("mimo2.attention.sliding_window_pattern", [0, 1, 1], [0, 1, 1, 1, 1]),
                       ("mimo2.block_count", 3, 5), ("mimo2.nextn_predict_layers", 1, 3)]

    back = compose(three.output_paths[0], chain["draft1"], tmp_path / "back", replace_head=True, progress=False)
    assert file_hashes(tmp_path / "back") == file_hashes(
        _strip_then_compose(three.output_paths[0], chain["draft1"], tmp_path / "back-by-hand"))
    header = read_header(back.output_paths[0])
    assert (header.get("mimo2.block_count"), header.get("mimo2.nextn_predict_layers")) == (3, 1)
    assert header.get(SWA) == [0, 1, 1] and back.plan.replaced is not None and back.plan.replaced.count == 3


def test_three_blocks_replaced_by_one_in_a_split_set_updates_the_split_counts(
    glm_converted3: Path, glm_draft: Path, tmp_path: Path
) -> None:
    report = compose(glm_converted3, glm_draft, tmp_path / "one", replace_head=True, progress=False)
    assert file_hashes(tmp_path / "one") == file_hashes(
        _strip_then_compose(glm_converted3, glm_draft, tmp_path / "by-hand"))
    files = shard_files(report.output_paths[0])
    total = sum(len(read_header(p).tensors) for p in files)
    assert all(read_header(p).get("split.tensors.count") == total for p in files)
    assert read_header(files[0]).get("glm4moe.nextn_predict_layers") == 1


def test_a_head_with_more_blocks_than_the_architecture_runs_is_refused(
    glm_target: Path, glm_draft: Path, glm_draft3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = compose(glm_target, glm_draft, tmp_path / "model", progress=False).output_paths[0]
    with pytest.raises(IncompatibleDraftError, match=r"3 NextN blocks, but llama\.cpp's glm4moe MTP graph runs "
                                                     r"exactly 1 \(src/models/glm4-moe\.cpp"):
        compose(model, glm_draft3, tmp_path / "out", replace_head=True, progress=False)
    rc = main(["compose", str(model), str(glm_draft3), "--replace-head", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and str(glm_draft3) in err and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ bad input


def _one_line_refusal(args: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> str:
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("gguf-mtp: error: "), err
    assert not out.exists()
    return err


def test_replace_head_on_a_target_without_a_head_points_to_plain_compose(
    nemotron_split: Path, nemotron_draft0: Path, work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    err = _one_line_refusal(["compose", str(nemotron_split), str(nemotron_draft0), "--replace-head", "-o", str(out)],
                            capsys, out)
    assert str(nemotron_split) in err and "no NextN block to replace" in err
    assert "leave out --replace-head, a plain compose adds one" in err
    donor = write_target(work / "bad" / "donor", with_nextn=True, quant="Q8_0", name="D")
    err = _one_line_refusal(["graft", "--from", str(donor), "--into", str(nemotron_split), "--replace-head", "-o",
                             str(out)], capsys, out)
    assert "a plain graft adds one" in err


def test_a_target_with_a_head_is_refused_without_the_flag_and_the_message_names_it(
    shipped: tuple[Path, Path], donors: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, draft = shipped
    out = tmp_path / "out"
    err = _one_line_refusal(["compose", str(model), str(draft), "-o", str(out)], capsys, out)
    assert "already has 1 NextN block" in err and "--replace-head" in err
    donor = donors[read_header(model).get("general.architecture")]
    err = _one_line_refusal(["graft", "--from", str(donor), "--into", str(model), "-o", str(out)], capsys, out)
    assert "already has 1 NextN block" in err and "--replace-head" in err


@pytest.fixture(scope="module")
def nemotron_shipped(nemotron_split: Path, q2k_nemotron_draft: Path, work: Path) -> Path:
    return compose(nemotron_split, q2k_nemotron_draft, work / "bad" / "model", progress=False).output_paths[0]


@pytest.mark.parametrize("wrong", ["architecture", "width", "vocabulary"])
def test_a_draft_for_another_architecture_width_or_vocabulary_is_one_line(
    wrong: str, nemotron_shipped: Path, glm_draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nemotron_shipped
    draft = {
        "architecture": glm_draft,
        "width": write_draft(tmp_path / "w.gguf", hparams=TinyHparams(n_embd=768)),
        "vocabulary": write_draft(tmp_path / "v.gguf", hparams=TinyHparams(n_vocab=1024)),
    }[wrong]
    out = tmp_path / "out"
    err = _one_line_refusal(["compose", str(model), str(draft), "--replace-head", "-o", str(out)], capsys, out)
    assert str(draft) in err and {"architecture": "architecture", "width": "embedding_length",
                                  "vocabulary": "1024 tokens"}[wrong] in err


# ------------------------------------------------------------------------------------------------ llama.cpp


@pytest.mark.slow
@pytest.mark.llama
@pytest.mark.parametrize("shipped", ["nemotron-3-shards", "glm4moe-2-shards"], indirect=True)
def test_llama_cpp_runs_the_replaced_heads_mtp_decode(
    shipped: tuple[Path, Path], donors: dict[str, Path], tmp_path: Path
) -> None:
    model, draft = shipped
    report = compose(model, draft, tmp_path / "out", outtype="q8_0", replace_head=True, verify=True, progress=False)
    assert report.verification is not None and report.verification.ok, report.verification.describe()
    check = check_with_llama(report.output_paths[0])
    assert check.ok and check.mtp_decode_ok and check.n_layer_nextn == 1, check.summary()
    # graft's verification: the new head's bytes against the source's, and llama.cpp's MTP decode
    grafted = graft(donors[read_header(model).get("general.architecture")], model, tmp_path / "graft",
                    replace_head=True, verify=True, progress=False)
    assert grafted.ok and grafted.verification is not None, grafted.outcome_lines()
    llama = grafted.verification.llama
    assert llama is not None and llama.mtp_decode_ok, grafted.verification.describe()
