"""``verify`` of an MTP-only file proves it as a draft instead of refusing it (issue 21, item 17).

Its structure (NextN blocks complete, token_embd/output_norm present and output unless tied, shapes that
fit its own metadata), with ``--target`` its fit to that model (width, token_embd/output shapes,
vocabulary count and token list), and llama.cpp loads a sidecar as a drafter and runs the MTP decode step
through each NextN block -- never a trunk decode, which has no graph in an MTP-only file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import rewrite_gguf

from gguf_mtp.check.verify import verify
from gguf_mtp.cli import main
from gguf_mtp.constants import KEY_TOKENS
from gguf_mtp.format.header import GGUFArray, encode_kv
from gguf_mtp.jobs.extract import extract
from gguf_mtp.testing.server_models import with_test_tokenizer
from gguf_mtp.testing.tiny_models import GLM4MOE, TinyHparams, add_raw_kvs, write_draft, write_target


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("verify-draft")


@pytest.fixture(scope="module")
def target(root: Path) -> Path:
    return write_target(root / "target", shards=2, name="Tiny-Q4")


@pytest.fixture(scope="module")
def sidecar(root: Path) -> Path:
    """What ``extract --standalone`` writes from a model with MTP: blk.3 and token_embd/output_norm/output."""
    model = write_target(root / "with-mtp", with_nextn=True, name="Tiny-Q8_0", quant="Q8_0")
    return extract(model, root / "mtp-Tiny.gguf", standalone=True, progress=False).output


def _details(report_json: dict) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["status"], c["detail"]) for c in report_json["checks"]}


def test_a_sidecar_is_proved_as_a_draft_beside_its_target(
    sidecar: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", str(sidecar), "--target", str(target), "--no-llama", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "mtp-draft" and report["ok"] is True
    checks = _details(report)
    assert list(checks) == [
        "files", "split keys", "split.tensors.count", "tensor names", "tensor data", "per-layer arrays",
        "NextN tensors", "draft globals", "target fit", "llama.cpp",
    ]
    assert checks["draft globals"] == (
        "pass",
        "token_embd.weight Q8_0 [512, 512]; output_norm.weight F32 [512]; output.weight Q8_0 [512, 512]; "
        "nemotron_h_moe.embedding_length 512, 512 tokens: loadable beside its target as the drafter",
    )
    status, detail = checks["target fit"]
    assert status == "pass" and "nemotron_h_moe.embedding_length 512, 512 tokens" in detail
    assert "token_embd.weight [512, 512] (Q8_0; the target's is Q4_K)" in detail
    assert "target tensors" not in checks and "target metadata" not in checks  # not made of the target


def test_a_draft_of_another_vocabulary_does_not_fit_the_target(
    root: Path, target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = write_draft(root / "other-vocab.gguf", block="N", with_globals=True, hparams=TinyHparams(n_vocab=768))
    assert main(["verify", str(other), "--target", str(target), "--no-llama", "--json"]) == 2
    checks = _details(json.loads(capsys.readouterr().out))
    assert checks["target fit"] == (
        "fail",
        "the draft's vocabulary has 768 tokens, the target's 512; token_embd.weight is [512, 768] in the draft, "
        "[512, 512] in the target; output.weight is [512, 768] in the draft, [512, 512] in the target",
    )
    assert checks["draft globals"][0] == "pass"  # consistent in itself


def test_a_draft_of_another_token_list_does_not_fit_the_target(root: Path, target: Path, sidecar: Path) -> None:
    ours = rewrite_gguf(sidecar, root / "tokens" / "mtp.gguf")
    theirs = write_target(root / "tokens-target", name="T")

    def tokens(prefix: str) -> list:
        items = tuple(f"{prefix}{i}" for i in range(512))
        return [encode_kv(KEY_TOKENS, GGUFValueType.ARRAY, GGUFArray(GGUFValueType.STRING, items))]

    add_raw_kvs(ours, tokens("a"))
    add_raw_kvs(theirs, tokens("b"))
    fit = verify(ours, target=theirs, llama=False, progress=False).check("target fit")
    assert fit.ok is False
    assert fit.detail.startswith("tokenizer.ggml.tokens differ (sha256 ")
    same = write_target(root / "same-tokens", name="T")
    add_raw_kvs(same, tokens("a"))
    assert "the same token list" in verify(ours, target=same, llama=False, progress=False).check("target fit").detail


def test_a_draft_of_another_architecture_does_not_fit(sidecar: Path, root: Path) -> None:
    glm = write_target(root / "glm", family=GLM4MOE)
    fit = verify(sidecar, target=glm, llama=False, progress=False).check("target fit")
    assert (fit.ok, fit.detail) == (False, "the draft is for architecture 'nemotron_h_moe', the target is 'glm4moe'")


def test_a_sidecar_without_output_norm_fails_in_one_line(sidecar: Path, root: Path) -> None:
    broken = rewrite_gguf(sidecar, root / "no-norm" / "mtp.gguf", drop_tensors=("output_norm.weight", "output.weight"))
    report = verify(broken, llama=False, progress=False)
    assert [c.name for c in report.failures] == ["draft globals"]
    assert report.check("draft globals").detail == (
        "carries token_embd.weight but no output_norm.weight: llama.cpp cannot load it as a drafter"
    )


def test_a_tied_output_head_is_accepted(sidecar: Path, root: Path) -> None:
    tied = rewrite_gguf(sidecar, root / "tied" / "mtp.gguf", drop_tensors=("output.weight",))
    report = verify(tied, llama=False, progress=False)
    assert report.ok, report.describe()
    assert "no output.weight (tied to token_embd.weight)" in report.check("draft globals").detail


def test_a_bare_draft_is_a_draft_for_compose(root: Path, target: Path) -> None:
    bare = write_draft(root / "bare.gguf", block="N")
    report = verify(bare, target=target, llama=None, progress=False)
    assert report.ok and report.kind == "mtp-draft"
    assert report.check("draft globals").detail.startswith("none: a draft for compose")
    llama = report.check("llama.cpp")
    assert llama.status == "skip" and "runs only inside its composite" in llama.detail
    assert verify(bare, llama=True, progress=False).check("llama.cpp").status == "fail"  # required, cannot run


def test_draft_is_refused_for_a_draft_in_one_line(
    sidecar: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["verify", str(sidecar), "--draft", str(sidecar), "--no-llama"]) == 2
    assert capsys.readouterr().err == (
        f"gguf-mtp: error: {sidecar}: --draft compares a composite with the draft it was made from, but this file "
        "is itself an MTP draft (to check it beside its model, give that as --target)\n"
    )


# ------------------------------------------------------------------------------------------ llama.cpp


@pytest.mark.llama
def test_llama_cpp_runs_a_sidecar_as_a_drafter_without_a_trunk_decode(sidecar: Path, target: Path) -> None:
    report = verify(sidecar, target=target, llama=True, progress=False)
    assert report.ok, report.describe()
    assert report.llama is not None
    assert (report.llama.trunk_decode_ok, report.llama.mtp_decode_ok, report.llama.mtp_blocks_decoded) == (
        None,
        True,
        1,
    )
    assert report.check("llama.cpp").detail == (
        "llama.cpp loaded it: n_layer=3, n_layer_nextn=1, MTP decode ok on the target's hidden rows; checked with "
        f"{report.llama.llama_cpp_build}")


@pytest.mark.llama
def test_llama_cpp_runs_a_sidecar_with_a_tied_output_head(sidecar: Path, root: Path) -> None:
    tied = rewrite_gguf(sidecar, root / "tied-llama" / "mtp.gguf", drop_tensors=("output.weight",))
    report = verify(tied, llama=True, progress=False)
    assert report.ok, report.describe()
    assert report.llama is not None and report.llama.mtp_blocks_decoded == 1


@pytest.mark.llama
def test_a_draft_llama_cpp_cannot_run_through_every_nextn_block_fails(root: Path) -> None:
    # nemotron_h_moe's MTP graph supports one NextN block: a draft declaring two is not usable as one.
    two = write_draft(root / "two-blocks.gguf", block="N", with_globals=True, nextn=2)
    report = verify(two, llama=True, progress=False)
    llama = report.check("llama.cpp")
    assert llama.status == "fail" and "n_layer_nextn=2" in llama.detail
    assert report.llama is not None and report.llama.trunk_decode_ok is None and report.llama.mtp_blocks_decoded == 0


def test_the_bench_hint_of_a_sidecar_benches_its_target_with_it_and_a_bare_draft_gets_none(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a target bench can run (with a tokenizer: issue 29 item 15), and its sidecar (the same tokenizer)
    target = with_test_tokenizer(write_target(root / "target-1", shards=1, name="Tiny-Q4"), root / "tokenized.gguf")
    with_mtp = write_target(root / "with-mtp-1", with_nextn=True, name="Tiny-Q8_0", quant="Q8_0")
    source = with_test_tokenizer(with_mtp, root / "tokenized-mtp.gguf")
    sidecar = extract(source, root / "mtp-tokenized.gguf", standalone=True, progress=False).output
    assert main(["verify", str(sidecar), "--target", str(target), "--no-llama"]) == 0
    assert capsys.readouterr().out.splitlines()[-2] == (  # the verdict stays the last line
        f"measure what MTP gains on your machine: gguf-mtp bench {target} --draft {sidecar} --server "
        "PATH/TO/llama-server"
    )
    bare = write_draft(root / "bare-hint.gguf")
    assert main(["verify", str(bare), "--no-llama"]) == 0
    assert "gguf-mtp bench" not in capsys.readouterr().out
