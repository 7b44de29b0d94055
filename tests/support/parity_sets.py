"""Each family's :class:`~support.upstream.ParitySet`, built once per session and shared by every test that
compares with it, whichever module it is in, then deleted after the last of them.

A test names the set it uses with the ``parity`` marker (``@pytest.mark.parity("step35")``, or the marks of a
``pytest.param``) and takes it from the ``parity`` fixture. The plugin counts, once the run's tests are chosen,
how many use each set; a set's folder goes when the last one has ended, unless a test failed while it was in use
(it then stays for a look, as :func:`support.session.shared_tmp_dir` leaves its folders). Within a module the
tests of one set run together, so a parametrised module holds one family's files at a time.

:data:`BUILDERS` is the one table of how each set is made: the checkpoint builder (``support/<family>_checkpoints``),
the tokenizer's extra special tokens, and, where upstream needs another copy of the checkpoint (DeepSeek V3), another
``--outtype``, a tokenizer setting (DeepSeek V3.2's BOS) or a newer llama.cpp (qwen4exp: build b11434), those.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from gguf_mtp.testing.tiny_checkpoints import write_full_nemotron_checkpoint
from support.deepseek_checkpoints import as_glm47flash, dsa_fp8_release, write_mla_checkpoint
from support.fp8_checkpoints import quantize_checkpoint
from support.glm_checkpoints import GLM_SPECIAL_TOKENS, write_glm_checkpoint
from support.hy_checkpoints import write_hy_checkpoint
from support.ling_checkpoints import write_ling_checkpoint
from support.mimo_checkpoints import write_mimo_checkpoint
from support.nano_checkpoints import NANO_HPARAMS, write_full_nano_checkpoint
from support.qwen4exp_checkpoints import write_qwen4exp_checkpoint
from support.qwen_checkpoints import write_qwen_checkpoint
from support.step_checkpoints import write_step_checkpoint
from support.upstream import ParitySet, llama_cpp_b11434_tree, parity_set, write_gpt2_tokenizer


def _deepseek_v3(work: Path) -> ParitySet:
    """DeepSeek V3's FP8 release; upstream drops its MTP layer (``skip_mtp``), so the reference is upstream's
    GLM-4.7-Flash class (the same deepseek2 tensor handling, FP8 dequantization included) on the very same shards,
    only ``config.json``'s ``architectures`` / ``model_type`` renamed."""
    checkpoint = quantize_checkpoint(write_mla_checkpoint(work / "bf16", "deepseekv3"), work / "hf")
    write_gpt2_tokenizer(checkpoint, GLM_SPECIAL_TOKENS)
    return ParitySet(checkpoint, work, reference=as_glm47flash(checkpoint, work / "as-glm47flash"), outtype="auto")


def _dsa(work: Path, variant: str, fp8_keeps: tuple[str, ...] | None) -> ParitySet:
    """A DSA checkpoint (``variant`` of :func:`write_mla_checkpoint`), FP8 as its release is (keeping ``fp8_keeps``
    in BF16) unless ``None``, converted ``--outtype auto``."""
    checkpoint = write_mla_checkpoint(work / ("hf" if fp8_keeps is None else "bf16"), variant)
    if fp8_keeps is not None:
        checkpoint = quantize_checkpoint(checkpoint, work / "hf", quantized=dsa_fp8_release(fp8_keeps))
    files = parity_set(checkpoint, work, GLM_SPECIAL_TOKENS, outtype="auto")
    # DeepseekV32Model.set_vocab asserts the tokenizer adds a BOS token (V3.2's tokenizer_config.json does)
    config = checkpoint / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "add_bos_token": True}))
    return files


#: set name -> how it is made in a fresh folder ``work`` (the checkpoint in ``work/hf``).
BUILDERS: dict[str, Callable[[Path], ParitySet]] = {
    "glm4moe": lambda work: parity_set(write_glm_checkpoint(work / "hf", qk_norm=True, nextn_copies=True), work,
                                       GLM_SPECIAL_TOKENS),
    "glm4moe-2nextn": lambda work: parity_set(
        write_glm_checkpoint(work / "hf", qk_norm=True, nextn_copies=True, n_nextn=2), work, GLM_SPECIAL_TOKENS),
    "nemotron_nano": lambda work: parity_set(write_full_nano_checkpoint(work / "hf"), work),
    # Nemotron 3 Super: the same tiny dimensions, with the latent MoE Nano lacks
    "nemotron_super": lambda work: parity_set(write_full_nemotron_checkpoint(work / "hf", NANO_HPARAMS), work),
    "hy_v3": lambda work: parity_set(write_hy_checkpoint(work / "hf"), work),
    "hy_v3-2mtp": lambda work: parity_set(write_hy_checkpoint(work / "hf", n_nextn=2), work),
    "bailingmoe3": lambda work: parity_set(write_ling_checkpoint(work / "hf"), work),
    "step35": lambda work: parity_set(write_step_checkpoint(work / "hf"), work),
    "mimo2-bf16": lambda work: parity_set(write_mimo_checkpoint(work / "hf"), work, name="bf16"),
    "mimo2-tp4": lambda work: parity_set(write_mimo_checkpoint(work / "hf", fp8="tp4"), work, name="tp4"),
    **{variant: lambda work, variant=variant: parity_set(write_qwen_checkpoint(work / "hf", variant), work,
                                                         name=variant)
       for variant in ("qwen35moe", "qwen35", "qwen3next")},
    "glm47flash": lambda work: parity_set(write_mla_checkpoint(work / "hf", "glm47flash"), work, GLM_SPECIAL_TOKENS,
                                          outtype="auto"),
    "deepseekv3": _deepseek_v3,
    "deepseekv32": lambda work: _dsa(work, "deepseekv32", ()),
    "glm5": lambda work: _dsa(work, "glm5", ("eh_proj",)),
    "glm5-bf16": lambda work: _dsa(work, "glm5", None),
    # Qwen3.8-Flash-Next: llama.cpp has its MTP graph and exports its head from b11434 on, so b11434's converter is
    # the reference (the vendored 0c1e570's drops the head)
    "qwen4exp": lambda work: parity_set(write_qwen4exp_checkpoint(work / "hf"), work, tree=llama_cpp_b11434_tree()),
}


class ParitySets:
    """The session's sets: made on first use, deleted after their last user (see the module's text)."""

    def __init__(self) -> None:
        self._sets: dict[str, tuple[ParitySet, int]] = {}  # name -> (set, session.testsfailed when made)
        self.users: Counter[str] = Counter()

    def get(self, name: str, request: pytest.FixtureRequest) -> ParitySet:
        """The set ``name``, made now if no test has used it yet."""
        if name not in self._sets:
            factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
            self._sets[name] = (BUILDERS[name](factory.mktemp(f"parity-{name}")), request.session.testsfailed)
        return self._sets[name][0]

    def done(self, name: str, session: pytest.Session) -> None:
        """One user of ``name`` has ended; after the last, its folder goes (unless a test failed meanwhile)."""
        self.users[name] -= 1
        if self.users[name] > 0 or name not in self._sets:
            return
        files, failed_before = self._sets.pop(name)
        if session.testsfailed == failed_before:
            shutil.rmtree(files.work, ignore_errors=True)


_KEY = pytest.StashKey[ParitySets]()


def _name(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("parity")
    return None if marker is None else str(marker.args[0])


def work_unit(nodeid: str) -> str:
    """What one pytest-xdist worker runs together (``make test``'s ``pytest -n``, :mod:`support.scheduling`): every
    test of one ParitySet, wherever it is, when the test's id names the set (``test_x[glm5]``: the set is made once
    and deleted after its last user there), else the test's module (its module-scoped fixtures made once)."""
    module, _, rest = nodeid.partition("::")
    if rest.endswith("]") and "[" in rest:
        name = rest[rest.index("[") + 1 : -1]
        if name in BUILDERS:
            return f"parity:{name}"
    return module


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``parity(name)`` itself (rather than through a ``pytest.param``) gets the id ``[name]`` too: every
    test's id names the set it uses (:func:`work_unit`)."""
    marker = metafunc.definition.get_closest_marker("parity")
    if marker is not None and "parity" in metafunc.fixturenames:
        name = str(marker.args[0])
        metafunc.parametrize("parity", [name], indirect=True, ids=[name])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Within each module, the tests of one set together (in the order the module first uses them); a test whose id
    does not name the set it uses is refused (its worker would make the set again)."""
    first: dict[tuple[str, str], int] = {}
    order: list[tuple[int, int]] = []
    for index, item in enumerate(items):
        name = _name(item)
        if name is not None and work_unit(item.nodeid) != f"parity:{name}":
            raise pytest.UsageError(f"{item.nodeid} uses ParitySet {name!r}: its id must be [{name}] "
                                    "(pytest.param(..., id=name) or a parity marker on the test itself)")
        group = first.setdefault((item.nodeid.split("::")[0], name), index) if name is not None else index
        order.append((group, index))
    items[:] = [items[index] for _, index in sorted(order)]


def pytest_collection_finish(session: pytest.Session) -> None:
    sets = ParitySets()
    sets.users.update(name for item in session.items if (name := _name(item)) is not None)
    session.config.stash[_KEY] = sets


@pytest.fixture
def parity(request: pytest.FixtureRequest) -> ParitySet:
    """The ParitySet this test's ``parity`` marker names (made on first use, shared for the session)."""
    name = _name(request.node)
    assert name is not None, "the parity fixture needs @pytest.mark.parity(name)"
    sets = request.config.stash[_KEY]
    request.addfinalizer(lambda: sets.done(name, request.session))
    return sets.get(name, request)
