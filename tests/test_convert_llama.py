"""The real loader is the judge: what convert writes, llama.cpp loads and runs through the NextN block."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers import reader_tensors

from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mtpv2_checkpoint(tmp_path_factory.mktemp("head") / "head", files=2)


@pytest.mark.parametrize("outtype", [None, "q8_0"])
def test_converted_draft_composed_into_a_split_target_runs_an_mtp_step(
    outtype: str | None, head: Path, nemotron_split: Path, tmp_path: Path
) -> None:
    draft = convert(head, tmp_path / "draft.gguf", target=nemotron_split, outtype=outtype, progress=False).output
    composite = compose(nemotron_split, draft, tmp_path / "out", progress=False).output_paths[0]
    check = check_with_llama(composite)
    assert check.ok, check.summary() + "\n" + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (3, 1)
    assert check.mtp_decode_ok and check.mtp_logits_finite


def test_draft_converted_with_block_alone_composes_as_well(head: Path, nemotron_single: Path, tmp_path: Path) -> None:
    # No --target at convert time: the block index comes from --block, the trunk entries from config.json
    # (whose pattern M*E does not describe this M*EM*E target: compose reads only the NextN entry).
    draft = convert(head, tmp_path / "draft.gguf", block=6, progress=False).output
    composite = compose(nemotron_single, draft, tmp_path / "out", progress=False).output_paths[0]
    check = check_with_llama(composite)
    assert check.ok, check.summary() + "\n" + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (6, 1)


def test_standalone_draft_loads_as_an_mtp_only_model(head: Path, nemotron_split: Path, tmp_path: Path) -> None:
    out = convert(head, tmp_path / "mtp-tiny.gguf", target=nemotron_split, standalone=True, progress=False).output
    tensors = reader_tensors(out)
    # What makes llama.cpp take it as MTP-only: no trunk block tensors at all.
    assert "blk.0.attn_norm.weight" not in tensors
    assert {"token_embd.weight", "output_norm.weight", "output.weight"} <= set(tensors)
    check = check_with_llama(out, trunk=False)
    assert check.ok, check.summary() + "\n" + check.log_tail
    assert (check.n_layer, check.n_layer_nextn) == (3, 1)
    assert check.mtp_decode_ok and check.mtp_logits_finite
