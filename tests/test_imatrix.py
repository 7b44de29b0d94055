"""``--imatrix``: a head quantized with an importance matrix as ``llama-quantize --imatrix`` quantizes it (issue 38
item 5). The fixture imatrix is written with gguf-py's writer in the format llama.cpp b11434's llama-imatrix writes
(``save_imatrix``: ``<tensor>.in_sum2`` / ``.counts`` / ``.stats``, the ``imatrix.*`` KVs, ``imatrix.n_layer_nextn``
after ``--nextn``), since llama-imatrix itself is not built here; a test reads b11434's source for those names.
The oracle is llama.cpp's own ``llama-quantize --pure --imatrix`` (0c1e570's: its loader and llama-quant.cpp read a
GGUF imatrix as b11434's do)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from test_citations import _upstream_sources

from gguf_mtp.cli import build_parser, main
from gguf_mtp.errors import BadGGUFError, ParameterError
from gguf_mtp.format.header import read_header
from gguf_mtp.format.imatrix import COUNTS_SUFFIX, IMATRIX_KEYS, KEY_N_LAYER_NEXTN, SUMS_SUFFIX, read_imatrix
from gguf_mtp.format.quant_rules import head_tensor_type, kept_by, needs_imatrix
from gguf_mtp.format.quantize import from_f32
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.jobs.extract import extract
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import NEMOTRON_H_MOE, write_target

#: Quantizing goes through llama.cpp's ggml (llama-cpp-python): the floor suite, which has none, deselects these.
needs_ggml = pytest.mark.llama

ARCH = "nemotron_h_moe"
NEXTN = f"blk.{len(NEMOTRON_H_MOE.default_pattern)}."
#: llama-imatrix's default chunk (``--ctx-size`` 512) and the chunks of a short calibration run.
CHUNK_SIZE, CHUNKS = 512, 10
STATS_SCHEMA = ["sum_sq", "mean", "elements", "std_deviation", "skewness", "kurtosis", "gain", "h_norm", "l2_dist",
                "cossim", "pearson", "covariance"]


def write_imatrix(path: Path, entries: dict[str, tuple[np.ndarray, np.ndarray]], *, n_layer_nextn: int | None = 1,
                  drop: tuple[str, ...] = ()) -> Path:
    """An imatrix as llama-imatrix's ``save_imatrix`` writes it: per entry ``name -> (sums (n_mat, ne0), counts
    (n_mat,))`` the F32 tensors ``.in_sum2`` (ne0 x n_mat), ``.counts`` (1 x n_mat) and ``.stats`` (12), and the KVs
    (``n_layer_nextn`` ``None``: a run without ``--nextn``); ``drop`` leaves those KVs out."""
    writer = GGUFWriter(str(path), arch="")
    writer.kv_data[0].pop("general.architecture", None)  # llama-imatrix writes none
    writer.add_string("general.type", "imatrix")
    kvs = {"imatrix.datasets": lambda: writer.add_array("imatrix.datasets", ["calibration.txt"]),
           "imatrix.chunk_count": lambda: writer.add_uint32("imatrix.chunk_count", CHUNKS),
           "imatrix.chunk_size": lambda: writer.add_uint32("imatrix.chunk_size", CHUNK_SIZE)}
    for key, add in kvs.items():
        if key not in drop:
            add()
    if n_layer_nextn is not None:
        writer.add_uint32(KEY_N_LAYER_NEXTN, n_layer_nextn)
    writer.add_array("imatrix.stats_schema", STATS_SCHEMA)
    for name, (sums, counts) in entries.items():
        writer.add_tensor(name + SUMS_SUFFIX, np.ascontiguousarray(sums, dtype=np.float32))
        writer.add_tensor(name + COUNTS_SUFFIX, np.asarray(counts, dtype=np.float32).reshape(-1, 1))
        writer.add_tensor(name + ".stats", np.zeros(12, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def realistic_entries(model: Path, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Statistics for every matrix llama-quantize quantizes in ``model``, as a calibration run gives them: per expert,
    the tokens it saw (fewer for experts the router picks less) and each column's sum of squared activations over
    them (a few columns far louder than the rest, as in real activations)."""
    rng = np.random.default_rng(seed)
    entries = {}
    for t in read_header(model).tensors:
        if kept_by(t.name, t.shape, ARCH) is not None:
            continue
        ne0, n_mat = t.shape[0], t.shape[2] if len(t.shape) > 2 else 1
        counts = rng.integers(CHUNK_SIZE, CHUNK_SIZE * CHUNKS, size=n_mat).astype(np.float32)
        loudness = rng.lognormal(0.0, 1.5, size=(n_mat, ne0)).astype(np.float32)
        entries[t.name] = (loudness * counts[:, None], counts)
    return entries


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Nemotron-H MoE with its NextN block, BF16 matrices (rows of 256: every type's blocks fit), 8 experts."""
    return write_target(tmp_path_factory.mktemp("full"), quant="BF16", with_nextn=True, name="full")


@pytest.fixture(scope="module")
def imatrix(full: Path) -> Path:
    return write_imatrix(full.with_name("imatrix.gguf"), realistic_entries(full))


# ------------------------------------------------------------------------------------------ the format


def test_the_fixture_uses_llama_imatrix_s_own_key_and_tensor_names() -> None:
    sources = _upstream_sources()
    header = "\n".join(sources["common/imatrix-loader.h"])
    for key in (*IMATRIX_KEYS, KEY_N_LAYER_NEXTN, "imatrix.stats_schema"):
        assert f'= "{key}";' in header, key
    saved = "\n".join(sources["tools/imatrix/imatrix.cpp"])
    for suffix in (SUMS_SUFFIX, COUNTS_SUFFIX, ".stats"):
        assert f'"%s{suffix}"' in saved, suffix
    assert 'gguf_set_val_str(ctx_gguf, "general.type", "imatrix");' in saved
    # in_sum2 is ne0 x n_mat and counts 1 x n_mat, both F32: what write_imatrix writes
    assert "ggml_new_tensor_2d(ctx, GGML_TYPE_F32, nval / nmat, nmat);" in saved
    assert "ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, nmat);" in saved
    loader = "\n".join(sources["tools/quantize/quantize.cpp"])
    assert "e[j*ne0 + i] = entry.sums[j*ne0 + i] / count;" in loader  # what ImportanceMatrix.importance divides


def test_importance_is_each_expert_s_sums_over_its_token_count(tmp_path: Path) -> None:
    sums = np.array([[2.0, 4.0, 6.0], [9.0, 3.0, 0.0], [5.0, 5.0, 5.0]], dtype=np.float32)
    path = write_imatrix(tmp_path / "m.gguf", {"blk.3.ffn_up_exps.weight": (sums, [2, 3, 0])})

    importance = read_imatrix(path).importance("blk.3.ffn_up_exps.weight", (3, 7, 3))

    assert importance is not None
    # an expert that saw no token weighs every column 1, as llama-quantize's load_imatrix does
    assert importance.tolist() == [[1.0, 2.0, 3.0], [3.0, 1.0, 0.0], [1.0, 1.0, 1.0]]


def test_a_tensor_the_imatrix_does_not_cover_has_no_importance(imatrix: Path) -> None:
    assert read_imatrix(imatrix).importance("blk.9.attn_q.weight", (512, 512)) is None


def test_a_model_is_not_an_imatrix(full: Path) -> None:
    with pytest.raises(BadGGUFError, match=r"full\.gguf: is not an imatrix \(no imatrix\.datasets, "):
        read_imatrix(full)


def test_a_legacy_dat_imatrix_is_refused_in_one_line(tmp_path: Path) -> None:
    legacy = tmp_path / "imatrix.dat"
    legacy.write_bytes(np.array([1], dtype=np.int32).tobytes() + b"\x05\x00\x00\x00abcde" + bytes(16))
    with pytest.raises(BadGGUFError, match=r"imatrix\.dat: is not a GGUF imatrix \(a legacy \.dat one\? "
                                           r"llama-imatrix --in-file FILE\.dat -o FILE\.gguf converts it\)$"):
        read_imatrix(legacy)


def test_sums_without_counts_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    writer = GGUFWriter(str(path), arch="")
    for key in IMATRIX_KEYS:
        writer.add_uint32(key, 1)
    writer.add_tensor("blk.3.attn_q.weight" + SUMS_SUFFIX, np.ones((1, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(BadGGUFError, match=r"'blk\.3\.attn_q\.weight' has sums without counts"):
        read_imatrix(path)


@pytest.mark.parametrize(("sums_shape", "counts"), [((1, 256), [10]), ((8, 512), [10] * 8), ((1, 512), [])])
def test_an_entry_that_does_not_fit_the_tensor_is_refused_before_it_is_read(
    tmp_path: Path, sums_shape: tuple[int, int], counts: list[int]
) -> None:
    path = write_imatrix(tmp_path / "m.gguf", {"blk.3.attn_q.weight": (np.ones(sums_shape), counts)})
    with pytest.raises(BadGGUFError, match=r"m\.gguf: imatrix entry 'blk\.3\.attn_q\.weight' .* does not fit the "
                                           r"tensor's 512 columns x 1 expert\(s\): an imatrix of another model"):
        read_imatrix(path).importance("blk.3.attn_q.weight", (512, 512))


@pytest.mark.parametrize(("value", "count"), [(np.nan, 10), (np.inf, 10), (-1.0, 10), (1.0, -5), (1.0, np.nan)])
def test_negative_or_non_finite_statistics_are_refused(tmp_path: Path, value: float, count: float) -> None:
    sums = np.ones((1, 4), dtype=np.float32)
    sums[0, 2] = value
    path = write_imatrix(tmp_path / "m.gguf", {"blk.3.attn_q.weight": (sums, [count])})
    with pytest.raises(BadGGUFError, match=r"m\.gguf: imatrix entry 'blk\.3\.attn_q\.weight' holds a negative or "
                                           r"non-finite value"):
        read_imatrix(path).importance("blk.3.attn_q.weight", (4, 2))


# ------------------------------------------------------------------------------------------ the rules


def test_without_an_imatrix_the_imatrix_types_stay_refused(full: Path, tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match=r"^outtype iq2_xxs: llama\.cpp only writes it with an importance matrix"):
        extract(full, tmp_path / "d.gguf", outtype="iq2_xxs", progress=False)
    assert not (tmp_path / "d.gguf").exists()


def test_an_imatrix_without_an_outtype_is_refused(full: Path, imatrix: Path, tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match=r"^imatrix needs outtype: without it the head's bytes are copied"):
        extract(full, tmp_path / "d.gguf", imatrix=imatrix, progress=False)
    assert not (tmp_path / "d.gguf").exists()


@needs_ggml
def test_an_imatrix_without_nextn_statistics_is_refused_for_an_imatrix_type(full: Path, tmp_path: Path) -> None:
    trunk_only = write_imatrix(tmp_path / "trunk.gguf", realistic_entries(full), n_layer_nextn=None)
    with pytest.raises(BadGGUFError, match=r"trunk\.gguf: has no NextN statistics \(no imatrix\.n_layer_nextn\), "
                                           r"which a IQ1_S head needs: llama-imatrix --nextn"):
        extract(full, tmp_path / "d.gguf", outtype="iq1_s", imatrix=trunk_only, progress=False)


@needs_ggml
def test_an_imatrix_missing_a_head_tensor_is_refused_for_an_imatrix_type(full: Path, tmp_path: Path) -> None:
    entries = realistic_entries(full)
    del entries[f"{NEXTN}nextn.eh_proj.weight"]
    partial = write_imatrix(tmp_path / "partial.gguf", entries)
    with pytest.raises(BadGGUFError, match=rf"partial\.gguf: has no statistics for '{NEXTN}nextn\.eh_proj\.weight', "
                                           r"which IQ2_XXS needs \(llama-quantize refuses it too\): llama-imatrix"):
        extract(full, tmp_path / "d.gguf", outtype="iq2_xxs", imatrix=partial, dry_run=True, progress=False)


def test_convert_compose_extract_and_graft_take_an_imatrix_type_with_imatrix() -> None:
    for command in (["convert", "src", "-o", "d.gguf"], ["compose", "t", "d", "-o", "o"],
                    ["graft", "--from", "s", "--into", "t", "-o", "o"], ["extract", "s"]):
        args = build_parser().parse_args([*command, "--outtype", "IQ2_XXS", "--imatrix", "m.gguf"])
        assert (args.outtype, args.imatrix) == ("iq2_xxs", "m.gguf")


@needs_ggml
def test_the_cli_refuses_a_model_given_as_imatrix_in_one_line(full: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["extract", str(full), "-o", str(tmp_path / "d.gguf"), "--outtype", "q4_k", "--imatrix", str(full)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].endswith("full.gguf: is not an imatrix (no imatrix.datasets, imatrix.chunk_count, "
                           "imatrix.chunk_size; llama-imatrix writes them)")
    assert not (tmp_path / "d.gguf").exists()


@needs_ggml
def test_the_importance_changes_the_bytes() -> None:
    """The imatrix reaches ggml_quantize_chunk (else the oracle tests below could pass on a k-quant by chance)."""
    rows = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
    loud_first = np.where(np.arange(256) < 16, 1000.0, 1.0).astype(np.float32)
    assert from_f32(rows, Q.Q4_K, importance=loud_first).tobytes() != from_f32(rows, Q.Q4_K).tobytes()


@pytest.mark.parametrize("qtype", [Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ1_S, Q.IQ1_M])
def test_rows_that_do_not_fit_an_imatrix_type_fall_back_to_iq4_nl_which_needs_none(qtype: Q) -> None:
    assert head_tensor_type("blk.3.attn_q.weight", (320, 320), Q.BF16, qtype) == Q.IQ4_NL
    assert needs_imatrix(qtype) and not needs_imatrix(Q.IQ4_NL)


# ------------------------------------------------------------------------------------------ llama-quantize


def _quantized(tool: Path, full: Path, imatrix: Path, qtype: str) -> Path:
    output = full.with_name(f"{full.stem}-{qtype}-imatrix.gguf")
    if not output.exists():
        done = subprocess.run([str(tool), "--pure", "--allow-requantize", "--imatrix", str(imatrix), str(full),
                               str(output), qtype.upper()], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
    return output


def _head(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    header = read_header(path)
    with open(path, "rb") as f:
        found = {}
        for t in header.tensors:
            if t.name.startswith(NEXTN):
                f.seek(header.data_offset + t.offset)
                found[t.name] = (t.type_name, t.shape, f.read(t.nbytes))
    return found


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["iq2_xxs", "iq1_s", "q4_k"])
def test_outtype_with_imatrix_writes_what_llama_quantize_imatrix_writes(
    full: Path, imatrix: Path, qtype: str, llama_quantize_tool: Path, tmp_path: Path
) -> None:
    oracle = _head(_quantized(llama_quantize_tool, full, imatrix, qtype))
    assert {t for t, _, _ in oracle.values()} >= {qtype.upper()}

    drafted = extract(full, tmp_path / "draft.gguf", outtype=qtype, imatrix=imatrix, progress=False)
    assert _head(drafted.output) == oracle


@pytest.mark.llama
@pytest.mark.slow
def test_compose_outtype_with_imatrix_writes_what_llama_quantize_imatrix_writes(
    full: Path, imatrix: Path, llama_quantize_tool: Path, tmp_path: Path
) -> None:
    """compose quantizes the draft's head under its block number in the composite, where the imatrix names it (the
    types' own rows are the test above's: one type suffices here)."""
    oracle = _head(_quantized(llama_quantize_tool, full, imatrix, "iq2_xxs"))
    target = write_target(tmp_path / "target", quant="Q8_0", name="target")
    bf16_draft = extract(full, tmp_path / "bf16-draft.gguf", progress=False).output
    composite = compose(target, bf16_draft, tmp_path / "compose", outtype="iq2_xxs", imatrix=imatrix, progress=False)
    assert _head(composite.output_paths[0]) == oracle


@pytest.mark.llama
@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["iq2_xxs", "q4_k"])
def test_convert_outtype_with_imatrix_writes_what_llama_quantize_imatrix_writes_of_the_bf16_conversion(
    qtype: str, llama_quantize_tool: Path, tmp_path: Path
) -> None:
    """convert's llama-quantize half: the checkpoint's experts are separate tensors, each quantized with its own
    expert's statistics."""
    target = write_target(tmp_path / "target", quant="Q8_0", name="target")
    checkpoint = write_mtpv2_checkpoint(tmp_path / "head")
    bf16 = convert(checkpoint, tmp_path / "bf16.gguf", target=target, progress=False).output
    composed = compose(target, bf16, tmp_path / "composite", progress=False).output_paths[0]
    imatrix = write_imatrix(tmp_path / "imatrix.gguf", realistic_entries(composed, seed=2))
    quantized = _quantized(llama_quantize_tool, composed, imatrix, qtype)

    ours = convert(checkpoint, tmp_path / f"{qtype}.gguf", target=target, outtype=qtype, imatrix=imatrix,
                   progress=False).output
    assert _head(ours) == _head(quantized)
    assert read_header(ours).get("general.file_type") == read_header(quantized).get("general.file_type")
