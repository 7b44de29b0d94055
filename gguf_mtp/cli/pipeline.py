"""``gguf-mtp pipeline --target-repo ... --target-files ... --head-repo ... [--out-repo ...]``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from gguf_mtp.errors import ParameterError

if TYPE_CHECKING:
    from gguf_mtp.release.pipeline.options import PipelineOptions


from .common import CONVERT_HOW, add_llama_cpp_flag, add_output_flags, add_outtype_flag, print_json, print_report

DEFAULT_WORK_DIR = "gguf-mtp-work"


def add_pipeline_arguments(p: argparse.ArgumentParser) -> None:
    """The pipeline's options (shared with ``scripts/hf_job.py``, which forwards them to a Hub Job)."""
    p.add_argument("--target-repo", required=True, metavar="OWNER/REPO", help="the Hub repo of the target quant")
    p.add_argument("--target-files", required=True, metavar="PATTERN",
                   help="the target model in it: 'DIR/NAME-*-of-*.gguf' (exactly that split set), one shard's "
                   "name, or a single file's name")
    p.add_argument("--head-repo", required=True, metavar="OWNER/HEAD",
                   help="the MTP head checkpoint: Hub repo id (only its MTP files are downloaded) or local folder")
    p.add_argument("--out-repo", metavar="OWNER/NAME", help="publish the composite there (default: do not publish)")
    p.add_argument("--work-dir", default=DEFAULT_WORK_DIR, metavar="DIR",
                   help=f"state, draft and composite; re-running resumes (default: ./{DEFAULT_WORK_DIR})")
    p.add_argument("--keep", action="store_true", help="keep the draft and composite after publishing")
    p.add_argument("--force", action="store_true",
                   help="use a non-empty --work-dir that no pipeline made (its draft/ and composite/ are replaced)")
    p.add_argument("--target-revision", metavar="REV", help="revision of the target repo (default: main)")
    p.add_argument("--target-dir", metavar="DIR",
                   help="read the target from DIR, laid out like --target-repo (its root: the repo mounted "
                   "read-only in a Hugging Face Job, or a local copy) instead of downloading it; never written to, "
                   "and checked against the Hub's record of --target-repo at --target-revision when online")
    p.add_argument("--head-revision", metavar="REV", help="revision of the head repo (default: main)")
    p.add_argument("--out-revision", metavar="BRANCH", help="branch to publish to (default: main)")
    p.add_argument("--private", action="store_true", help="create --out-repo private")
    p.add_argument("--replace-readme", action="store_true",
                   help="replace --out-repo's README.md even when gguf-mtp did not write it (checked before the "
                        "downloads; without this flag such a README.md is refused)")
    p.add_argument("--basename", metavar="NAME", help="composite file prefix (default: the target's + '-MTP')")
    add_outtype_flag(p, "the head's matrices", CONVERT_HOW, "as convert's")
    p.add_argument("--cache-dir", metavar="DIR", help="Hub cache for the target (default: huggingface_hub's)")
    p.add_argument("--no-llama", action="store_true", help="verify without loading the composite in llama.cpp")
    p.add_argument("--if-changed", action="store_true",
                   help="first compare the head's and target's commits, the llama.cpp build and the gguf-mtp version "
                   "with what --out-repo's card records: do nothing when none moved, else make again what moved")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "pipeline",
        help="download target + head, convert, compose, verify, publish (resumable)",
        description="From two Hub repos to a verified (and, with --out-repo, published) MTP composite: downloads "
        "exactly the target's shard set and the head's MTP files, converts, composes, verifies (llama.cpp "
        "included when installed) and publishes. Re-running in the same --work-dir reuses every finished stage "
        "whose recorded outputs still match their size and sha256.",
    )
    add_pipeline_arguments(p)
    add_llama_cpp_flag(p, "--outtype's quantizer and the verification")
    add_output_flags(p)
    p.set_defaults(run=run)


class _RefusingParser(argparse.ArgumentParser):
    """A parser that refuses bad arguments with a :class:`ParameterError` (one line) instead of usage and exit."""

    def error(self, message: str) -> NoReturn:
        raise ParameterError(f"{self.prog}: {message}")


def read_pipeline_arguments(arguments: Sequence[str]) -> argparse.Namespace:
    """``arguments`` read exactly as ``gguf-mtp pipeline ARGUMENTS`` reads them, by the command's own parser: an
    abbreviation (``--target-revi``) or ``--opt=value`` means to ``scripts/hf_job.py`` what it means to the Job.

    Raises:
        ParameterError: where the command would refuse them (argparse's reason, one line).
        ImportError: where the parser cannot be built here (``--outtype`` needs gguf-py's tables).
    """
    from . import build_parser

    return build_parser(("pipeline",), _RefusingParser).parse_args(["pipeline", *arguments])


def pipeline_options(args: argparse.Namespace) -> PipelineOptions:
    """The run's options from parsed :func:`add_pipeline_arguments` (and :func:`add_output_flags`) flags."""
    from gguf_mtp.release.pipeline.options import PipelineOptions

    return PipelineOptions(
        target_repo=args.target_repo, target_files=args.target_files, head_repo=args.head_repo,
        work_dir=Path(args.work_dir), out_repo=args.out_repo, keep=args.keep, force=args.force,
        target_revision=args.target_revision, target_dir=None if args.target_dir is None else Path(args.target_dir),
        head_revision=args.head_revision, out_revision=args.out_revision, private=args.private,
        replace_readme=args.replace_readme, basename=args.basename, outtype=args.outtype, cache_dir=args.cache_dir,
        llama=False if args.no_llama else None, progress=not (args.quiet or args.json), dry_run=args.dry_run,
        if_changed=args.if_changed,
    )


def run(args: argparse.Namespace) -> int:
    from gguf_mtp.release.pipeline.run import run as run_pipeline

    report = run_pipeline(pipeline_options(args))
    if args.json:
        print_json(report.to_dict())
    else:
        print_report(report.describe())
    return 0
