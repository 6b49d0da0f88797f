"""The ``arrowstream`` command line: ``arrowstream demo`` (more commands come later)."""

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
    demo.add_argument("--iceberg", action="store_true",
                      help="read an Iceberg table (SQLite catalog, local warehouse) instead of Parquet files")
    args = parser.parse_args(argv)
    from . import _demo

    if args.phase is not None:
        return _demo.run_phase(args)
    return _demo.run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
