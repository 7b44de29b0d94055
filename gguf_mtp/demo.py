"""The demo: the whole job on an embedded tiny model, offline, in seconds."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from .compose import compose
from .llama_check import INSTALL_HINT, check_with_llama, llama_cpp_available
from .tiny_models import write_draft, write_target

__all__ = ["run_demo"]


def run_demo(
    work_dir: str | os.PathLike[str] | None = None, *, llama: bool | None = None, say: Callable[[str], None] = print
) -> bool:
    """Write a tiny 3-shard ``nemotron_h_moe`` target and an MTP draft, compose them and load the result
    with llama.cpp (when installed). Prints what happens through ``say``; returns success.
    """
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="gguf-mtp-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    target = write_target(work / "target", shards=3, name="Tiny-Nemotron-UD-Q4_K_XL")
    draft = write_draft(work / "mtp-draft.gguf", block=0, with_globals=True)
    say(
        f"1. wrote a tiny nemotron_h_moe target in 3 shards (blocks M,*,E; Q4_K/Q6_K/Q8_0/IQ4_XS/BF16): {target.parent}"
    )
    say(f"2. wrote an MTP draft with one NextN block blk.0 (18 tensors, BF16): {draft}")
    report = compose(target, draft, work / "composite", force=True, progress=False)
    plan = report.plan
    changes = ", ".join(f"{c.key.split('.', 1)[1]} {c.old}->{c.new}" for c in plan.files[0].kv_changes)
    say(
        f"3. composed: {plan.target.tensor_count} target tensors copied byte for byte + {len(plan.renamed)} "
        f"NextN tensors as blk.{plan.block}; {changes}"
    )
    composite = report.output_paths[0]
    use_llama = llama_cpp_available() if llama is None else llama
    if not use_llama:
        say(f"4. llama.cpp check skipped (llama-cpp-python not installed: {INSTALL_HINT})")
        say(f"composite: {composite}")
        return True
    check = check_with_llama(composite)
    say(f"4. {check.summary()}")
    say(f"composite: {composite}")
    return check.ok
