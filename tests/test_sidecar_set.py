"""Sidecar sets named for ``llama-server -hf`` (issue 39 item 1).

The pairing rule is llama.cpp b11434's ``find_best_sibling`` (``common/download.cpp``; its lines are checked in
tests/test_citations.py): the expected pairings below are worked out by hand from those lines, for a trunk of every
ggml type family against ggml-org's set (BF16, Q8_0, Q4_0), and the file names from its converter's
``prepare_metadata`` (``mtp-`` + gguf-py's ``naming_convention`` without the size label). Each member of a written
set is compared with what ``llama-quantize --pure TYPE`` writes from the 16-bit member.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType, GGUFValueType
from support.helpers import reader_tensors, rewrite_gguf
from support.hub_standin import RecordingHub

from gguf_mtp.cli import main
from gguf_mtp.errors import BadGGUFError, ParameterError, UnsafeOutputError
from gguf_mtp.format.header import encode_kv
from gguf_mtp.jobs.sidecar_pairing import pair_listing, sidecar_pairing
from gguf_mtp.jobs.sidecar_set import write_sidecar_set
from gguf_mtp.model.sidecar_names import (
    LLAMA_CPP_BUILD,
    find_best_sibling,
    is_model_file,
    quant_bits,
    sidecar_file_name,
)
from gguf_mtp.testing.tiny_models import GLM4MOE, write_target

#: ggml-org's set, as the Hub lists a repo (by name).
GGML_ORG_SET = ["mtp-Model-BF16.gguf", "mtp-Model-Q4_0.gguf", "mtp-Model-Q8_0.gguf"]

#: A trunk of each type family -> (its quantization bits, the member of GGML_ORG_SET llama.cpp picks). Bits: the
#: first number of the last -/. word. Picks: closest bits (BF16 16, Q8_0 8, Q4_0 4); a tie keeps the first listed,
#: so 6 bits (2 from Q4_0 and from Q8_0) take Q4_0, listed before Q8_0.
TRUNKS: dict[str, tuple[int, str]] = {
    "Model-F32.gguf": (32, "mtp-Model-BF16.gguf"),
    "Model-F16.gguf": (16, "mtp-Model-BF16.gguf"),
    "Model-BF16.gguf": (16, "mtp-Model-BF16.gguf"),
    "Model-Q8_0.gguf": (8, "mtp-Model-Q8_0.gguf"),
    "Model-UD-Q8_K_XL.gguf": (8, "mtp-Model-Q8_0.gguf"),
    "Model-Q6_K.gguf": (6, "mtp-Model-Q4_0.gguf"),
    "Model-UD-Q6_K_XL.gguf": (6, "mtp-Model-Q4_0.gguf"),
    "Model-Q5_0.gguf": (5, "mtp-Model-Q4_0.gguf"),
    "Model-Q5_1.gguf": (5, "mtp-Model-Q4_0.gguf"),
    "Model-Q5_K_M.gguf": (5, "mtp-Model-Q4_0.gguf"),
    "Model-Q4_0.gguf": (4, "mtp-Model-Q4_0.gguf"),
    "Model-Q4_1.gguf": (4, "mtp-Model-Q4_0.gguf"),
    "Model-Q4_K_M.gguf": (4, "mtp-Model-Q4_0.gguf"),
    "Model-UD-Q4_K_XL.gguf": (4, "mtp-Model-Q4_0.gguf"),
    "Model-IQ4_NL.gguf": (4, "mtp-Model-Q4_0.gguf"),
    "Model-IQ4_XS.gguf": (4, "mtp-Model-Q4_0.gguf"),
    "Model-MXFP4_MOE.gguf": (4, "mtp-Model-Q4_0.gguf"),
    "Model-NVFP4.gguf": (4, "mtp-Model-Q4_0.gguf"),
    "Model-Q3_K_M.gguf": (3, "mtp-Model-Q4_0.gguf"),
    "Model-IQ3_XXS.gguf": (3, "mtp-Model-Q4_0.gguf"),
    "Model-IQ3_S.gguf": (3, "mtp-Model-Q4_0.gguf"),
    "Model-Q2_K.gguf": (2, "mtp-Model-Q4_0.gguf"),
    "Model-IQ2_XXS.gguf": (2, "mtp-Model-Q4_0.gguf"),
    "Model-IQ2_XS.gguf": (2, "mtp-Model-Q4_0.gguf"),
    "Model-IQ2_S.gguf": (2, "mtp-Model-Q4_0.gguf"),
    "Model-TQ2_0.gguf": (2, "mtp-Model-Q4_0.gguf"),
    "Model-IQ1_S.gguf": (1, "mtp-Model-Q4_0.gguf"),
    "Model-UD-IQ1_M.gguf": (1, "mtp-Model-Q4_0.gguf"),
    "Model-TQ1_0.gguf": (1, "mtp-Model-Q4_0.gguf"),
    "Model-Q1_0.gguf": (1, "mtp-Model-Q4_0.gguf"),
}


def test_the_table_has_a_trunk_of_every_ggml_type_a_model_is_quantized_to() -> None:
    integer_or_internal = {"I8", "I16", "I32", "I64", "F64", "Q8_1", "Q8_K"}  # never a model's file type
    tags = [name.removesuffix(".gguf").rpartition("-")[2] for name in TRUNKS]
    missing = [t.name for t in GGMLQuantizationType if t.name not in integer_or_internal
               and not any(tag.startswith(t.name) for tag in tags)]
    assert not missing


@pytest.mark.parametrize(("trunk", "expected"), TRUNKS.items(), ids=list(TRUNKS))
def test_the_pairing_rule_gives_each_trunk_type_the_sidecar_llama_cpp_picks(
    trunk: str, expected: tuple[int, str]
) -> None:
    bits, sidecar = expected
    assert quant_bits(trunk) == bits
    assert find_best_sibling([*GGML_ORG_SET, trunk], trunk) == sidecar


def test_the_pairing_report_of_a_folder_is_the_rule_for_every_trunk(tmp_path: Path) -> None:
    for name in [*GGML_ORG_SET, *TRUNKS]:
        (tmp_path / name).write_bytes(b"")
    report = sidecar_pairing(str(tmp_path))
    assert {p.trunk: p.sidecar for p in report.pairings} == {t: s for t, (_, s) in TRUNKS.items()}
    assert report.sidecars == tuple(GGML_ORG_SET) and report.build == LLAMA_CPP_BUILD == "b11434"
    assert not report.on_hub


def test_a_sidecar_in_the_trunks_folder_beats_one_in_an_ancestor_and_one_below_is_never_seen() -> None:
    files = ["mtp-Model-Q4_0.gguf", "Q8_0/sub/mtp-Model-Q8_0.gguf", "Q8_0/mtp-Model-BF16.gguf",
             "Q8_0/Model-Q8_0-00001-of-00002.gguf", "Q8_0/Model-Q8_0-00002-of-00002.gguf"]
    assert find_best_sibling(files, "Q8_0/Model-Q8_0-00001-of-00002.gguf") == "Q8_0/mtp-Model-BF16.gguf"
    assert find_best_sibling(files[:2], "Q8_0/Model-Q8_0-00001-of-00002.gguf") == "mtp-Model-Q4_0.gguf"


def test_a_sidecar_named_with_the_hf_tag_beats_closer_bits() -> None:
    files = ["mtp-Model-Q4_0.gguf", "mtp-Model-UD-Q4_K_XL.gguf", "mtp-Model-Q8_0.gguf"]
    assert find_best_sibling(files, "Model-UD-Q4_K_XL.gguf", tag="Q4_K_XL") == "mtp-Model-UD-Q4_K_XL.gguf"
    assert find_best_sibling(files, "Model-Q6_K.gguf", tag="q8") == "mtp-Model-Q8_0.gguf"  # bits from the tag


def test_without_a_16_bit_sidecar_16_and_32_bit_trunks_get_q8_0() -> None:
    for trunk in ("Model-BF16.gguf", "Model-F16.gguf", "Model-F32.gguf"):
        assert find_best_sibling(GGML_ORG_SET[1:], trunk) == "mtp-Model-Q8_0.gguf"


def test_a_tie_keeps_the_sidecar_listed_first() -> None:
    assert find_best_sibling(["mtp-Model-Q8_0.gguf", "mtp-Model-Q4_0.gguf"], "Model-Q6_K.gguf") == "mtp-Model-Q8_0.gguf"


def test_a_non_ascii_letter_is_no_part_of_a_tag_as_in_std_regex() -> None:
    assert quant_bits("Model-Q4_K_M.gguf") == 4
    assert quant_bits("Model-Q4_\u212a_M.gguf") == 0  # the Kelvin sign, which IGNORECASE would take for k


def test_a_name_without_a_tag_number_has_zero_bits_and_a_number_beyond_int_is_llama_cpp_s_failure() -> None:
    assert quant_bits("Model-Instruct.gguf") == 0
    assert quant_bits("Model-Q4_K_M.GGUF") == 0  # ".gguf" is matched case-sensitively
    with pytest.raises(ValueError, match="std::stoi"):
        quant_bits("Model-Q99999999999.gguf")
    (pairing,) = pair_listing(["Model-Q99999999999.gguf", "mtp-Model-Q8_0.gguf"])
    assert pairing.sidecar is None and pairing.failure is not None and "stoi" in pairing.failure


def test_trunks_are_model_files_and_first_shards_only() -> None:
    files = ["Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/Model-Q4_K_M-00002-of-00002.gguf",
             "mmproj-Model-F16.gguf", "Model.imatrix.gguf", "mtp-Model-Q8_0.gguf", "mtp-heads/Model-Q8_0.gguf"]
    assert [(p.trunk, p.shards, p.tag) for p in pair_listing(files)] == [
        ("Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf", 2, "Q4_K_M"), ("mtp-heads/Model-Q8_0.gguf", 1, "Q8_0")]
    assert is_model_file("mtp-heads/Model-Q8_0.gguf") and not is_model_file("mmproj-Model-F16.gguf")


def test_the_pairing_report_of_a_hub_repo_lists_it_through_the_hub_client(tmp_path: Path) -> None:
    for name in ["mtp-Model-Q8_0.gguf", "Q4_K_M/Model-Q4_K_M.gguf", "Model-BF16.gguf", "README.md"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    api = RecordingHub(source=tmp_path)
    report = sidecar_pairing("someone/Model-GGUF", revision="abc123", api=api)
    assert report.on_hub and [c[0] for c in api.calls] == ["list_repo_files"]
    assert api.calls[0][2]["revision"] == "abc123"
    assert {p.trunk: p.sidecar for p in report.pairings} == {
        "Model-BF16.gguf": "mtp-Model-Q8_0.gguf", "Q4_K_M/Model-Q4_K_M.gguf": "mtp-Model-Q8_0.gguf"}


def test_pair_refuses_what_is_neither_a_folder_nor_a_repo_id(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="neither a folder nor a Hub repo id"):
        sidecar_pairing(str(tmp_path / "missing"))


@pytest.mark.parametrize(("parts", "label", "expected"), [
    ({"name": "GLM 4.5 Air", "basename": "GLM-4.5-Air"}, "Q4_0", "mtp-GLM-4.5-Air-Q4_0.gguf"),
    ({"name": "Qwen3.8 27B", "basename": None}, "Q4_0", "mtp-Qwen3.8-27B-Q4_0.gguf"),
    ({"name": "M", "basename": "Model", "finetune": "Instruct", "version": "v2"}, "Q8_0",
     "mtp-Model-Instruct-v2-Q8_0.gguf"),
    ({"name": None, "basename": None}, "bf16", "mtp-ggml-model-BF16.gguf"),
])
def test_the_sidecar_name_is_the_converters(parts: dict[str, str | None], label: str, expected: str) -> None:
    full = {"name": None, "basename": None, "finetune": None, "version": None} | parts
    assert sidecar_file_name(**full, type_label=label) == expected


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model carrying a BF16 head, as converted (general.name tiny-glm4moe; every matrix BF16)."""
    return write_target(tmp_path_factory.mktemp("set"), family=GLM4MOE, with_nextn=True, name="Model-BF16",
                        quant="BF16", seed=5)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A quant that shipped its head mixed (Q4_K, Q8_0, IQ4_XS... and BF16), its token_embd Q4_K."""
    return write_target(tmp_path_factory.mktemp("mixed"), family=GLM4MOE, with_nextn=True, name="Model-Q4_K_M", seed=6)


def _types(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    tensors = reader_tensors(path)
    return {n: GGMLQuantizationType(tensors[n][0]).name for n in names}


def test_the_default_set_is_ggml_orgs_named_by_the_convention_each_file_in_its_type(
    model: Path, tmp_path: Path
) -> None:
    report = write_sidecar_set(model, tmp_path, progress=False)
    names = ["mtp-tiny-glm4moe-BF16.gguf", "mtp-tiny-glm4moe-Q8_0.gguf", "mtp-tiny-glm4moe-Q4_0.gguf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    assert [Path(f["file"]).name for f in report.to_dict()["files"]] == names
    for name, qtype in zip(names, ("BF16", "Q8_0", "Q4_0"), strict=True):
        tensors = reader_tensors(tmp_path / name)
        matrices = [n for n, (_, shape, _) in tensors.items() if n.startswith("blk.2.") and len(shape) == 2
                    and "ffn_gate_inp" not in n]
        assert matrices and {GGMLQuantizationType(tensors[n][0]).name for n in matrices} == {qtype}, name
        assert _types(tmp_path / name, ("token_embd.weight", "output.weight")) == {
            "token_embd.weight": qtype, "output.weight": qtype}, name


@pytest.mark.llama  # Q4_K is written by llama.cpp's quantizer (gguf-py has none)
def test_types_choose_the_members_and_name_replaces_the_models_name(model: Path, tmp_path: Path) -> None:
    write_sidecar_set(model, tmp_path, types="q8_0,q4_k", name="Qwen3.6-27B", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mtp-Qwen3.6-27B-Q4_K_M.gguf", "mtp-Qwen3.6-27B-Q8_0.gguf"]


def test_a_quantized_head_gets_no_16_bit_member_by_default_and_says_why(model: Path, mixed: Path,
                                                                        tmp_path: Path) -> None:
    report = write_sidecar_set(mixed, tmp_path / "mixed", progress=False)
    assert [m.label for m in report.plan.members] == ["Q8_0", "Q4_0"]
    assert any("no 16-bit member" in n for n in report.notes)
    q8 = write_sidecar_set(model, tmp_path / "a", types="q8_0", progress=False).plan.members[0].plan.path
    again = write_sidecar_set(q8, tmp_path / "b", progress=False)
    assert [m.label for m in again.plan.members] == ["Q8_0", "Q4_0"]
    # the Q8_0 member of a Q8_0 sidecar is that sidecar's tensors, unchanged
    assert reader_tensors(again.plan.members[0].plan.path) == reader_tensors(q8)


def test_one_existing_name_refuses_the_whole_set_and_writes_nothing(model: Path, tmp_path: Path) -> None:
    (tmp_path / "mtp-tiny-glm4moe-Q4_0.gguf").write_bytes(b"mine")
    with pytest.raises(UnsafeOutputError, match="exists"):
        write_sidecar_set(model, tmp_path, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["mtp-tiny-glm4moe-Q4_0.gguf"]
    assert (tmp_path / "mtp-tiny-glm4moe-Q4_0.gguf").read_bytes() == b"mine"
    write_sidecar_set(model, tmp_path, force=True, progress=False)
    assert len(list(tmp_path.iterdir())) == 3 and (tmp_path / "mtp-tiny-glm4moe-Q4_0.gguf").stat().st_size > 4


def test_a_dry_run_plans_every_file_and_writes_none(model: Path, tmp_path: Path) -> None:
    report = write_sidecar_set(model, tmp_path / "out", dry_run=True, progress=False)
    assert len(report.plan.members) == 3
    assert report.bytes_planned == sum(m.plan.output.size for m in report.plan.members)
    assert not (tmp_path / "out").exists()


def test_a_model_name_that_makes_no_plain_file_name_is_refused_in_one_line(model: Path, tmp_path: Path) -> None:
    hostile = rewrite_gguf(model, tmp_path / "hostile.gguf",
                           set_kvs={"general.version": encode_kv("general.version", GGUFValueType.STRING, "1/../../x")})
    with pytest.raises(BadGGUFError, match="not a plain file name"):
        write_sidecar_set(hostile, tmp_path / "out", progress=False)
    with pytest.raises(ParameterError, match="not a plain file name"):
        write_sidecar_set(model, tmp_path / "out", name="a\nb", progress=False)
    assert not (tmp_path / "out").exists()


def test_bad_types_are_refused_in_one_line(model: Path, tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="Q8_0 twice"):
        write_sidecar_set(model, tmp_path, types="q8_0,Q8_0", progress=False)
    with pytest.raises(ParameterError, match="types"):
        write_sidecar_set(model, tmp_path, types="q9_9", progress=False)


def test_the_cli_writes_the_set_and_pairs_it(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sidecars", str(model), "-o", str(tmp_path), "-q"]) == 0
    (tmp_path / "Model-Q6_K.gguf").write_bytes(b"")
    capsys.readouterr()
    assert main(["sidecars", "--pair", str(tmp_path), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["llama_cpp_build"] == "b11434"
    assert [(t["trunk"], t["sidecar"]) for t in answer["trunks"]] == [("Model-Q6_K.gguf", "mtp-tiny-glm4moe-Q4_0.gguf")]


@pytest.mark.parametrize(("argv", "said"), [
    ([], "either MODEL"),
    (["--pair", ".", "--types", "q8_0"], "--pair writes nothing"),
    (["model.gguf", "--revision", "main"], "--revision goes with --pair"),
])
def test_the_cli_refuses_options_of_the_other_mode(argv: list[str], said: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sidecars", *argv])
    assert exited.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_each_member_is_what_llama_quantize_pure_writes_from_the_16_bit_member(
    model: Path, qtype: str, llama_quantize_tool: Path, tmp_path: Path
) -> None:
    """ggml-org's Q4_0 sidecar is ``llama-quantize --pure`` of the BF16 one: token_embd and output in Q4_0 too."""
    report = write_sidecar_set(model, tmp_path, progress=False)
    bf16, *_ = (m.plan.path for m in report.plan.members if m.label == "BF16")
    ours = next(m.plan.path for m in report.plan.members if m.label == qtype)
    oracle = tmp_path / "oracle.gguf"
    done = subprocess.run([str(llama_quantize_tool), "--pure", str(bf16), str(oracle), qtype], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert reader_tensors(ours) == reader_tensors(oracle)


@pytest.mark.llama
@pytest.mark.slow
def test_every_member_of_the_set_drafts_for_its_trunk_in_llama_cpp(model: Path, tmp_path: Path) -> None:
    from gguf_mtp.check.verify import verify

    report = write_sidecar_set(model, tmp_path, progress=False)
    for member in report.plan.members:
        checked = verify(member.plan.path, target=model, llama=True, progress=False)
        assert checked.ok and checked.sidecar, checked.describe()
        assert checked.llama is not None and checked.llama.mtp_decode_ok, checked.describe()
