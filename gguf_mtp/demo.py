"""The demo: the whole flow on an embedded tiny model, offline, in seconds.

It is what a newcomer runs first (``python -m gguf_mtp demo``): the same steps as the real pipeline
for Nemotron 3 Super, on a model small enough to write on the spot:

1. a tiny ``nemotron_h_moe`` target quant in 3 shards (as a Hub GGUF repo ships it, without MTP);
2. a tiny MTPv2-style head *checkpoint* (safetensors + config.json, as NVIDIA ships it);
3. convert the head to a GGUF draft block; 4. compose it into the target as its last block;
5. verify the composite (bytes against both inputs; llama.cpp loads it and runs the NextN block);
6. inspect it (the MTP verdict); 7. a publish dry run (the model card that would be uploaded);
8. does the head predict? The tiny target has no tokenizer and its random head predicts nothing, so ``accept``
   predicts llama-server's acceptance on a second composite, the designed test model
   (:mod:`gguf_mtp.testing.cycle_model`: llama.cpp's ``test`` tokenizer, a head right after a known share of
   tokens), which ``accept``, ``bench`` and ``verify --acceptance`` all run on.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from gguf_mtp.check.accept import accept
from gguf_mtp.check.inspect import inspect
from gguf_mtp.check.llama_check import INSTALL_HINT, llama_cpp_available
from gguf_mtp.check.verify import verify
from gguf_mtp.files.create import replace_atomically
from gguf_mtp.files.workdir import claim_work_dir
from gguf_mtp.jobs.compose import compose
from gguf_mtp.jobs.convert import convert
from gguf_mtp.release.card import Provenance
from gguf_mtp.release.publish import CARD_NAME, publish
from gguf_mtp.testing.cycle_model import write_cycle_model
from gguf_mtp.testing.tiny_checkpoints import write_mtpv2_checkpoint
from gguf_mtp.testing.tiny_models import write_target
from gguf_mtp.text import human_bytes

__all__ = ["run_demo"]

TARGET_NAME = "Tiny-Nemotron-UD-Q4_K_XL"
#: The designed model's file stem: ``cycle.gguf`` in the demo's folder, docs/commands.md's ``accept`` example.
CYCLE_NAME = "cycle"
#: Tokens per prompt of the demo's prediction: enough for a hundred drafts over the built-in prompts, in seconds.
ACCEPT_TOKENS = 64


def run_demo(
    work_dir: str | os.PathLike[str] | None = None,
    *,
    llama: bool | None = None,
    say: Callable[[str], None] = print,
    keep: bool = False,
    force: bool = False,
) -> bool:
    """Run the whole flow on a tiny model in ``work_dir`` (default: a new temporary folder, removed at the
    end unless ``keep``).

    Args:
        work_dir: where the files go: a new or empty folder, or one an earlier demo made (its marker,
            :data:`gguf_mtp.files.workdir.MARKER_NAME`); the earlier demo's files there are replaced.
        llama: load the composite with llama.cpp (default: when llama-cpp-python is installed).
        say: where the progress lines go.
        keep: keep the temporary folder (without ``work_dir``) and say where it is.
        force: use a non-empty ``work_dir`` that no demo made (its files of the demo's names are replaced).

    Returns:
        Whether the composite verified (and, with llama.cpp, loaded and ran its NextN block).

    Raises:
        UnsafeOutputError: ``work_dir`` is a file, or a non-empty folder no demo made (without ``force``).
    """
    if work_dir is not None:
        work = Path(work_dir)
        claim_work_dir(work, "demo", force=force)
        return _run(work, llama, say)
    work = Path(tempfile.mkdtemp(prefix="gguf-mtp-demo-"))
    try:
        ok = _run(work, llama, say)
    except BaseException:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        raise
    if keep:
        say(f"kept the demo's files in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
        say(f"removed the demo's temporary folder {work} (--keep or --dir DIR keeps the files)")
    return ok


def _run(work: Path, llama: bool | None, say: Callable[[str], None]) -> bool:
    target = write_target(work / "target", shards=3, name=TARGET_NAME)
    target_files = sorted(target.parent.glob(f"{TARGET_NAME}-*-of-*.gguf"))
    say(
        f"1. target: a tiny nemotron_h_moe quant in {len(target_files)} shards, blocks M,*,E, no MTP "
        f"({human_bytes(sum(p.stat().st_size for p in target_files))}): {target.parent}"
    )
    head = write_mtpv2_checkpoint(work / "head-checkpoint")
    safetensors = sorted(head.glob("*.safetensors"))
    say(f"2. head: an MTPv2 checkpoint like NVIDIA's (config.json + {len(safetensors)} BF16 safetensors files): {head}")

    converted = convert(head, work / "mtp-draft.gguf", target=target, force=True, progress=False)
    plan = converted.plan
    say(
        f"3. convert: {len(plan.tensors)} head tensors -> NextN block blk.{plan.block} "
        f"({human_bytes(converted.output.stat().st_size)}): {converted.output}"
    )

    composed = compose(target, converted.output, work / "composite", force=True, progress=False)
    cplan = composed.plan
    arch_prefix = f"{cplan.target.arch}."
    scalars = [c for c in cplan.files[0].kv_changes if not isinstance(c.new, list)]
    arrays = len(cplan.files[0].kv_changes) - len(scalars)
    changes = ", ".join(
        f"{c.key.removeprefix(arch_prefix)} {c.old}->{c.new}"
        if c.old is not None
        else f"{c.key.removeprefix(arch_prefix)} = {c.new} (new)"
        for c in scalars
    )
    say(
        f"4. compose: {cplan.target.tensor_count} target tensors copied byte for byte + {len(cplan.renamed)} as "
        f"blk.{cplan.block}; {changes}; {arrays} per-layer arrays extended"
    )
    composite = composed.output_paths[0]

    use_llama = llama_cpp_available() if llama is None else llama
    verified = verify(composite, target=target, draft=converted.output, llama=use_llama, progress=False)
    passed = sum(c.ok is True for c in verified.checks)
    if verified.ok:
        say(f"5. verify: {passed} checks passed" + (f"; {verified.llama.summary()}" if verified.llama else ""))
    else:
        failed = "; ".join(f"{c.name}: {c.detail}" for c in verified.failures)
        say(f"5. verify: FAILED {failed}")
    if not use_llama:
        say(f"   (llama.cpp check skipped: {INSTALL_HINT})")

    summary = inspect(composite)
    say(f"6. inspect: {summary.mtp_verdict}; {summary.block_count} blocks, {summary.tensor_count} tensors")

    card = publish(
        composite,
        "you/Tiny-Nemotron-MTP-GGUF",
        dry_run=True,
        progress=False,
        provenance=Provenance(target_repo="unsloth/Tiny-Nemotron-GGUF", head_source="nvidia/Tiny-Nemotron-MTPv2"),
    )
    card_path = work / CARD_NAME
    replace_atomically(card_path, card.card.encode("utf-8"))
    how = card.plan.mode.replace("-", " ")
    say(f"7. publish --dry-run: would upload {len(card.files)} files + {CARD_NAME} as {how}; card: {card_path}")
    _predict_acceptance(work, use_llama, say)
    say(f"composite: {composite}")
    return verified.ok


def _predict_acceptance(work: Path, use_llama: bool, say: Callable[[str], None]) -> None:
    """Step 8: write the designed model and predict its head's acceptance at n-max 1 with ``accept``."""
    model = write_cycle_model(work, name=CYCLE_NAME)
    share = len(model.good) / len(model.cycle)
    say(
        f"8. accept: a tiny glm4moe composite with llama.cpp's test tokenizer, its head designed to draft right "
        f"after {share * 100:.0f} % of tokens ({human_bytes(model.path.stat().st_size)}): {model.path}"
    )
    if not use_llama:
        say(f"   (accept skipped: {INSTALL_HINT})")
        return
    (run,) = accept(model.path, tokens=ACCEPT_TOKENS, n_max=(1,)).runs
    say(
        f"   predicted llama-server acceptance at n-max 1: {run.draft_n_accepted} of {run.draft_n} drafted tokens "
        f"({run.acceptance or 0:.2f}); every n-max: gguf-mtp accept {model.path.name} --tokens {ACCEPT_TOKENS}"
    )
