"""Every family against llama.cpp's own convert_hf_to_gguf.py: one parametrised entry per family.

Each entry's checkpoint (``support/<family>_checkpoints.py``, GPT-2's real tokenizer) is converted by upstream three
ways (full, ``--no-mtp``, ``--mtp``) and by gguf-mtp (the draft numbered from the ``--no-mtp`` trunk, its
``--standalone`` sidecar, and ``compose`` of the trunk and the draft): :mod:`support.parity_sets` makes each set
once per session. The same checks then run for every family:

* the draft's NextN blocks are upstream's ``--mtp`` blocks, tensor for tensor (and its per-layer metadata where the
  entry names it);
* the standalone sidecar is upstream's ``--mtp`` export;
* ``strip`` of upstream's full file is its ``--no-mtp`` file;
* the composite is upstream's full file, tensor for tensor (and key for key where the entry says which keys may
  differ);
* llama.cpp runs the composite with upstream's trunk and MTP logits bit for bit, and the sidecar as an MTP-only model.

A family's allowed differences are listed once, in its entry (:attr:`Family.allowed`); its own module keeps what is
particular to it (other layouts, patched converters, llama.cpp's refusals).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from support.helpers import reader_kvs, reader_tensors
from support.mimo_checkpoints import N_LAYER as MIMO_LAYERS
from support.nano_checkpoints import NANO_HPARAMS
from support.step_checkpoints import N_LAYER as STEP_LAYERS
from support.upstream import (
    ROOT,
    ParitySet,
    assert_runs_like,
    assert_runs_mtp_only,
    assert_same_tensors_up_to,
    assert_strip_gives_trunk,
)

from gguf_mtp.format.header import read_header

Q = GGMLQuantizationType
NANO_ROUTER_PATCH = ROOT / "upstream/01-nemotronh-mtp-router-f32/nemotronh-mtp-router-f32.patch"


@dataclass(frozen=True)
class Family:
    """One family's parity entry: which set (:data:`support.parity_sets.BUILDERS`) and what holds for it."""

    set: str
    arch: str
    #: the NextN blocks (``blk.N``) upstream's ``--mtp`` file holds, and how many tensors they have in all
    blocks: tuple[int, ...]
    block_tensors: int
    #: trunk layers llama.cpp reports; ``None``: llama.cpp does not run this family's composite (its own module
    #: says why)
    n_layer: int | None
    #: tensor -> (how, why) gguf-mtp's may differ from upstream's: ``widened`` or ``permuted``
    #: (:func:`support.upstream.equal_up_to`); every other tensor is byte-identical
    allowed: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    #: ``allowed``'s ``permuted`` differences need the head counts (q, kv)
    heads: tuple[int, int] = (0, 0)
    #: per-layer keys (``{arch}.{suffix}``) of the draft that equal upstream's ``--mtp`` file's; ``("*",)``: all
    draft_kvs: tuple[str, ...] = ()
    #: the composite's keys that differ from upstream's full file, exactly; ``None``: KVs not compared but the
    #: block counts
    composite_kv_differences: frozenset[str] | None = None
    #: a patch of ``upstream/`` the full file is converted with (and the ``allowed`` hows it makes vanish)
    full_patch: Path | None = None
    full_patch_fixes: frozenset[str] = frozenset()
    standalone: bool = True
    strip: bool = True


NANO_BLOCK = 3
SIZE_LABEL = frozenset({"general.size_label"})  # compose keeps the trunk's; upstream recounts
FAMILIES = [
    # NextN 4 + copies 2, attention 11 (q/k/v bias, QK norm), MoE 8. No allowed difference: GLM's attention is
    # NeoX-ordered (no q/k permutation upstream either), and upstream's F32 router rule reads block 3 from
    # model.layers.3 and so does apply to blk.3, unlike Nemotron's mtp.layers.1.
    Family("glm4moe", "glm4moe", blocks=(3,), block_tensors=25, n_layer=3),
    # llama.cpp's glm4moe graph runs one NextN block: tests/test_nextn_blocks.py checks both files fare alike
    Family("glm4moe-2nextn", "glm4moe", blocks=(3, 4), block_tensors=2 * 25, n_layer=None, strip=False),
    # NextN fusion 3, attention 5, MoE 7 (no latent projections), head norm 1: the names test_family_nemotron_nano
    # checks the draft has. Upstream's full file is converted with upstream/01's router patch, which leaves the q/k
    # row order as the only difference.
    Family(
        "nemotron_nano", "nemotron_h_moe", blocks=(NANO_BLOCK,), block_tensors=16, n_layer=NANO_BLOCK,
        allowed={
            f"blk.{NANO_BLOCK}.ffn_gate_inp.weight": (
                "widened", "gguf-mtp keeps every router F32, the MTP one too; upstream's F32 rule reads the block id "
                "from the HF name (mtp.layers.1 -> 1) and leaves the MTP router BF16 (upstream/01 fixes it)"),
            f"blk.{NANO_BLOCK}.attn_q.weight": (
                "permuted", "upstream runs the MTP attention through LlamaModel.permute (Granite's undo_permute); "
                "Nemotron-H has no RoPE, so the same row order change in Q and K leaves Q.K^T and the logits "
                "unchanged"),
            f"blk.{NANO_BLOCK}.attn_k.weight": ("permuted", "as attn_q"),
        },
        heads=(NANO_HPARAMS.n_head, NANO_HPARAMS.n_head_kv), full_patch=NANO_ROUTER_PATCH,
        full_patch_fixes=frozenset({"widened"}), standalone=False),
    Family("hy_v3", "hy_v3", blocks=(2,), block_tensors=20, n_layer=2,  # NextN 4, attn 7, ffn_norm, MoE 5 + 3
           composite_kv_differences=frozenset()),
    Family("bailingmoe3", "bailingmoe3", blocks=(2,), block_tensors=21, n_layer=2,  # NextN 4, MLA 8, norm, MoE 8
           draft_kvs=("*",), composite_kv_differences=frozenset()),
    Family("step35", "step35", blocks=(3, 4, 5), block_tensors=3 * 17, n_layer=STEP_LAYERS, strip=False,
           draft_kvs=("attention.head_count", "attention.head_count_kv", "attention.sliding_window_pattern",
                      "swiglu_clamp_exp", "swiglu_clamp_shexp"),  # conversion/step3.py's per-layer arrays
           composite_kv_differences=SIZE_LABEL),
    *(Family(f"mimo2-{variant}", "mimo2", blocks=(2, 3, 4), block_tensors=36, n_layer=MIMO_LAYERS, strip=False,
             draft_kvs=("attention.head_count_kv", "attention.sliding_window_pattern"),
             composite_kv_differences=SIZE_LABEL) for variant in ("bf16", "tp4")),
]


def _params(families: list[Family]) -> list[object]:
    return [pytest.param(f, id=f.set, marks=pytest.mark.parity(f.set)) for f in families]


ALL = _params(FAMILIES)
pytestmark = pytest.mark.upstream


def _assert_same(family: Family, ours: dict, theirs: dict, fixed: frozenset[str] = frozenset()) -> None:
    """``ours`` equals ``theirs`` but for the family's allowed differences (less those ``fixed`` makes vanish)."""
    hows = {"widened", "permuted"} - fixed
    assert_same_tensors_up_to(ours, theirs, family.allowed, hows, *family.heads)


def _full(family: Family, files: ParitySet) -> Path:
    return files.full_with_patch(family.full_patch) if family.full_patch is not None else files.full


def _counts(path: Path, arch: str) -> tuple[object, object]:
    header = read_header(path)
    return header.get(f"{arch}.block_count"), header.get(f"{arch}.nextn_predict_layers")


@pytest.mark.parametrize("family", ALL)
def test_convert_equals_upstream_mtp_blocks(family: Family, parity: ParitySet) -> None:
    prefixes = tuple(f"blk.{block}." for block in family.blocks)
    theirs = {n: t for n, t in reader_tensors(parity.mtp).items() if n.startswith(prefixes)}
    assert len(theirs) == family.block_tensors
    assert {n.split(".")[1] for n in theirs} == {str(block) for block in family.blocks}
    _assert_same(family, reader_tensors(parity.draft), theirs)


@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.draft_kvs]))
def test_draft_metadata_equals_upstream_mtp_export(family: Family, parity: ParitySet) -> None:
    ours, theirs = reader_kvs(parity.draft), reader_kvs(parity.mtp)
    if family.draft_kvs == ("*",):
        prefix = f"{family.arch}."
        assert {k: v for k, v in ours.items() if k.startswith(prefix)} == \
            {k: v for k, v in theirs.items() if k.startswith(prefix)}
    for suffix in family.draft_kvs if family.draft_kvs != ("*",) else ():
        assert ours[f"{family.arch}.{suffix}"] == theirs[f"{family.arch}.{suffix}"], suffix


@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.standalone]))
def test_standalone_equals_upstream_mtp_export(family: Family, parity: ParitySet) -> None:
    _assert_same(family, reader_tensors(parity.standalone), reader_tensors(parity.mtp))
    assert _counts(parity.standalone, family.arch) == _counts(parity.mtp, family.arch)


@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.strip]))
def test_strip_of_upstream_full_equals_its_no_mtp_file(family: Family, parity: ParitySet, tmp_path: Path) -> None:
    assert_strip_gives_trunk(_full(family, parity), parity.trunk, tmp_path)


@pytest.mark.parametrize("family", ALL)
def test_compose_of_no_mtp_and_draft_equals_upstream_full(family: Family, parity: ParitySet) -> None:
    full = _full(family, parity)
    _assert_same(family, reader_tensors(parity.composite), reader_tensors(full), family.full_patch_fixes)
    assert _counts(parity.composite, family.arch) == _counts(full, family.arch)
    if family.composite_kv_differences is not None:
        ours, theirs = reader_kvs(parity.composite), reader_kvs(full)
        assert {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)} == \
            family.composite_kv_differences


@pytest.mark.llama
@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.n_layer is not None]))
def test_llama_runs_the_composite_with_upstreams_logits(family: Family, parity: ParitySet) -> None:
    ours = assert_runs_like(parity.composite, _full(family, parity))
    assert (ours.n_layer, ours.n_layer_nextn) == (family.n_layer, len(family.blocks))
    if len(family.blocks) > 1:
        assert ours.mtp_blocks_decoded == len(family.blocks)


@pytest.mark.llama
@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.standalone and f.n_layer is not None]))
def test_standalone_runs_as_an_mtp_only_model(family: Family, parity: ParitySet) -> None:
    check = assert_runs_mtp_only(parity.standalone)
    if len(family.blocks) > 1:
        assert check.mtp_blocks_decoded == len(family.blocks)
