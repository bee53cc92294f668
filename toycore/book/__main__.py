"""``python -m toycore.book``: the command line of the build (``make book``)."""

import argparse
import sys
from pathlib import Path

from ..profiles import PROFILES
from . import build
from .execute import BuildError, BuildInterrupted


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m toycore.book",
        description="Build the book: execute every chapter, then render the executed copies.",
    )
    parser.add_argument("--profile", default=None, help=f"one of {', '.join(PROFILES)}")
    parser.add_argument(
        "--device",
        default=None,
        help="auto (default: the GPU when torch sees one), cpu, cuda or cuda:k",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes computing chapters and shards (default: one per core; 1 on a GPU)",
    )
    parser.add_argument(
        "--chapters",
        nargs="+",
        default=None,
        metavar="CHAPTER",
        help="execute (and record) only these, e.g. 05_persian_rug or 05; no HTML",
    )
    parser.add_argument(
        "--no-html", action="store_true", help="execute (and record) the chapters, render no HTML"
    )
    parser.add_argument(
        "--sections",
        default=None,
        metavar="LIST",
        help="with one chapter: execute only these sections, e.g. 1-3,5 (a part of its record)",
    )
    parser.add_argument(
        "--records",
        default=None,
        metavar="FOLDER",
        help="where to record the ledgers (default: results/paper, in the paper profile only)",
    )
    parser.add_argument("--build-dir", default=None, help="default: _build at the repository root")
    args = parser.parse_args(argv)
    try:
        index = build(
            args.profile,
            args.build_dir,
            device=args.device,
            jobs=args.jobs,
            only=args.chapters,
            render=not args.no_html,
            sections=args.sections,
            records_folder=args.records and Path(args.records),
        )
    except (BuildError, ValueError) as error:
        print(f"book build failed: {error}", file=sys.stderr)
        return 1
    except BuildInterrupted as error:
        print(error, file=sys.stderr)
        return 130
    except KeyboardInterrupt:  # outside the chapters: fetching assets, rendering
        print("interrupted; finished results are kept", file=sys.stderr)
        return 130
    if index is not None:
        print(f"The book is at {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
