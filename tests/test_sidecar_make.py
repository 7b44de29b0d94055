"""Sidecars made from GGUFs (issue 39 items 2 and 3).

Item 2: a quant that carries a head (here a composite gguf-mtp made) gives a standalone sidecar with
``extract --standalone --embd-type``; ``verify SIDECAR --target TRUNK`` proves it through llama.cpp as a sidecar of
a trunk of *another* quant type of the same model: the sidecar's MTP decode runs on the hidden rows of that trunk's
decode, as llama-server pairs them, and fails when the trunk's width or vocabulary differ.

Item 3: a "shared" sidecar (unsloth's form, :func:`gguf_mtp.testing.tiny_models.write_shared_sidecar`: no
``token_embd``/``output_norm``/``output``, ``{arch}.nextn_shared_target_tensors = true``) plus the user's trunk
gives, with ``extract --standalone --target TRUNK``, a sidecar upstream llama.cpp loads: the trunk's tensors copied
byte for byte (or re-typed with ``--embd-type``), the trunk's tokenizer, the unsloth key left out. A trunk of another
model is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguf_mtp.check.verify import verify
from gguf_mtp.cli import main
from gguf_mtp.format.header import read_header
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.extract import extract
from gguf_mtp.testing.tiny_models import GLM4MOE, with_hparams, write_draft, write_shared_sidecar, write_target

GLOBALS = ("token_embd.weight", "output_norm.weight", "output.weight")
SHARED_KEY = "nemotron_h_moe.nextn_shared_target_tensors"


def _tensor_bytes(first: Path) -> dict[str, tuple[str, bytes]]:
    """Every tensor of a (split) model: name -> (type, bytes)."""
    files = sorted(first.parent.glob(first.name.replace("00001-of", "*-of"))) if "-00001-of-" in first.name else [first]
    found = {}
    for path in files:
        header = read_header(path)
        with open(path, "rb") as f:
            for t in header.tensors:
                f.seek(header.data_offset + t.offset)
                found[t.name] = (t.type_name, f.read(t.nbytes))
    return found


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sidecarmake")


@pytest.fixture(scope="module")
def trunk(root: Path) -> Path:
    """The user's trunk: the tiny model at another quant type (Q4_K), in two shards, without a head."""
    return write_target(root / "Q4_K", name="Tiny-Q4_K", quant="Q4_K", shards=2, seed=5)


@pytest.fixture(scope="module")
def composite(root: Path) -> Path:
    """A Q8_0 composite gguf-mtp made: a Q8_0 quant in three shards with a Q8_0 head spliced in."""
    target = write_target(root / "Q8_0", name="Tiny-Q8_0", quant="Q8_0", shards=3)
    draft = write_draft(root / "mtp-draft.gguf", quant="Q8_0")
    return compose(target, draft, root / "composite", progress=False).output_paths[0]


@pytest.fixture(scope="module")
def shared(root: Path) -> Path:
    return write_shared_sidecar(root / "mtp-Tiny-shared-Q8_0.gguf")


def _other_trunks(root: Path) -> dict[str, Path]:
    return {
        "vocabulary": write_target(root / "vocab", name="Vocab-768", quant="Q4_K", hparams=with_hparams(n_vocab=768)),
        "width": write_target(root / "width", name="Width-768", quant="Q4_K", hparams=with_hparams(n_embd=768)),
    }


# ------------------------------------------------------------------------------------- item 2: from a composite


@pytest.mark.llama
def test_a_sidecar_of_a_q8_0_composite_drafts_on_the_hidden_rows_of_a_q4_k_trunk(
    composite: Path, trunk: Path, root: Path
) -> None:
    sidecar = root / "mtp-Tiny-Q4_0.gguf"
    assert main(["extract", str(composite), "--standalone", "--embd-type", "q4_0", "-o", str(sidecar)]) == 0
    report = verify(sidecar, target=trunk, llama=True, progress=False)
    assert report.ok and report.sidecar, report.describe()
    assert report.llama is not None and report.llama.beside == str(trunk)
    assert report.check("llama.cpp").detail == (
        "llama.cpp loaded it: n_layer=3, n_layer_nextn=1, MTP decode ok on the target's hidden rows; checked with "
        f"{report.llama.llama_cpp_build}")
    written = _tensor_bytes(sidecar)
    assert (written["token_embd.weight"][0], written["output.weight"][0]) == ("Q4_0", "Q4_0")
    assert {n: v for n, v in written.items() if n.startswith("blk.")} == {
        n: v for n, v in _tensor_bytes(composite).items() if n.startswith("blk.3.")}


@pytest.mark.llama
@pytest.mark.parametrize("differs", ["vocabulary", "width"])
def test_llama_cpp_refuses_a_sidecar_beside_a_trunk_of_another_vocabulary_or_width(
    composite: Path, root: Path, differs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sidecar = root / f"mtp-{differs}.gguf"
    extract(composite, sidecar, standalone=True, progress=False)
    other = _other_trunks(root / differs)[differs]
    report = verify(sidecar, target=other, llama=True, progress=False)
    assert not report.ok and report.check("target fit").ok is False
    llama_check = report.check("llama.cpp")
    assert llama_check.ok is False and "it is not a sidecar of this target" in llama_check.detail, llama_check.detail
    assert main(["verify", str(sidecar), "--target", str(other), "--no-llama"]) == 2
    assert "FAIL  target fit" in capsys.readouterr().out


# ----------------------------------------------------------------------------- item 3: completing a shared sidecar


def test_a_completed_shared_sidecar_carries_the_trunks_tensors_byte_for_byte_and_no_unsloth_key(
    shared: Path, trunk: Path, root: Path
) -> None:
    out = extract(shared, root / "mtp-Tiny-completed.gguf", standalone=True, target=trunk, progress=False).output
    got, theirs, head = _tensor_bytes(out), _tensor_bytes(trunk), _tensor_bytes(shared)
    assert sorted(got) == sorted([*head, *GLOBALS])
    assert {name: got[name] for name in GLOBALS} == {name: theirs[name] for name in GLOBALS}
    assert {name: got[name] for name in head} == head
    header, source = read_header(out), read_header(shared)
    assert header.get(SHARED_KEY) is None and source.get(SHARED_KEY) is True
    assert header.get("tokenizer.ggml.model") == read_header(trunk).get("tokenizer.ggml.model")
    assert header.tensors[0].name == "token_embd.weight"  # as llama.cpp's --mtp export orders them


def test_the_plan_says_what_comes_from_the_trunk(
    shared: Path, trunk: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = root / "mtp-plan.gguf"
    args = ["extract", str(shared), "--standalone", "--target", str(trunk), "-o", str(out), "--dry-run"]
    assert main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["from_trunk"] == list(GLOBALS)
    # the tokenizer is the trunk's, in place of the source's
    assert plan["left_out_kvs"] == ["tokenizer.ggml.model", SHARED_KEY]
    assert plan["added_kvs"] == ["tokenizer.ggml.model"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "with the trunk's token_embd.weight (Q4_K, " in text
    assert f"note: left out {SHARED_KEY}: upstream llama.cpp does not know it" in text
    assert not out.exists()


@pytest.mark.llama
def test_upstream_llama_cpp_runs_a_completed_shared_sidecar_beside_its_trunk_and_not_the_shared_one(
    shared: Path, trunk: Path, root: Path
) -> None:
    assert not verify(shared, target=trunk, llama=True, progress=False).sidecar  # no token_embd: not loadable
    out = extract(shared, root / "mtp-Tiny-Q4_0-completed.gguf", standalone=True, target=trunk, embd_type="q4_0",
                  progress=False).output
    report = verify(out, target=trunk, llama=True, progress=False)
    assert report.ok and report.sidecar, report.describe()
    assert report.llama is not None and report.llama.beside == str(trunk) and report.llama.mtp_decode_ok
    assert _tensor_bytes(out)["token_embd.weight"][0] == "Q4_0"


def test_a_shared_sidecar_without_its_trunk_is_refused_naming_target(
    shared: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["extract", str(shared), "--standalone", "-o", str(root / "none.gguf")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"gguf-mtp: error: {shared}: no token_embd.weight: a shared sidecar ({SHARED_KEY} = true) borrows it "
        "from the model it serves: give that model as --target to copy it in\n")
    assert not (root / "none.gguf").exists()


@pytest.mark.parametrize("other", ["vocabulary", "width", "blocks", "architecture"])
def test_a_trunk_of_another_model_is_refused_in_one_line(
    shared: Path, root: Path, other: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = root / f"other-{other}"
    trunks = {
        **_other_trunks(folder),
        "blocks": write_target(folder / "blocks", name="Four", quant="Q4_K", pattern="M*E*"),
        "architecture": write_target(folder / "glm", name="Glm", family=GLM4MOE),
    }
    reasons = {
        "vocabulary": "the draft's vocabulary has 512 tokens, the target's 768",
        "width": "nemotron_h_moe.embedding_length is 512 in the draft, 768 in the target",
        "blocks": "the trunk has 4 blocks, the head is blk.3 (the head of a 3-block trunk)",
        "architecture": "the draft is for architecture 'nemotron_h_moe', the target is 'glm4moe'",
    }
    out = folder / "out.gguf"
    assert main(["extract", str(shared), "--standalone", "--target", str(trunks[other]), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"gguf-mtp: error: {trunks[other]}: not a trunk of {shared}'s model: {reasons[other]}\n"
    assert not out.exists()


def test_target_needs_standalone(shared: Path, trunk: Path, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extract", str(shared), "--target", str(trunk), "-o", str(root / "draft.gguf")]) == 2
    assert capsys.readouterr().err.startswith("gguf-mtp: error: --target needs --standalone: ")
