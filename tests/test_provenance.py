"""Provenance and refresh (issue 39 item 5): every card and the pipeline's state record the head and target repos at
their commits, the llama.cpp build of the proof and the gguf-mtp version; ``pipeline --if-changed`` compares them
with the Hub and does nothing when nothing moved, else makes again only what a moved source affects."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest
from support.hub_standin import FIRST_COMMIT, RecordingHub

from gguf_mtp import ParameterError
from gguf_mtp._version import __version__
from gguf_mtp.files.digests import FileDigest
from gguf_mtp.release.card import CardRequest, ModelFacts, Provenance, published_sources, render_model_card
from gguf_mtp.release.pipeline import STATE_NAME, run_pipeline
from gguf_mtp.release.pipeline.sources import AFFECTS, moved_sources
from gguf_mtp.release.pipeline.state import STAGES
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import write_target

TARGET_REPO = "unsloth/Tiny-Nemotron-GGUF"
HEAD_REPO = "nvidia/Tiny-Nemotron-MTPv2"
OUT_REPO = "me/Tiny-MTP"
PREFIX = "Tiny-Nemotron-UD-Q4_K_XL"
PATTERN = f"UD-Q4_K_XL/{PREFIX}-*-of-*.gguf"
HEAD_MOVED = "beef" + "1" * 36
TARGET_MOVED = "cafe" + "2" * 36


# ------------------------------------------------------------------------------------------- the card's record


def _facts() -> ModelFacts:
    return ModelFacts(architecture="nemotron_h_moe", name="Tiny", trunk_blocks=3, nextn_blocks=1, tensor_count=40,
                      nextn_tensors=12, nextn_types=("Q8_0",), nextn_bytes=1000)


def _card(provenance: Provenance) -> str:
    files = [FileDigest(Path("Tiny-MTP.gguf"), 1234, "ab" * 32)]
    return render_model_card(CardRequest(OUT_REPO, files, _facts(), "9.8.7", provenance=provenance))


PROVENANCE = Provenance(target_repo=TARGET_REPO, target_revision="1" * 40, head_source=HEAD_REPO,
                        head_revision="2" * 40, llama_cpp_build="llama.cpp 0c1e570 (ggml 0.25.3)")


def test_the_card_records_the_sources_a_refresh_reads_back() -> None:
    assert published_sources(_card(PROVENANCE)) == {
        "head_repo": HEAD_REPO, "head_commit": "2" * 40, "target_repo": TARGET_REPO, "target_commit": "1" * 40,
        "llama_cpp": "llama.cpp 0c1e570 (ggml 0.25.3)", "gguf_mtp": "9.8.7",
    }


def test_the_card_names_the_llama_cpp_build_of_the_proof_and_says_when_there_was_none() -> None:
    assert "| proved with | `llama.cpp 0c1e570 (ggml 0.25.3)`: `gguf-mtp verify` loaded" in _card(PROVENANCE)
    assert "| proved with | not recorded (not loaded by llama.cpp" in _card(Provenance(target_repo=TARGET_REPO))


def test_a_recorded_value_can_neither_close_the_comment_nor_add_a_line() -> None:
    hostile = Provenance(head_source="x -->\n# heading <script>", target_repo=TARGET_REPO)
    card = _card(hostile)
    (line,) = [line for line in card.splitlines() if line.startswith("<!-- gguf-mtp sources: ")]
    assert line.count("-->") == 1 and line.endswith(" -->") and "<script>" not in line
    assert published_sources(card)["head_repo"] == "x -->\n# heading <script>"  # type: ignore[index]


@pytest.mark.parametrize("text", [
    "# a README someone wrote\n",
    "<!-- gguf-mtp sources: {not json} -->\n",
    '<!-- gguf-mtp sources: ["a list"] -->\n',
    '<!-- gguf-mtp sources: {"head_commit": 7} -->\n',
    "<!-- gguf-mtp sources: {\"head_commit\": 1" + "0" * 5000 + "} -->\n",
])
def test_a_card_without_a_readable_record_records_no_sources(text: str) -> None:
    assert published_sources(text) is None


# ------------------------------------------------------------------------------------------- what moved (pure)

RECORDED: dict[str, str | None] = {
    "head_repo": HEAD_REPO, "head_commit": "2" * 40, "target_repo": TARGET_REPO, "target_commit": "1" * 40,
    "llama_cpp": "llama.cpp 0c1e570 (ggml 0.25.3)", "gguf_mtp": "0.1.0",
}


@pytest.mark.parametrize(("change", "moved"), [
    ({}, []),
    ({"head_commit": "3" * 40}, ["head"]),
    ({"head_repo": "other/Head"}, ["head"]),
    ({"target_commit": "4" * 40}, ["target"]),
    ({"llama_cpp": "llama.cpp 0ce8cd1 (ggml 0.26.0)"}, ["llama.cpp"]),
    ({"gguf_mtp": "0.2.0"}, ["gguf-mtp"]),
    ({"head_commit": "3" * 40, "llama_cpp": None}, ["head", "llama.cpp"]),
])
def test_a_source_moved_when_any_of_its_recorded_fields_differs(change: dict[str, str | None],
                                                                  moved: list[str]) -> None:
    assert [m.source for m in moved_sources(RECORDED, RECORDED | change)] == moved


def test_a_field_the_card_does_not_record_counts_as_moved() -> None:
    older = {k: v for k, v in RECORDED.items() if k != "llama_cpp"}
    assert [m.source for m in moved_sources(older, RECORDED)] == ["llama.cpp"]


def test_a_moved_head_leaves_the_target_alone_and_another_llama_cpp_only_the_proof() -> None:
    assert "target" not in AFFECTS["head"] and AFFECTS["target"] == STAGES
    assert AFFECTS["llama.cpp"] == ("verify", "publish")


# ------------------------------------------------------------------------------------------- the pipeline


@pytest.fixture(scope="module")
def target_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("target-repo")
    write_target(root / "UD-Q4_K_XL", shards=3, name=PREFIX)
    return root


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The head repo's checkpoint at each of its commits (the weights change between them)."""
    root = tmp_path_factory.mktemp("heads")
    return {FIRST_COMMIT: write_mtpv2_checkpoint(root / "first", seed=0),
            HEAD_MOVED: write_mtpv2_checkpoint(root / "moved", seed=1)}


@pytest.fixture
def hub(online: None, target_repo: Path, heads: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> RecordingHub:
    """The stand-in Hub holding the target repo; the head repo is served at the commit it is asked for."""
    from gguf_mtp.jobs import convert

    asked: list[str | None] = []

    def head_at_commit(source: Any, revision: str | None = None, **kwargs: Any) -> tuple[Path, None]:
        assert source == HEAD_REPO
        asked.append(revision)
        return heads[str(revision)], None

    monkeypatch.setattr(convert, "resolve_source", head_at_commit)
    stand_in = RecordingHub(source=target_repo)
    stand_in.head_revisions_asked = asked  # type: ignore[attr-defined]
    return stand_in


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def pipeline(hub: RecordingHub, tmp_path: Path, **kwargs: Any) -> Any:
    options: dict[str, Any] = dict(
        target_repo=TARGET_REPO, target_files=PATTERN, head_repo=HEAD_REPO, out_repo=OUT_REPO,
        work_dir=tmp_path / "work", cache_dir=tmp_path / "cache", api=hub, llama=False, progress=False, keep=True,
        say=lambda line: None,
    )
    return run_pipeline(**(options | kwargs))


def statuses(report: Any) -> dict[str, str]:
    return {s.name: s.status for s in report.stages}


def published(hub: RecordingHub) -> dict[str, str | None] | None:
    return published_sources(hub.files["README.md"]["data"].decode())


def test_a_published_card_records_both_sources_at_their_commits(hub: RecordingHub, tmp_path: Path) -> None:
    pipeline(hub, tmp_path)
    assert published(hub) == {"head_repo": HEAD_REPO, "head_commit": FIRST_COMMIT, "target_repo": TARGET_REPO,
                              "target_commit": FIRST_COMMIT, "llama_cpp": None, "gguf_mtp": __version__}
    assert hub.head_revisions_asked and set(hub.head_revisions_asked) == {FIRST_COMMIT}  # type: ignore[attr-defined]


def test_the_state_records_the_sources_the_run_was_made_from(hub: RecordingHub, tmp_path: Path) -> None:
    pipeline(hub, tmp_path)
    stages = json.loads((tmp_path / "work" / STATE_NAME).read_text())["stages"]
    assert (stages["target"]["detail"]["repo"], stages["target"]["detail"]["commit"]) == (TARGET_REPO, FIRST_COMMIT)
    assert (stages["draft"]["detail"]["head"], stages["draft"]["detail"]["revision"]) == (HEAD_REPO, FIRST_COMMIT)
    assert stages["verify"]["detail"]["llama_cpp"] is None  # not loaded by llama.cpp (llama=False)
    assert stages["publish"]["detail"]["gguf_mtp"] == __version__


def test_if_changed_does_nothing_when_no_source_moved(hub: RecordingHub, tmp_path: Path) -> None:
    pipeline(hub, tmp_path)
    calls, commits = len(hub.calls), list(hub.commits)
    report = pipeline(hub, tmp_path / "elsewhere", if_changed=True)
    assert report.describe() == [
        f"nothing moved: {OUT_REPO} was made from head {HEAD_REPO}@{FIRST_COMMIT[:12]}, target "
        f"{TARGET_REPO}@{FIRST_COMMIT[:12]}, llama.cpp none, gguf-mtp {__version__}"
    ]
    later = {c[0] for c in hub.calls[calls:]}
    assert later == {"model_info", "get_paths_info", "hf_hub_download"}  # the commits and the card: no download
    assert hub.commits == commits and not (tmp_path / "elsewhere").exists()
    assert report.to_dict()["if_changed"]["nothing_moved"] is True


def test_if_changed_makes_the_head_again_after_its_commit_moves_and_keeps_the_target(
    hub: RecordingHub, tmp_path: Path
) -> None:
    first = pipeline(hub, tmp_path)
    draft_before = first.draft.read_bytes()
    hub.repo_commits[HEAD_REPO] = HEAD_MOVED
    report = pipeline(hub, tmp_path, if_changed=True)
    assert statuses(report) == {"target": "reused", "draft": "redone", "compose": "redone", "verify": "redone",
                                "publish": "redone"}
    assert report.draft.read_bytes() != draft_before
    assert [c[0] for c in hub.calls].count("snapshot_download") == 1  # the target was not fetched again
    assert report.notes[0] == (f"moved: head {HEAD_REPO}@{FIRST_COMMIT[:12]} -> {HEAD_REPO}@{HEAD_MOVED[:12]}; "
                               "making again: draft, compose, verify, publish")
    assert published(hub)["head_commit"] == HEAD_MOVED  # type: ignore[index]


def test_if_changed_fetches_the_target_again_after_its_commit_moves(hub: RecordingHub, tmp_path: Path) -> None:
    pipeline(hub, tmp_path)
    hub.repo_commits[TARGET_REPO] = TARGET_MOVED
    report = pipeline(hub, tmp_path, if_changed=True)
    assert statuses(report)["target"] == "redone"
    downloads = [c for c in hub.calls if c[0] == "snapshot_download"]
    assert downloads[-1][2]["revision"] == TARGET_MOVED
    assert published(hub)["target_commit"] == TARGET_MOVED  # type: ignore[index]


def test_if_changed_dry_run_says_what_moved_and_what_it_would_make_again(hub: RecordingHub, tmp_path: Path) -> None:
    pipeline(hub, tmp_path)
    hub.repo_commits[HEAD_REPO] = HEAD_MOVED
    calls = len(hub.calls)
    report = pipeline(hub, tmp_path, if_changed=True, dry_run=True)
    assert report.to_dict()["if_changed"]["stages"] == ["draft", "compose", "verify", "publish"]
    assert report.describe()[-1] == "dry run: nothing was downloaded, written or uploaded"
    assert any(line.startswith("note: moved: head ") for line in report.describe())
    assert "snapshot_download" not in {c[0] for c in hub.calls[calls:]}


def test_if_changed_on_a_repo_never_published_makes_everything(hub: RecordingHub, tmp_path: Path) -> None:
    report = pipeline(hub, tmp_path, if_changed=True)
    assert set(statuses(report).values()) == {"ran"}
    assert report.to_dict()["if_changed"]["published"] is None


def test_if_changed_without_an_out_repo_is_refused_before_the_hub_is_asked(hub: RecordingHub, tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="give --out-repo"):
        pipeline(hub, tmp_path, if_changed=True, out_repo=None)
    assert hub.calls == []
    assert not (tmp_path / "work").exists()


def test_if_changed_with_a_local_head_folder_is_refused(hub: RecordingHub, tmp_path: Path,
                                                        heads: dict[str, Path]) -> None:
    with pytest.raises(ParameterError, match="is a local folder, which has none"):
        pipeline(hub, tmp_path, if_changed=True, head_repo=str(heads[FIRST_COMMIT]))


# ------------------------------------------------------------------------------------------- the llama.cpp build


@pytest.mark.llama
def test_the_llama_cpp_build_is_the_commit_of_the_loaded_ggml_library() -> None:
    import ctypes

    from llama_cpp import _ggml

    from gguf_mtp.check.llama_check import llama_cpp_build

    own = _ggml.libggml.ggml_commit  # llama-cpp-python's own ggml, opened directly
    own.restype = ctypes.c_char_p
    build = llama_cpp_build()
    assert build is not None and re.fullmatch(r"llama\.cpp \S+ \(ggml \S+\)", build)
    assert build.split()[1] == own().decode()


# ------------------------------------------------------------------------------------------- as a Hugging Face Job


def test_hf_job_passes_if_changed_to_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from support.hub_standin import JobsHub

    script = Path(__file__).resolve().parent.parent / "scripts" / "hf_job.py"
    spec = importlib.util.spec_from_file_location("hf_job_provenance", script)
    assert spec is not None and spec.loader is not None
    hf_job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf_job)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    api = JobsHub()
    arguments = ["--target-repo", TARGET_REPO, "--target-files", PATTERN, "--head-repo", HEAD_REPO,
                 "--out-repo", OUT_REPO, "--if-changed"]
    assert hf_job.main(["--no-mount-target", "--package", "gguf-mtp[llama] @ git+x", "--", *arguments], api=api) == 0
    (job,) = [c for c in api.calls if c[0] == "run_uv_job"]
    assert job[2]["script_args"] == ["--local", *arguments]
