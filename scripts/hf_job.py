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

gguf-mtp is not on PyPI, so the Job installs it from git: ``--package`` names the requirement
(``--package "gguf-mtp[llama] @ git+https://github.com/OWNER/gguf-mtp@COMMIT"``, or ``GGUF_MTP_PACKAGE``);
without either, this checkout's ``origin`` remote is used (``gguf-mtp[llama] @ git+URL``) when it has
one the Job can reach (https or ssh), and ``--dry-run`` says which. The token goes to the Job as the
secret ``HF_TOKEN`` (never as a plain variable). A Job's disk is discarded when it ends, so a submitted
run must publish (``--out-repo``); pick a flavor whose ephemeral storage holds the target and the
composite (about twice the target's size).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

#: The distribution and extra the Job installs, from the git URL of --package or of this checkout's origin.
REQUIREMENT = "gguf-mtp[llama]"
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
    p.add_argument("--package",
                   help="requirement the Job installs gguf-mtp from, e.g. 'gguf-mtp[llama] @ git+https://...' "
                   f"(default: $GGUF_MTP_PACKAGE, else '{REQUIREMENT} @ git+URL' of this checkout's origin remote)")
    p.add_argument("--namespace", help="user or organisation the Job runs under (default: the token's user)")
    p.add_argument("--dry-run", action="store_true", help="print the Job that would be submitted; submit nothing")
    return p


def checkout_package(root: Path | None = None) -> str | None:
    """``gguf-mtp[llama] @ git+URL`` for this checkout's ``origin`` remote, or ``None`` without a usable one.

    Only an address a Job can reach is used: ``https://``, ``http://``, ``ssh://`` or ``git@host:path``
    (rewritten as ``ssh://``); a local path or no git at all gives ``None``.
    """
    import subprocess

    folder = root or Path(__file__).resolve().parent.parent
    try:
        url = subprocess.run(
            ["git", "-C", str(folder), "remote", "get-url", "origin"],
            capture_output=True, text=True, timeout=30, check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    scp = re.fullmatch(r"([\w.-]+@[\w.-]+):(?!/)(.+)", url)
    if scp:
        url = f"ssh://{scp[1]}/{scp[2]}"
    if not re.match(r"(https?|ssh)://\S+$", url):
        return None
    return f"{REQUIREMENT} @ git+{url}"


def _package(args: argparse.Namespace) -> tuple[str | None, str]:
    """The requirement the Job installs and where it came from."""
    if args.package:
        return args.package, "--package"
    if os.environ.get("GGUF_MTP_PACKAGE", "").strip():
        return os.environ["GGUF_MTP_PACKAGE"].strip(), "GGUF_MTP_PACKAGE"
    return checkout_package(), "this checkout's origin remote"


def _hub_boundary() -> Any:
    """gguf-mtp's Hub boundary (installed, or from this checkout: it needs only huggingface_hub), or None."""
    try:
        from gguf_mtp.hub import client
    except ImportError:
        root = str(Path(__file__).resolve().parent.parent)
        if not (Path(root) / "gguf_mtp" / "hub" / "client.py").is_file():
            return None
        sys.path.insert(0, root)
        try:
            from gguf_mtp.hub import client
        except ImportError:
            return None
    return client


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
        "dependencies": [args.package or _package(args)[0]],
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
    token = None if args.dry_run else _token()
    if not args.dry_run and not token:
        print("hf_job.py: error: no Hugging Face token (set HF_TOKEN or run `hf auth login`)", file=sys.stderr)
        return 2
    package, source = _package(args)
    if package is None:
        print("hf_job.py: error: gguf-mtp is not on PyPI and this checkout has no https/ssh origin remote: pass "
              "--package 'gguf-mtp[llama] @ git+https://.../gguf-mtp@COMMIT' (or set GGUF_MTP_PACKAGE)",
              file=sys.stderr)
        return 2
    args.package = package
    request = job_request(args, pipeline_args)
    if args.dry_run:
        print(f"package: the Job installs {package!r} (from {source})")
        print("would submit HfApi.run_uv_job(")
        for key, value in request.items():
            print(f"    {key}={value!r},")
        print("    secrets={'HF_TOKEN': <your token>},")
        print(")")
        return 0
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    if not hasattr(api, "run_uv_job"):
        from huggingface_hub import __version__ as hub_version

        print(f"hf_job.py: error: huggingface_hub {hub_version} cannot submit Jobs (HfApi.run_uv_job is newer): "
              "pip install -U huggingface_hub, or run `uv run scripts/hf_job.py ...`", file=sys.stderr)
        return 2
    boundary = _hub_boundary()
    guard = boundary.hub_errors("submit the Job", args.namespace or "jobs") if boundary else contextlib.nullcontext()
    try:
        with guard, warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*run_uv_job' is experimental")  # one line, not three
            job = api.run_uv_job(**request, secrets={"HF_TOKEN": token}, token=token)
    except OSError as e:  # gguf-mtp's HubError (one line, the host and the cause of a network failure)
        if boundary is None or not isinstance(e, boundary.HubError):
            raise
        print(f"hf_job.py: error: {e}", file=sys.stderr)
        return 2
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
        print("hf_job.py: error: gguf-mtp is not installed here (in a clone: `make install` or "
              "pip install '.[llama]'; or run with `uv run --with 'gguf-mtp[llama] @ git+URL' "
              "scripts/hf_job.py --local ...`)", file=sys.stderr)
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
