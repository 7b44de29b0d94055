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
one the Job can reach (https or ssh), less what may hold a credential (an https user name, a password, a query, a
fragment: a note says so), and ``--dry-run`` says which. The pipeline's options are read with the pipeline's
own parser (where gguf-py is importable; else by their full names only), so the Job reads them the same way.
The token goes to the Job as the secret ``HF_TOKEN`` (never as a plain variable). A Job's disk is discarded
when it ends, so a submitted run must publish (``--out-repo``).

``--mount-target`` (the default where the installed huggingface_hub has Job volumes, 1.8.0 and later): the Job
mounts the target repo read-only at the commit resolved when submitting (``Volume(type="model", ...,
revision=COMMIT)``) and runs ``pipeline --target-dir`` on it: nothing is downloaded, and the Job's disk needs
to hold only the composite (about the target's size). Without it (``--no-mount-target``, or an older
huggingface_hub) the Job downloads the target first: pick a flavor whose ephemeral storage holds the target
and the composite (about twice the target's size). ``--dry-run`` prints the exact request and both figures.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

#: The distribution and extra the Job installs, from the git URL of --package or of this checkout's origin.
REQUIREMENT = "gguf-mtp[llama]"
DEFAULT_FLAVOR = "cpu-xl"
DEFAULT_TIMEOUT = "8h"
#: Where the Job mounts the target repo (not /data: huggingface_hub ships a local script to the Job there).
MOUNT_PATH = "/target-repo"
#: The huggingface_hub release that added Job volumes (``huggingface_hub.Volume``, ``run_uv_job(volumes=...)``).
VOLUMES_SINCE = "1.8.0"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
#: The pipeline options this script reads itself: the target it mounts, and the repo a Job must publish to.
READ_OPTIONS = ("--target-repo", "--target-files", "--target-revision", "--target-dir", "--out-repo")
FULL_NAMES_NOTE = ("the pipeline's options are read here by their full names only and not checked (gguf-py is not "
                   "importable here; `make install` in this clone lets this script check them before submitting)")


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
    p.add_argument("--mount-target", action=argparse.BooleanOptionalAction, default=None,
                   help="mount the target repo read-only in the Job (at the commit resolved now) instead of "
                   f"downloading it (default: on where huggingface_hub has Job volumes, {VOLUMES_SINCE} and later)")
    return p


def pipeline_arguments(pipeline_args: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The pipeline's options as the Job's ``gguf-mtp pipeline`` will read them (its own parser: abbreviations and
    ``--opt=value`` alike), and the notes on how they were read.

    Raises:
        ValueError: options the pipeline would refuse (gguf-mtp's ``ParameterError``), one line.
    """
    cli = _library("gguf_mtp.cli.pipeline")
    if cli is not None:
        with contextlib.suppress(ImportError):  # gguf-py missing (`uv run`): --outtype's names are its tables
            return cli.read_pipeline_arguments(pipeline_args), []
    return _read_by_full_names(pipeline_args), [FULL_NAMES_NOTE]


def _read_by_full_names(pipeline_args: list[str]) -> argparse.Namespace:
    """Without the pipeline's parser: the options this script reads, by their full names (``--opt=value`` too).
    An abbreviation of one is refused: the Job's parser would take it for that option, and this one could not."""
    for argument in pipeline_args:
        name = argument.partition("=")[0]
        meant = [option for option in READ_OPTIONS if option.startswith(name) and option != name]
        if name.startswith("--") and meant:
            raise ValueError(f"{name}: write the option in full ({' or '.join(meant)}): without gguf-py here, this "
                             "script cannot read an abbreviation as the pipeline would")
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in READ_OPTIONS:
        p.add_argument(flag)
    return p.parse_known_args(pipeline_args)[0]


class OriginPackage(NamedTuple):
    """The requirement that installs this checkout's origin remote, and the parts of the remote's address left
    out of it because they may hold a credential (never sent to the Job, never printed)."""

    requirement: str
    left_out: tuple[str, ...]


def public_address(url: str) -> tuple[str, tuple[str, ...]]:
    """``url`` without any part that may hold a credential, and the names of the parts left out: the user name and
    password of an http(s) address (``https://USER:TOKEN@host/...``), the password of an ssh one (its user,
    ``git@``, is the login ssh needs, not a secret), a query string and a fragment (``?private_token=...``)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    left_out: list[str] = []
    if at and parts.scheme == "ssh":
        host = f"{user}@{host}" if user else host
        if colon:
            left_out.append("a password")
    elif at:
        left_out.append("a user name and password" if colon else "a user name (or token)")
    if parts.query:
        left_out.append("a query string")
    if parts.fragment:
        left_out.append("a fragment")
    return urlunsplit((parts.scheme, host, parts.path, "", "")), tuple(left_out)


def checkout_package(root: Path | None = None) -> OriginPackage | None:
    """``gguf-mtp[llama] @ git+URL`` for this checkout's ``origin`` remote, or ``None`` without a usable one.

    Only an address a Job can reach is used: ``https://``, ``http://``, ``ssh://`` or ``git@host:path``
    (rewritten as ``ssh://``); a local path or no git at all gives ``None``. What may hold a credential is left
    out of it (:func:`public_address`): the requirement is visible in the Job and printed by ``--dry-run``.
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
    address, left_out = public_address(url)
    return OriginPackage(f"{REQUIREMENT} @ git+{address}", left_out)


def _package(args: argparse.Namespace) -> tuple[str | None, str, list[str]]:
    """The requirement the Job installs, where it came from, and the note on what of it was left out."""
    if args.package:
        return args.package, "--package", []
    if os.environ.get("GGUF_MTP_PACKAGE", "").strip():
        return os.environ["GGUF_MTP_PACKAGE"].strip(), "GGUF_MTP_PACKAGE", []
    origin = checkout_package()
    if origin is None:
        return None, "this checkout's origin remote", []
    notes = [f"this checkout's origin remote has {' and '.join(origin.left_out)} in its address: left out of the "
             "Job's requirement (a private repo needs --package)"] if origin.left_out else []
    return origin.requirement, "this checkout's origin remote", notes


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


def job_request(args: argparse.Namespace, pipeline_args: list[str], mount: Any = None) -> dict[str, Any]:
    """The keyword arguments of ``HfApi.run_uv_job`` for this submission (without the token).

    ``mount``: a ``huggingface_hub.Volume`` of the target repo: the pipeline then reads the target from it
    (``--target-dir``) at the volume's revision instead of downloading it.
    """
    request: dict[str, Any] = {
        "script": str(Path(__file__).resolve()),
        "script_args": ["--local", *pipeline_args],
        "dependencies": [_package(args)[0]],
        "flavor": args.flavor,
        "timeout": args.timeout,
        "namespace": args.namespace,
        "env": {"PYTHONUNBUFFERED": "1"},
    }
    if mount is not None:
        # The last --target-revision wins (argparse): the commit the volume is pinned to, whatever was asked.
        request["script_args"] += ["--target-dir", mount.mount_path, "--target-revision", mount.revision]
        request["volumes"] = [mount]
    return request


def volume_class(api: Any = None) -> Any:
    """``huggingface_hub.Volume`` where Jobs can mount repos (the class exists and ``run_uv_job`` takes
    ``volumes``), else ``None``."""
    try:
        from huggingface_hub import Volume
    except ImportError:
        return None
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi
    method = getattr(api, "run_uv_job", None)
    if method is None:
        return None
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return None
    takes = any(p.name == "volumes" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    return Volume if takes else None


def _hub_version() -> str:
    from huggingface_hub import __version__

    return __version__


def _resolve_commit(api: Any, repo: str, revision: str | None, token: str | None) -> str:
    """The commit ``revision`` (default: main) of ``repo`` is at now: what the Job's volume is pinned to."""
    if revision is not None and _COMMIT.match(revision):
        return revision
    info = api.model_info(repo, revision=revision, token=token)
    return str(info.sha)


def _disk_lines(api: Any, target: argparse.Namespace, commit: str, token: str | None) -> list[str]:
    """The disk the Job needs with the mount (the composite), next to what it needs without (target + composite),
    from the Hub's sizes of the target's shard set at ``commit``."""
    library = _library("gguf_mtp.release.pipeline.target")
    client = _library("gguf_mtp.hub.client")
    if library is None or client is None:
        return ["disk: not computed here (gguf-mtp's libraries are not importable: run this dry run from a clone "
                "after `make install`); the Job checks its disk before the first byte"]
    names = library.select_target_files(
        client.list_repo_files(api, target.target_repo, token=token, revision=commit), target.target_files
    )
    remote = client.remote_files(api, target.target_repo, names, token=token, revision=commit)
    total = sum(remote[n].size for n in names if n in remote)
    gib = 2**30
    return [
        f"disk: the Job needs about {total / gib:,.1f} GiB ({total:,} bytes: the composite; the target's "
        f"{len(names)} file(s) are read from the mount), plus the head's MTP files and the draft",
        f"      without the mount: about {2 * total / gib:,.1f} GiB ({2 * total:,} bytes: the target downloaded + "
        "the composite)",
    ]


def _is_bad_input(error: BaseException) -> bool:
    """Whether ``error`` is one a user can fix and gets as one line: gguf-mtp's own (a Hub refusal mapped by its
    Hub boundary, a pattern naming no complete model), or without gguf-mtp here, huggingface_hub's."""
    errors = _library("gguf_mtp.errors")
    if errors is not None:
        return isinstance(error, errors.GGUFMTPError)
    return isinstance(error, (OSError, ValueError))


def _library(module: str) -> Any:
    """A gguf-mtp module (installed, or from this checkout), or None where it cannot be imported here."""
    if _hub_boundary() is None:
        return None
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def submit(args: argparse.Namespace, pipeline_args: list[str], *, api: Any = None) -> int:
    """Submit the pipeline as a Job; returns the exit status."""
    try:
        options, notes = pipeline_arguments(pipeline_args)
    except ValueError as e:  # gguf-mtp's ParameterError: what the pipeline would refuse when the Job starts
        print(f"hf_job.py: error: {e}", file=sys.stderr)
        return 2
    if options.out_repo is None:
        print("hf_job.py: error: a Job's disk is discarded when it ends: pass --out-repo OWNER/NAME", file=sys.stderr)
        return 2
    token = None if args.dry_run else _token()
    if not args.dry_run and not token:
        print("hf_job.py: error: no Hugging Face token (set HF_TOKEN or run `hf auth login`)", file=sys.stderr)
        return 2
    package, source, package_notes = _package(args)
    if package is None:
        print("hf_job.py: error: gguf-mtp is not on PyPI and this checkout has no https/ssh origin remote: pass "
              "--package 'gguf-mtp[llama] @ git+https://.../gguf-mtp@COMMIT' (or set GGUF_MTP_PACKAGE)",
              file=sys.stderr)
        return 2
    args.package = package
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    if not args.dry_run and not hasattr(api, "run_uv_job"):
        print(f"hf_job.py: error: huggingface_hub {_hub_version()} cannot submit Jobs (HfApi.run_uv_job is newer): "
              "pip install -U huggingface_hub, or run `uv run scripts/hf_job.py ...`", file=sys.stderr)
        return 2
    notes += package_notes
    volume = volume_class(api)
    mounted = args.mount_target is not False and options.target_dir is None and options.target_repo is not None
    if mounted and volume is None:
        if args.mount_target:
            print(f"hf_job.py: error: huggingface_hub {_hub_version()} cannot mount the target in a Job (Job volumes, "
                  f"huggingface_hub.Volume, came in huggingface_hub {VOLUMES_SINCE}): pip install -U "
                  f"'huggingface_hub>={VOLUMES_SINCE}', or pass --no-mount-target to download it in the Job",
                  file=sys.stderr)
            return 2
        notes.append(f"huggingface_hub {_hub_version()} has no Job volumes (added in {VOLUMES_SINCE}): the Job "
                     "downloads the target")
        mounted = False
    mount, commit, disk = None, None, []
    if mounted:
        read_token = token or _token()  # a dry run reads the Hub too (a private target needs the token)
        boundary = _hub_boundary()
        guard = boundary.hub_errors("look up the target's commit", options.target_repo) if boundary \
            else contextlib.nullcontext()
        try:
            with guard:
                commit = _resolve_commit(api, options.target_repo, options.target_revision, read_token)
                disk = _disk_lines(api, options, commit, read_token) if args.dry_run else []
        except Exception as e:  # one line for what the user can fix: a Hub refusal, a pattern naming no model
            if not _is_bad_input(e):
                raise
            print(f"hf_job.py: error: {e}", file=sys.stderr)
            return 2
        mount = volume(type="model", source=options.target_repo, mount_path=MOUNT_PATH, revision=commit,
                       read_only=True)
    request = job_request(args, pipeline_args, mount)
    if args.dry_run:
        print(f"package: the Job installs {package!r} (from {source})")
        if mount is not None:
            print(f"target: {options.target_repo} at commit {commit}, mounted read-only at {MOUNT_PATH} and read "
                  "from the mounted repo, not downloaded")
        else:
            print("target: downloaded in the Job (--no-mount-target, or a huggingface_hub without Job volumes)")
        for note in notes:
            print(f"note: {note}")
        print("would submit HfApi.run_uv_job(")
        for key, value in request.items():
            print(f"    {key}={value!r},")
        print("    secrets={'HF_TOKEN': <your token>},")
        print(")")
        for line in disk:
            print(line)
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
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
