#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "huggingface_hub>=0.30",
# ]
# ///
"""Run the gguf-mtp pipeline as a Hugging Face Job, or here with ``--local``.

Submitting needs only ``huggingface_hub`` (the dependency above) and a token with write access; the
Job itself installs gguf-mtp from ``--package`` and runs this same script with ``--local``. Every
option this script does not know is passed on to ``gguf-mtp pipeline`` unchanged::

    uv run scripts/hf_job.py --flavor cpu-xl --timeout 8h -- \\
        --target-repo unsloth/NVIDIA-Nemotron-3-Super-120B-A12B-GGUF \\
        --target-files 'UD-Q4_K_XL/NVIDIA-Nemotron-3-Super-120B-A12B-UD-Q4_K_XL-*-of-*.gguf' \\
        --head-repo OWNER/NVIDIA-Nemotron-3-Super-120B-A12B-BF16-MTPv2 \\
        --out-repo YOU/NVIDIA-Nemotron-3-Super-120B-A12B-UD-Q4_K_XL-MTP-GGUF

The package source is a placeholder until gguf-mtp is on PyPI: pass the requirement the Job should
install, e.g. ``--package "gguf-mtp[llama] @ git+https://github.com/OWNER/gguf-mtp@COMMIT"``, or set
``GGUF_MTP_PACKAGE``. The token goes to the Job as the secret ``HF_TOKEN`` (never as a plain variable).
A Job's disk is discarded when it ends, so a submitted run must publish (``--out-repo``); pick a flavor
whose ephemeral storage holds the target and the composite (about twice the target's size).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

#: What the Job installs (placeholder until gguf-mtp is published; override with --package).
DEFAULT_PACKAGE = "gguf-mtp[llama]"
DEFAULT_FLAVOR = "cpu-xl"
DEFAULT_TIMEOUT = "8h"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hf_job.py",
        allow_abbrev=False,  # never mistake a pipeline option for an abbreviation of ours
        description="Submit `gguf-mtp pipeline` as a Hugging Face Job (default) or run it here (--local). "
        "Unknown options are passed to the pipeline; put them after `--`.",
    )
    p.add_argument("--local", action="store_true", help="run the pipeline here instead of submitting a Job")
    p.add_argument("--flavor", default=DEFAULT_FLAVOR, help=f"Job hardware (default: {DEFAULT_FLAVOR})")
    p.add_argument("--timeout", default=DEFAULT_TIMEOUT,
                   help=f"Job time limit, e.g. 90m, 8h (default: {DEFAULT_TIMEOUT})")
    p.add_argument("--package", default=os.environ.get("GGUF_MTP_PACKAGE", DEFAULT_PACKAGE),
                   help="requirement the Job installs gguf-mtp from (default: $GGUF_MTP_PACKAGE or "
                   f"{DEFAULT_PACKAGE!r})")
    p.add_argument("--namespace", help="user or organisation the Job runs under (default: the token's user)")
    p.add_argument("--dry-run", action="store_true", help="print the Job that would be submitted; submit nothing")
    return p


def _token() -> str | None:
    env = os.environ.get("HF_TOKEN", "").strip()
    if env:
        return env
    from huggingface_hub import get_token

    return get_token()


def job_request(args: argparse.Namespace, pipeline_args: list[str]) -> dict[str, Any]:
    """The keyword arguments of ``HfApi.run_uv_job`` for this submission (without the token)."""
    return {
        "script": str(Path(__file__).resolve()),
        "script_args": ["--local", *pipeline_args],
        "dependencies": [args.package],
        "flavor": args.flavor,
        "timeout": args.timeout,
        "namespace": args.namespace,
        "env": {"PYTHONUNBUFFERED": "1"},
    }


def submit(args: argparse.Namespace, pipeline_args: list[str], *, api: Any = None) -> int:
    """Submit the pipeline as a Job; returns the exit status."""
    if "--out-repo" not in pipeline_args and not any(a.startswith("--out-repo=") for a in pipeline_args):
        print("hf_job.py: error: a Job's disk is discarded when it ends: pass --out-repo OWNER/NAME", file=sys.stderr)
        return 2
    request = job_request(args, pipeline_args)
    if args.dry_run:
        print("would submit HfApi.run_uv_job(")
        for key, value in request.items():
            print(f"    {key}={value!r},")
        print("    secrets={'HF_TOKEN': <your token>},")
        print(")")
        return 0
    token = _token()
    if not token:
        print("hf_job.py: error: no Hugging Face token (set HF_TOKEN or run `hf auth login`)", file=sys.stderr)
        return 2
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    job = api.run_uv_job(**request, secrets={"HF_TOKEN": token}, token=token)
    job_id = getattr(job, "id", job)
    print(f"submitted Job {job_id} on {args.flavor} (timeout {args.timeout})")
    url = getattr(job, "url", None)
    if url:
        print(f"status: {url}")
    print(f"logs:   hf jobs logs {job_id}")
    return 0


def run_local(pipeline_args: list[str]) -> int:
    """Run ``gguf-mtp pipeline`` here (this is also what the Job runs)."""
    try:
        from gguf_mtp.cli import main
    except ImportError:
        print("hf_job.py: error: gguf-mtp is not installed here (pip install 'gguf-mtp[llama]', or run with "
              "`uv run --with 'gguf-mtp[llama]' scripts/hf_job.py --local ...`)", file=sys.stderr)
        return 2
    return main(["pipeline", *pipeline_args])


def main(argv: list[str] | None = None, *, api: Any = None) -> int:
    args, pipeline_args = build_parser().parse_known_args(argv)
    pipeline_args = [a for a in pipeline_args if a != "--"]
    if not pipeline_args:
        build_parser().error("no pipeline options given (--target-repo, --target-files, --head-repo, ...)")
    if args.local:
        return run_local(pipeline_args)
    return submit(args, pipeline_args, api=api)


if __name__ == "__main__":
    sys.exit(main())
