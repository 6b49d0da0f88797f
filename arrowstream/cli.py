"""The arrowstream command line.

  arrowstream demo          train on a generated dataset, crash, resume, prove exactly-once
  arrowstream inspect PATH  files, rows, schema, splits and their assignment to ranks and workers
  arrowstream bench PATH    throughput against the raw pyarrow loop, per-worker metrics, a plot
  arrowstream plan PATH     build the plan cache entry of a dataset ahead of a job, and print what it holds
  arrowstream state show CKPT  what a checkpoint says: epoch, rows and batches consumed per rank and worker

Errors: a wrong command line or input prints one line "arrowstream: error: ..." and exits with 2;
any other failure prints one line and exits with 1. --traceback (or ARROWSTREAM_DEBUG=1) shows
the traceback. See docs/cli.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from ._core.assignment_names import ASSIGNMENT_NAMES
from ._tools.cli_args import (
    HelpFormatter,
    add_cache_arguments,
    add_mixture_arguments,
    add_plan_arguments,
    add_source_arguments,
    add_state_arguments,
    check_plot,
    fraction,
    whole,
)

DEBUG_ENV = "ARROWSTREAM_DEBUG"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arrowstream", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", formatter_class=HelpFormatter, help="train on a generated dataset, interrupt, resume, prove exactly-once")
    demo.add_argument("--rows", type=whole(1), default=200_000, help="rows in the generated dataset")
    demo.add_argument("--workers", type=whole(0), default=2, help="loader workers")
    demo.add_argument("--batch-size", type=whole(1), default=1024, help="rows per batch")
    demo.add_argument("--dir", default=None, help="where to write the dataset and checkpoint (default: a temp dir)")
    demo.add_argument("--phase", choices=["train", "resume"], default=None, help=argparse.SUPPRESS)
    demo.add_argument("--stop-at", type=fraction, default=0.4, help="fraction of epoch 0 after which to checkpoint")
    demo.add_argument("--epochs", type=whole(1), default=2, help="epochs to train")
    demo.add_argument("--mixture", action="store_true",
                      help="three sources in a weighted mixture: exact quotas, passes across epochs, exact resume")
    demo.add_argument("--iceberg", action="store_true",
                      help="read an Iceberg table (SQLite catalog, local warehouse) instead of Parquet files")
    inspect = commands.add_parser("inspect", formatter_class=HelpFormatter, help="what a loader will do with this data: files, rows, schema, "
                                  "splits, rows and batches per rank and worker")
    add_source_arguments(inspect)
    inspect.add_argument("--world-size", type=int, default=1, help="ranks (default 1)")
    inspect.add_argument("--num-workers", type=int, default=0, help="loader workers per rank (default 0)")
    inspect.add_argument("--drop-last", action="store_true", help="drop each worker's short last batch")
    inspect.add_argument("--no-even-batches", action="store_true", help="let ranks yield different batch counts")
    inspect.add_argument("--assignment", choices=ASSIGNMENT_NAMES, default=ASSIGNMENT_NAMES[0],
                         help="how workers get their rows: the plan's splits per worker (static, default) or "
                              "leases of the rank's splits taken at run time (dynamic: per-rank figures only)")
    inspect.add_argument("--order", choices=("topology", "canonical"), default="topology",
                         help="the epoch laid out over the (rank, worker) slots (topology, default) or over "
                              "--canonical-slots fixed slots (canonical: the same global batches on any topology "
                              "that divides them)")
    inspect.add_argument("--canonical-slots", type=int, default=64,
                         help="with --order canonical: the canonical slots")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    add_mixture_arguments(inspect)
    bench = commands.add_parser("bench", formatter_class=HelpFormatter, help="throughput on this data against the raw pyarrow loop, per-worker "
                                "metrics, and a plot of them over time")
    add_source_arguments(bench)
    bench.add_argument("--num-workers", type=int, default=2, help="loader workers (default 2)")
    bench.add_argument("--shuffle", action="store_true",
                       help="shuffle=True: splits in a seeded order, rows through the default record buffer (--seed)")
    bench.add_argument("--seed", type=int, default=0, help="the shuffle's seed")
    bench.add_argument("--assignment", choices=ASSIGNMENT_NAMES, default=ASSIGNMENT_NAMES[0],
                       help="how workers get their rows: the plan's splits (static, default) or leases taken as "
                            "they finish (dynamic, batches as they are ready); see docs/stragglers.md")
    bench.add_argument("--sample-every", type=float, default=None, metavar="SECONDS",
                       help="seconds between metrics samples (default: about 100 samples over the epoch, "
                            "every len(loader)/100 batches; 0.1 s when the length is unknown)")
    bench.add_argument("--plot", default=None, metavar="FILE.png",
                       help="draw each worker's rows/s and idle share over time (needs matplotlib)")
    bench.add_argument("--json", action="store_true", help="print the results as JSON (metrics samples included)")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    plan = commands.add_parser("plan", formatter_class=HelpFormatter, help="build the plan cache entry of a dataset ahead of a job (list once, "
                               "read every footer), and print what it holds")
    add_plan_arguments(plan)
    add_state_arguments(commands.add_parser("state", formatter_class=HelpFormatter, help="look inside a checkpoint"))
    add_cache_arguments(commands.add_parser("cache", formatter_class=HelpFormatter,
                                            help="a local cache of remote data (cache=): show it or clear it"))
    _add_traceback_option(parser, commands)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (Exception, KeyboardInterrupt) as exc:
        if args.traceback or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        code, message = _one_line(exc)
        parser.exit(code, f"{parser.prog}: {message}\n")


def _add_traceback_option(parser: argparse.ArgumentParser,
                          commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``--traceback`` before or after the command's name (``arrowstream --traceback bench ...`` or
    ``arrowstream bench ... --traceback``)."""
    text = f"on an error, print the traceback instead of one line (also: {DEBUG_ENV}=1)"
    parser.add_argument("--traceback", action="store_true", help=text)
    for command in commands.choices.values():  # SUPPRESS: a command's default does not undo the flag given before it
        command.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS, help=text)


def _one_line(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one line for a failure: 2 for an arrowstream error (the command line or the
    input is wrong, and the message says what to do), as argparse's own errors; 130 for Ctrl-C; 1 for
    anything else (a system error such as a full disk, or a bug: the line says how to see where)."""
    from .errors import ArrowStreamError

    message = " ".join(str(exc).split())
    if isinstance(exc, ArrowStreamError):
        return 2, f"error: {message}"
    if isinstance(exc, KeyboardInterrupt):
        return 130, "interrupted"
    return 1, f"error: {type(exc).__name__}: {message} (--traceback shows where)"


def _run(args: argparse.Namespace) -> int:
    if args.command == "state":
        from ._tools import state_show as _state_show

        return _state_show.run_show(args)
    if args.command == "cache":
        from ._storage.cache import run_cache_command

        return run_cache_command(args.cache_command, args.dir, args.json)
    if args.command == "inspect":
        from ._tools import inspect as _inspect

        return _inspect.run(args)
    if args.command == "plan":
        from ._tools import plan_report as _plan_report

        return _plan_report.run(args)
    if args.command == "bench":
        if args.plot:
            check_plot(args.plot)
        from ._tools import bench as _bench

        return _bench.run(args)
    from ._tools import demo as _demo

    if args.phase is not None:
        return _demo.run_phase(args)
    return _demo.run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
