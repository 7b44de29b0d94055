"""The real loader is the judge: llama.cpp loads every composite with its NextN block and runs it, and it
rejects composites that break a rule — proof that the oracle would catch our mistakes."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType
from helpers import copy_model, rewrite_gguf, shard_files

from gguf_mtp import compose
from gguf_mtp.gguf_header import encode_kv
from gguf_mtp.llama_check import check_with_llama
from gguf_mtp.tiny_models import GLM4MOE, write_draft

pytestmark = pytest.mark.llama
ARCH = "nemotron_h_moe"


@pytest.mark.parametrize(
    ("target_fixture", "draft_fixture", "trunk"),
    [
        ("nemotron_split", "nemotron_draft0", 3),
        ("nemotron_split", "nemotron_draftN", 3),
        ("nemotron_metaonly", "nemotron_draft0", 3),
        ("glm_target", "glm_draft", 2),
    ],
)
def test_llama_cpp_loads_the_composite_and_runs_the_nextn_block(
    target_fixture: str, draft_fixture: str, trunk: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    target, draft = request.getfixturevalue(target_fixture), request.getfixturevalue(draft_fixture)
    report = compose(target, draft, tmp_path / "out")
    check = check_with_llama(report.output_paths[0])
    assert check.ok, check.summary() + "\n" + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (trunk, 1)
    assert check.trunk_decode_ok and check.mtp_decode_ok and check.mtp_logits_finite


def test_llama_cpp_loads_a_single_file_composite_with_alignment_64(nemotron_single: Path, tmp_path: Path) -> None:
    draft = write_draft(tmp_path / "d.gguf", trunk_pattern="M*EM*E", alignment=128)
    report = compose(nemotron_single, draft, tmp_path / "out")
    check = check_with_llama(report.output_paths[0])
    assert check.ok and (check.n_layer, check.n_layer_nextn) == (6, 1), check.summary()


@pytest.fixture(scope="module")
def composite(nemotron_split: Path, nemotron_draft0: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compose(nemotron_split, nemotron_draft0, tmp_path_factory.mktemp("oracle") / "good").output_paths[0]


def test_oracle_rejects_a_stale_split_tensors_count(composite: Path, tmp_path: Path) -> None:
    broken = copy_model(composite, tmp_path / "stale")
    rewrite_gguf(
        composite, broken, set_kvs={"split.tensors.count": encode_kv("split.tensors.count", GGUFValueType.INT32, 26)}
    )
    check = check_with_llama(broken)
    assert not check.loaded
    assert "26 tensors expected but 44 found" in (check.error or "")


def test_oracle_rejects_an_unextended_per_layer_array(composite: Path, tmp_path: Path) -> None:
    broken = copy_model(composite, tmp_path / "array")
    key = f"{ARCH}.feed_forward_length"
    rewrite_gguf(
        composite, broken, set_kvs={key: encode_kv(key, GGUFValueType.ARRAY, [0, 0, 256], GGUFValueType.INT32)}
    )
    check = check_with_llama(broken)
    assert not check.loaded
    assert "wrong array length; expected 4, got 3" in (check.error or "")


def test_a_load_alone_misses_a_nextn_block_without_eh_proj_but_the_mtp_step_does_not(
    glm_target: Path, glm_draft: Path, tmp_path: Path
) -> None:
    draft = rewrite_gguf(glm_draft, tmp_path / "no-eh-proj.gguf", drop_tensors=("blk.0.nextn.eh_proj.weight",))
    # keep llama.cpp's packed layout: drop the tensor from the table *and* re-pack by composing from a
    # draft whose table no longer lists it (compose copies tensor by tensor)
    report = compose(glm_target, draft, tmp_path / "out")
    check = check_with_llama(report.output_paths[0])
    assert check.loaded and check.trunk_decode_ok  # llama.cpp quietly loads it as trunk-only ...
    assert not check.ok  # ... but the MTP context cannot run the NextN block
    assert check.mtp_decode_ok is not True


def test_every_shard_of_a_composite_is_checked_by_llama_only_through_shard_one(composite: Path, tmp_path: Path) -> None:
    """llama.cpp ignores a stale count in shards 2..N: that is why `verify` checks every shard itself."""
    broken = copy_model(composite, tmp_path / "stale2")
    second = shard_files(broken)[1]
    rewrite_gguf(
        shard_files(composite)[1],
        second,
        set_kvs={"split.tensors.count": encode_kv("split.tensors.count", GGUFValueType.INT32, 26)},
    )
    assert check_with_llama(broken).ok


def test_glm4moe_blk_n_draft_composes_and_runs(glm_target: Path, tmp_path: Path) -> None:
    draft = write_draft(tmp_path / "glm-n.gguf", family=GLM4MOE, block="N", quant="Q4_K")
    report = compose(glm_target, draft, tmp_path / "out")
    check = check_with_llama(report.output_paths[0])
    assert check.ok and check.n_layer_nextn == 1, check.summary()
