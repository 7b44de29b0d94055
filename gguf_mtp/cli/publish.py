"""``gguf-mtp publish OUTDIR --repo OWNER/NAME``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gguf_mtp.release.card import Provenance
    from gguf_mtp.release.publish import PublishOptions


from .common import add_output_flags, print_json, print_report


def add_provenance_flags(p: argparse.ArgumentParser) -> None:
    """Where the composite came from, for the model card."""
    g = p.add_argument_group("provenance (shown in the model card)")
    g.add_argument("--target-repo", metavar="OWNER/REPO", help="the Hub repo of the target quant")
    g.add_argument("--target-revision", metavar="REV", help="the target repo's revision (commit) used")
    g.add_argument("--target-file", action="append", default=[], metavar="PATH",
                   help="a target file's path in its repo (repeatable)")
    g.add_argument("--head-repo", metavar="OWNER/REPO", help="the MTP head checkpoint's repo (or folder)")
    g.add_argument("--head-revision", metavar="REV", help="the head repo's revision used")
    g.add_argument("--base-model", metavar="OWNER/REPO", help="the original model (front matter base_model)")


def provenance_from_args(args: argparse.Namespace) -> Provenance:
    """The :class:`Provenance` the flags describe; repo ids are checked by the Hub's rules first.

    Raises:
        HubError: ``--target-repo`` or ``--base-model`` is not an ``OWNER/NAME`` repo id.
    """
    from gguf_mtp.hub.client import check_repo_id
    from gguf_mtp.release.card import Provenance

    if args.target_repo is not None:
        check_repo_id(args.target_repo, "--target-repo")
    if args.base_model is not None:
        check_repo_id(args.base_model, "--base-model")
    return Provenance(
        target_repo=args.target_repo, target_revision=args.target_revision, target_files=tuple(args.target_file),
        head_source=args.head_repo, head_revision=args.head_revision, base_model=args.base_model,
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "publish",
        help="upload a composite and a generated model card to the Hugging Face Hub",
        description="Upload every shard of the composite in OUTDIR plus a generated README.md to a Hub repo: "
        "one commit for a set that fits, resumably (card last) for a large one. The token and write access are "
        "checked before anything is hashed or uploaded; afterwards the Hub's sizes and sha256 are compared with "
        "the local files. --dry-run needs no token and no network. A folder holding one trunk (no NextN block) "
        "and mtp-*.gguf sidecars is published as ggml-org ships a head: the trunk untouched (with --copy-from, "
        "copied on the Hub's side), the sidecars uploaded, each checked to fit the trunk.",
    )
    p.add_argument("outdir", metavar="OUTDIR",
                   help="folder holding the composite (or any of its files), or a trunk and its mtp-*.gguf sidecars")
    p.add_argument("--repo", required=True, metavar="OWNER/NAME",
                   help="the Hub repo to publish to (created if missing)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--revision", metavar="BRANCH", help="commit to this branch (created if missing)")
    p.add_argument("--upload-mode", choices=("auto", "one-commit", "resumable"), default="auto",
                   help="one commit, resumable, or by size (default: auto)")
    p.add_argument("--standalone", action="store_true",
                   help="publish an MTP-only draft (convert/extract --standalone) for llama-server --spec-draft-model; "
                        "the card shows that command and llama-server -hf; the files are named mtp-* as -hf expects")
    p.add_argument("--path-in-repo", metavar="FOLDER",
                   help="upload into this folder of the repo (e.g. the folder of a quant, so that a --standalone "
                        "sidecar lies next to it for llama-server -hf); default the repo root. The card is "
                        "always the repo's root README.md, the one the Hub shows")
    p.add_argument("--bench-json", dest="bench", metavar="FILE",
                   help="a `gguf-mtp bench --json` report of these files: the card shows its table (acceptance, "
                        "tokens/s, speed-up per n-max)")
    p.add_argument("--force", dest="replace_readme", action="store_true",
                   help="replace the repo's README.md even when gguf-mtp did not write it (without --force such a "
                        "README.md is refused before anything is uploaded; a card gguf-mtp wrote is always replaced)")
    p.add_argument("--copy-from", metavar="REPO[@REV]",
                   help="copy each file byte-identical to a .gguf file of REPO (same sha256 and size, at the commit "
                        "REV names now) on the Hub's side instead of uploading it (huggingface_hub 1.17+); the plan "
                        "says per file: copied from REPO@COMMIT, uploaded, or unchanged")
    add_provenance_flags(p)
    add_output_flags(p)
    p.set_defaults(run=run)


def publish_options(args: argparse.Namespace) -> PublishOptions:
    """The run's options from the parsed flags; the repo ids and the ``--bench-json`` report are checked first.

    Raises:
        HubError: ``--repo``, ``--target-repo``, ``--base-model`` or ``--copy-from`` is not an ``OWNER/NAME`` repo id.
        ParameterError: ``--bench-json`` is not a bench report.
    """
    from gguf_mtp.hub.client import check_repo_id
    from gguf_mtp.release.publish import CopySource, PublishOptions

    check_repo_id(args.repo, "--repo")
    copy_from = CopySource.parse(args.copy_from) if args.copy_from is not None else None
    bench = None
    if args.bench:
        from gguf_mtp.errors import ParameterError
        from gguf_mtp.files.json_io import load_json_file
        from gguf_mtp.server.bench_rules import parse_bench_json

        bench = parse_bench_json(load_json_file(args.bench, max_bytes=1 << 20, error=ParameterError), args.bench)
    return PublishOptions(
        repo=args.repo, private=args.private, revision=args.revision, dry_run=args.dry_run,
        provenance=provenance_from_args(args), upload_mode=args.upload_mode, progress=not (args.quiet or args.json),
        standalone=args.standalone, path_in_repo=args.path_in_repo, bench=bench, replace_readme=args.replace_readme,
        copy_from=copy_from,
    )


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.release.publish import CARD_NAME
    from gguf_mtp.release.publish import run as publish

    report = publish(args.outdir, publish_options(args))
    if args.json:
        print_json(report.to_dict())
        return 0
    print_report(report.describe())
    if args.dry_run:
        print(f"\n----- {CARD_NAME} -----")
        sys.stdout.write(report.card)
    return 0
