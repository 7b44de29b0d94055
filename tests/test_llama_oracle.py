"""The real loader is the judge: llama.cpp loads every composite with its NextN block and runs it, and it
rejects composites that break a rule — proof that the oracle would catch our mistakes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from gguf import GGUFValueType
from support.helpers import copy_model, rewrite_gguf, shard_files

from gguf_mtp import compose
from gguf_mtp.check import llama_check
from gguf_mtp.check.llama_check import check_with_llama
from gguf_mtp.format.header import encode_kv
from gguf_mtp.testing.tiny_models import GLM4MOE, write_draft

pytestmark = pytest.mark.llama
ARCH = "nemotron_h_moe"


@pytest.mark.slow
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


@pytest.mark.slow
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


# ------------------------------------------------------------- item 18: independent of the build's CPU features


def _child_stderr(path: Path, *, extra_bufts: bool | None = None) -> tuple[dict, str]:
    """Run the real child on ``path`` (optionally overriding use_extra_bufts); its last report and stderr."""
    code = "import sys, gguf_mtp.check.llama_check as lc\n"
    if extra_bufts is not None:
        code += f"lc.MODEL_PARAMS['use_extra_bufts'] = {extra_bufts}\n"
    code += "sys.exit(lc.main(sys.argv[1:]))\n"
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def _model_buffers(stderr: str) -> set[str]:
    return set(re.findall(r"load_tensors:\s+(\S+) model buffer size", stderr))


@pytest.mark.slow
def test_the_check_loads_the_weights_in_plain_cpu_buffers_only(composite: Path) -> None:
    """With the check's parameters llama.cpp puts every weight in a plain (mapped) CPU buffer: no CPU_REPACK,
    AMX or KleidiAI buffer, so no kernel that only a CPU with those features runs. The control run (extra
    buffer types on) shows the same build does repack this file, so the assertion can fail."""
    report, stderr = _child_stderr(composite)
    assert report["trunk_decode_ok"] and report["mtp_decode_ok"] and report["mtp_logits_finite"]
    assert _model_buffers(stderr) == {"CPU_Mapped"}
    assert "repack tensor" not in stderr
    _, control = _child_stderr(composite, extra_bufts=True)
    assert _model_buffers(control) - {"CPU_Mapped", "CPU"}, "control run: expected an extra buffer type"


class _FakeLlama(types.SimpleNamespace):
    """Enough of llama_cpp's low-level API for _child to run up to the contexts, recording the params."""

    def __init__(self) -> None:
        super().__init__(
            LLAMA_SPLIT_MODE_NONE=100, LLAMA_LOAD_MODE_MMAP=101, LLAMA_LAZY_MODE_OFF=102,
            LLAMA_FLASH_ATTN_TYPE_DISABLED=103, LLAMA_CONTEXT_TYPE_DEFAULT=0, LLAMA_CONTEXT_TYPE_MTP=1,
            model_params=None, context_params=[], llama_cpp_ext=types.SimpleNamespace(),  # bound at import
        )
        self.llama_backend_init = lambda: None
        self.llama_model_default_params = lambda: types.SimpleNamespace(use_extra_bufts=True, n_gpu_layers=-1)
        self.llama_context_default_params = lambda: types.SimpleNamespace(flash_attn_type=-1, op_offload=True)
        self.llama_model_n_layer = lambda m: 3
        self.llama_model_n_layer_nextn = lambda m: 1
        self.llama_model_n_embd = lambda m: 8
        self.llama_model_n_embd_out = lambda m: 8
        self.llama_model_get_vocab = lambda m: "vocab"
        self.llama_vocab_n_tokens = lambda v: 16
        self.llama_model_free = lambda m: None

    def llama_model_load_from_file(self, path: bytes, params: types.SimpleNamespace) -> str:
        self.model_params = params
        return "model"

    def llama_init_from_model(self, model: str, cparams: types.SimpleNamespace) -> None:
        self.context_params.append(cparams)
        return None  # "could not create a context": enough to see the params


def test_the_check_passes_parameters_that_avoid_cpu_specific_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeLlama()
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    out = llama_check._child("x.gguf", True, True)
    p = fake.model_params
    assert (p.use_extra_bufts, p.no_host, p.n_gpu_layers, p.check_tensors, p.load_mtp) == (False, False, 0, True, True)
    assert (p.split_mode, p.load_mode, p.lazy_mode) == (100, 101, 102)
    assert [c.ctx_type for c in fake.context_params] == [0, 1]  # the trunk context, then the MTP context
    for c in fake.context_params:
        assert (c.flash_attn_type, c.op_offload, c.offload_kqv, c.n_threads) == (103, False, False, 2)
    assert out["trunk_decode_ok"] is False and out["mtp_decode_ok"] is False


def test_the_mtp_step_gets_rows_as_wide_as_the_trunks_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's MTP context reads n_embd_out floats a token (qwen4exp: its hc streams, hc x n_embd): rows of
    n_embd would let it read past the batch's buffer."""
    fake = _FakeLlama()
    fake.llama_model_n_embd_out = lambda m: 16  # hc = 2 streams of n_embd 8
    fake.llama_init_from_model = lambda model, cparams: f"ctx{cparams.ctx_type}"
    fake.llama_free = lambda ctx: None
    widths: list[int | None] = []

    def decode(llama: object, ctx: str, tokens: list[int], rows: list[list[float]] | None, n_vocab: int) -> tuple:
        widths.append(None if rows is None else len(rows[0]))
        return 0, True, "digest"

    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    monkeypatch.setattr(llama_check, "_decode", decode)
    out = llama_check._child("x.gguf", True, True)
    assert widths == [None, 16]  # the trunk decode, then the MTP step
    assert out["mtp_decode_ok"] is True


def _fake_child(monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """Replace the child with a tiny Python program (``body``), e.g. one that kills itself with a signal."""
    prelude = "import json, os, signal, sys\n"
    monkeypatch.setattr(
        llama_check, "_child_command", lambda path, mtp, trunk: [sys.executable, "-c", prelude + body]
    )


def _stage(stage: str) -> str:
    report = {"loaded": True, "n_layer": 3, "n_layer_nextn": 1, "stage": stage}
    return f"print(json.dumps({report!r}), flush=True)\n"


def test_a_segfault_in_the_trunk_decode_is_reported_as_a_llama_cpp_crash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _fake_child(monkeypatch, _stage("trunk") + "sys.stderr.write('ggml_backend_amx_mul_mat\\n')\n"
                "os.kill(os.getpid(), signal.SIGSEGV)\n")
    check = check_with_llama(tmp_path / "m.gguf")
    assert check.crashed == "SIGSEGV"
    assert check.loaded and check.trunk_decode_ok is False and not check.ok
    assert check.summary() == (
        "llama.cpp crashed in its own compute code (SIGSEGV) during the trunk decode step: this is a fault of the "
        "llama.cpp build, not a verdict on the file (llama.cpp did not refuse it)"
    )
    assert "refused" not in check.summary().replace("did not refuse", "")


def test_a_crash_while_loading_is_not_called_a_refusal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_child(monkeypatch, "os.kill(os.getpid(), signal.SIGBUS)\n")
    check = check_with_llama(tmp_path / "m.gguf")
    assert (check.crashed, check.loaded) == ("SIGBUS", False)
    assert check.summary().startswith("llama.cpp crashed in its own compute code (SIGBUS) while loading the file")
    assert not check.summary().startswith("llama.cpp refused it")


def test_a_ggml_assert_abort_stays_a_refusal_of_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_child(monkeypatch, "sys.stderr.write('llama.cpp:123: GGML_ASSERT(n_dims <= 4) failed\\n')\n"
                "sys.stderr.flush(); os.kill(os.getpid(), signal.SIGABRT)\n")
    check = check_with_llama(tmp_path / "m.gguf")
    assert check.crashed is None and not check.loaded
    assert check.summary() == (
        "llama.cpp refused it: llama.cpp aborted (SIGABRT) while loading the file: "
        "llama.cpp:123: GGML_ASSERT(n_dims <= 4) failed"
    )
