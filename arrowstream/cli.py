"""The ``arrowstream`` command line.

- ``arrowstream demo``: train on a generated dataset, crash, resume, prove exactly-once;
- ``arrowstream inspect PATH``: files, rows, schema, splits and their assignment to ranks and workers;
- ``arrowstream bench PATH``: throughput against the raw pyarrow loop, per-worker metrics, a plot;
- ``arrowstream plan PATH``: build the plan cache entry of a dataset ahead of a job, and print what it holds;
- ``arrowstream state show CKPT``: what a checkpoint says (epoch, rows consumed per rank and worker, options).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arrowstream", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train on a generated dataset, interrupt, resume, prove exactly-once")
    demo.add_argument("--rows", type=int, default=200_000, help="rows in the generated dataset")
    demo.add_argument("--workers", type=int, default=2, help="loader workers")
    demo.add_argument("--batch-size", type=int, default=1024)
    demo.add_argument("--dir", default=None, help="where to write the dataset and checkpoint (default: a temp dir)")
    demo.add_argument("--phase", choices=["train", "resume"], default=None, help=argparse.SUPPRESS)
    demo.add_argument("--stop-at", type=float, default=0.4, help="fraction of epoch 0 after which to checkpoint")
    demo.add_argument("--epochs", type=int, default=2)
    demo.add_argument("--mixture", action="store_true",
                      help="three sources in a weighted mixture: exact quotas, passes across epochs, exact resume")
    demo.add_argument("--iceberg", action="store_true",
                      help="read an Iceberg table (SQLite catalog, local warehouse) instead of Parquet files")
    inspect = commands.add_parser("inspect", help="what a loader will do with this data: files, rows, schema, "
                                  "splits, rows and batches per rank and worker")
    from ._inspect import add_source_arguments

    add_source_arguments(inspect)
    inspect.add_argument("--world-size", type=int, default=1, help="ranks (default 1)")
    inspect.add_argument("--num-workers", type=int, default=0, help="loader workers per rank (default 0)")
    inspect.add_argument("--drop-last", action="store_true", help="drop each worker's short last batch")
    inspect.add_argument("--no-even-batches", action="store_true", help="let ranks yield different batch counts")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    from ._mix_inspect import add_mixture_arguments

    add_mixture_arguments(inspect)
    bench = commands.add_parser("bench", help="throughput on this data against the raw pyarrow loop, per-worker "
                                "metrics, and a plot of them over time")
    add_source_arguments(bench)
    bench.add_argument("--num-workers", type=int, default=2, help="loader workers (default 2)")
    bench.add_argument("--shuffle", action="store_true", help="shuffle the splits (seed --seed)")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--assignment", choices=["static", "dynamic"], default="static",
                       help="how workers get their rows: the plan's splits (static, default) or leases taken as "
                            "they finish (dynamic, batches as they are ready); see docs/stragglers.md")
    bench.add_argument("--sample-every", type=float, default=0.1, help="seconds between metrics samples (0.1)")
    bench.add_argument("--plot", default=None, metavar="FILE.png",
                       help="draw each worker's rows/s and idle share over time (needs matplotlib)")
    bench.add_argument("--json", action="store_true", help="print the results as JSON (metrics samples included)")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    plan = commands.add_parser("plan", help="build the plan cache entry of a dataset ahead of a job (list once, "
                               "read every footer), and print what it holds")
    from ._plan_report import add_arguments

    add_arguments(plan)
    state = commands.add_parser("state", help="look inside a checkpoint").add_subparsers(dest="state_command",
                                                                                         required=True)
    show = state.add_parser("show", help="what a checkpoint says: epoch, rows and batches consumed per rank and "
                            "worker, share of the epoch, options, topology")
    show.add_argument("ckpt", metavar="CKPT", help="a torch.save file or a .json file that holds a loader state")
    show.add_argument("--json", action="store_true", help="print the description as JSON")
    show.add_argument("--at", default=None, metavar="PATH", help="the key path of the state to show, when the "
                      "checkpoint holds several (as the output names them, e.g. loaders[1])")
    show.add_argument("--trust-pickle", action="store_true", help="load a torch.save file that weights_only=True "
                      "refuses with full unpickling (runs code from the file: only for files you trust)")
    args = parser.parse_args(argv)
    from .errors import ArrowStreamError

    try:
        return _run(args)
    except ArrowStreamError as exc:  # a user error: one line, as argparse reports bad arguments, no traceback
        message = " ".join(str(exc).split())
        parser.exit(2, f"{parser.prog}: error: {message}\n")


def _run(args: argparse.Namespace) -> int:
    if args.command == "state":
        from . import _describe

        return _describe.run_show(args)
    if args.command == "inspect" and args.source:
        from . import _mix_inspect

        return _mix_inspect.run(args)
    if args.command == "inspect":
        from . import _inspect

        return _inspect.run(args)
    if args.command == "plan":
        from . import _plan_report

        return _plan_report.run(args)
    if args.command == "bench":
        from . import _bench

        return _bench.run(args)
    from . import _demo

    if args.phase is not None:
        return _demo.run_phase(args)
    return _demo.run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
