"""Each family's :class:`~support.upstream.ParitySet`, built once per session and shared by every test that
compares with it, whichever module it is in, then deleted after the last of them.

A test names the set it uses with the ``parity`` marker (``@pytest.mark.parity("step35")``, or the marks of a
``pytest.param``) and takes it from the ``parity`` fixture. The plugin counts, once the run's tests are chosen,
how many use each set; a set's folder goes when the last one has ended, unless a test failed while it was in use
(it then stays for a look, as :func:`support.session.shared_tmp_dir` leaves its folders). Within a module the
tests of one set run together, so a parametrised module holds one family's files at a time.

:data:`BUILDERS` is the one table of how each set is made: the checkpoint builder (``support/<family>_checkpoints``),
the tokenizer's extra special tokens, and, where upstream needs another copy of the checkpoint (DeepSeek V3), another
``--outtype`` or a tokenizer setting (DeepSeek V3.2's BOS), those. Each builder makes its set with the converter of
either llama.cpp the parity tests prove against (:func:`builds_of`: 0c1e570, the one llama-cpp-python vendors, and
b11434; qwen4exp at b11434 only): :func:`set_name` names the set at each (``glm5``, ``glm5-b11434``), :data:`SETS`
lists them all.
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
from support.upstream import B11434, VENDORED, ParitySet, parity_set, write_gpt2_tokenizer


def _deepseek_v3(work: Path, build: str) -> ParitySet:
    """DeepSeek V3's FP8 release; upstream drops its MTP layer (``skip_mtp``), so the reference is upstream's
    GLM-4.7-Flash class (the same deepseek2 tensor handling, FP8 dequantization included) on the very same shards,
    only ``config.json``'s ``architectures`` / ``model_type`` renamed."""
    checkpoint = quantize_checkpoint(write_mla_checkpoint(work / "bf16", "deepseekv3"), work / "hf")
    write_gpt2_tokenizer(checkpoint, GLM_SPECIAL_TOKENS)
    return ParitySet(checkpoint, work, reference=as_glm47flash(checkpoint, work / "as-glm47flash"), outtype="auto",
                     build=build)


def _dsa(work: Path, build: str, variant: str, fp8_keeps: tuple[str, ...] | None) -> ParitySet:
    """A DSA checkpoint (``variant`` of :func:`write_mla_checkpoint`), FP8 as its release is (keeping ``fp8_keeps``
    in BF16) unless ``None``, converted ``--outtype auto``."""
    checkpoint = write_mla_checkpoint(work / ("hf" if fp8_keeps is None else "bf16"), variant)
    if fp8_keeps is not None:
        checkpoint = quantize_checkpoint(checkpoint, work / "hf", quantized=dsa_fp8_release(fp8_keeps))
    files = parity_set(checkpoint, work, GLM_SPECIAL_TOKENS, outtype="auto", build=build)
    # DeepseekV32Model.set_vocab asserts the tokenizer adds a BOS token (V3.2's tokenizer_config.json does)
    config = checkpoint / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "add_bos_token": True}))
    return files


#: builder -> how its set is made in a fresh folder ``work`` (the checkpoint in ``work/hf``) by llama.cpp ``build``'s
#: converter.
BUILDERS: dict[str, Callable[[Path, str], ParitySet]] = {
    "glm4moe": lambda work, build: parity_set(
        write_glm_checkpoint(work / "hf", qk_norm=True, nextn_copies=True), work, GLM_SPECIAL_TOKENS, build=build),
    "glm4moe-2nextn": lambda work, build: parity_set(
        write_glm_checkpoint(work / "hf", qk_norm=True, nextn_copies=True, n_nextn=2), work, GLM_SPECIAL_TOKENS,
        build=build),
    "nemotron_nano": lambda work, build: parity_set(write_full_nano_checkpoint(work / "hf"), work, build=build),
    # Nemotron 3 Super: the same tiny dimensions, with the latent MoE Nano lacks
    "nemotron_super": lambda work, build: parity_set(write_full_nemotron_checkpoint(work / "hf", NANO_HPARAMS), work,
                                                     build=build),
    "hy_v3": lambda work, build: parity_set(write_hy_checkpoint(work / "hf"), work, build=build),
    "hy_v3-2mtp": lambda work, build: parity_set(write_hy_checkpoint(work / "hf", n_nextn=2), work, build=build),
    "bailingmoe3": lambda work, build: parity_set(write_ling_checkpoint(work / "hf"), work, build=build),
    "step35": lambda work, build: parity_set(write_step_checkpoint(work / "hf"), work, build=build),
    "mimo2-bf16": lambda work, build: parity_set(write_mimo_checkpoint(work / "hf"), work, name="bf16", build=build),
    "mimo2-tp4": lambda work, build: parity_set(write_mimo_checkpoint(work / "hf", fp8="tp4"), work, name="tp4",
                                                build=build),
    **{variant: lambda work, build, variant=variant: parity_set(write_qwen_checkpoint(work / "hf", variant), work,
                                                                name=variant, build=build)
       for variant in ("qwen35moe", "qwen35", "qwen3next")},
    "glm47flash": lambda work, build: parity_set(write_mla_checkpoint(work / "hf", "glm47flash"), work,
                                                 GLM_SPECIAL_TOKENS, outtype="auto", build=build),
    "deepseekv3": _deepseek_v3,
    "deepseekv32": lambda work, build: _dsa(work, build, "deepseekv32", ()),
    "glm5": lambda work, build: _dsa(work, build, "glm5", ("eh_proj",)),
    "glm5-bf16": lambda work, build: _dsa(work, build, "glm5", None),
    "qwen4exp": lambda work, build: parity_set(write_qwen4exp_checkpoint(work / "hf"), work, build=build),
}
#: Builders whose set exists at b11434 only. Qwen3.8-Flash-Next: llama.cpp has its MTP graph and exports its head
#: from b11434 on (the vendored 0c1e570's converter drops the head).
B11434_ONLY = frozenset({"qwen4exp"})


def builds_of(builder: str) -> tuple[str, ...]:
    """The llama.cpp builds ``builder``'s set is made at, its default first."""
    return (B11434,) if builder in B11434_ONLY else (VENDORED, B11434)


def set_name(builder: str, build: str) -> str:
    """The name of ``builder``'s set at ``build``: the builder's own at its default build (``glm5``, ``qwen4exp``),
    else ``<builder>-<build>`` (``glm5-b11434``): the name a test's id and ``parity`` marker carry."""
    return builder if build == builds_of(builder)[0] else f"{builder}-{build}"


#: set name -> (builder, build): every set a test may name.
SETS: dict[str, tuple[str, str]] = {
    set_name(builder, build): (builder, build) for builder in BUILDERS for build in builds_of(builder)}


class ParitySets:
    """The session's sets: made on first use, deleted after their last user (see the module's text)."""

    def __init__(self) -> None:
        self._sets: dict[str, tuple[ParitySet, int]] = {}  # name -> (set, session.testsfailed when made)
        self.users: Counter[str] = Counter()

    def get(self, name: str, request: pytest.FixtureRequest) -> ParitySet:
        """The set ``name``, made now if no test has used it yet (in a folder naming its builder and build)."""
        if name not in self._sets:
            builder, build = SETS[name]
            factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
            work = factory.mktemp(f"parity-{builder}-at-{build}")
            self._sets[name] = (BUILDERS[builder](work, build), request.session.testsfailed)
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
        if name in SETS:
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
