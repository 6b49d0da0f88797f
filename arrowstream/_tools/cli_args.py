"""The options the commands share, in plain argparse.

They live here, apart from the modules that run the commands, so that building the parser imports
nothing but argparse: ``arrowstream --help`` must not wait for torch or pyarrow (tests/test_cli.py
checks that neither is imported). Help texts are plain text: they are printed as they are.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that states each option's default, ``(default: 1024)``, unless its text already says it or there
    is none to state (a flag that is off, an option left out, a repeatable option)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if not text or "default" in text or not action.option_strings or action.default is argparse.SUPPRESS:
            return text
        if action.default is None or isinstance(action.default, (bool, list)):
            return text
        return f"{text} (default: %(default)s)"


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that name a dataset, shared by ``inspect``, ``bench`` and ``plan``."""
    parser.add_argument("path", nargs="?", default=None,
                        help="a file, directory, glob or URL (s3://, gs://, az://, ...); omit with --iceberg-table")
    parser.add_argument("--format", default="parquet", help="parquet (default), orc, arrow, csv or jsonl")
    parser.add_argument("--columns", default=None, help="comma-separated columns to read (default: all)")
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per batch")
    parser.add_argument("--split-bytes", type=int, default=None, help="target split size in bytes (default: one split per row group, stripe or "
                        "record batch; 8 MiB stretches of CSV/JSON Lines)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an fsspec storage option, repeatable (values parsed as JSON when they parse)")
    parser.add_argument("--parse-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a CSV/JSON Lines parse option (see docs/formats.md), repeatable; values parsed as "
                             "JSON when they parse: --parse-option delimiter=';' --parse-option header=false")
    parser.add_argument("--iceberg-table", default=None, metavar="NAMESPACE.TABLE", help="read an Iceberg table")
    parser.add_argument("--catalog-root", default=None, metavar="DIR",
                        help="the table's catalog: arrowstream's default (SQLite catalog + warehouse under DIR)")
    parser.add_argument("--catalog-config", default=None, metavar="FILE.json",
                        help="the table's catalog: pyiceberg catalog properties in a JSON file")
    parser.add_argument("--snapshot-id", type=int, default=None, help="Iceberg snapshot (default: the latest)")


def add_mixture_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``inspect --source NAME=PATH ...`` (a mixture instead of one path)."""
    parser.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                        help="a source of a mixture, repeatable (a mixture instead of PATH)")
    parser.add_argument("--source-format", action="append", default=[], metavar="NAME=FORMAT",
                        help="a mixture source's format (default parquet), repeatable")
    parser.add_argument("--weight", action="append", default=[], metavar="NAME=WEIGHT",
                        help="a mixture source's weight, repeatable (default: in proportion to the rows)")
    parser.add_argument("--epoch-rows", type=int, default=None, help="rows per mixture epoch (default: all rows)")
    parser.add_argument("--epoch", type=int, default=0, help="the mixture epoch to describe (default 0)")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``plan``: the source options, the cache folder and ``--json``."""
    add_source_arguments(parser)
    # the variable is _plan_cache.CACHE_DIR_ENV, named here as text: importing _plan_cache imports pyarrow
    parser.add_argument("--cache-dir", default=None,
                        help="the cache folder (default: $ARROWSTREAM_CACHE_DIR, else the user cache folder)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """``arrowstream cache show|clear DIR``: a local cache of remote data (``cache=``)."""
    commands = parser.add_subparsers(dest="cache_command", required=True)
    show = commands.add_parser("show", formatter_class=HelpFormatter,
                               help="what a cache folder holds: entries, bytes, entries hit since written")
    clear = commands.add_parser("clear", formatter_class=HelpFormatter,
                                help="delete every entry of a cache folder (a run using it goes on from the store)")
    for command in (show, clear):
        command.add_argument("dir", metavar="DIR", help="the folder given as cache=")
        command.add_argument("--json", action="store_true", help="print the result as JSON")
        command.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                             help="on an error, print the traceback instead of one line")


def add_state_arguments(parser: argparse.ArgumentParser) -> None:
    """``arrowstream state show CKPT``: what a checkpoint says (arrowstream._tools.describe)."""
    show = parser.add_subparsers(dest="state_command", required=True).add_parser(
        "show", formatter_class=HelpFormatter, help="what a checkpoint says: epoch, rows and batches consumed per rank and worker, share of the "
                     "epoch, options, topology")
    show.add_argument("ckpt", metavar="CKPT", help="a torch.save file or a .json file that holds a loader state")
    show.add_argument("--path", default=None, metavar="DATA",
                      help="the checkpoint's data (a file, directory, glob or URL): each rank's rows of the epoch "
                           "and the column names then come from its plan (the dataset is built with the "
                           "checkpoint's options)")
    show.add_argument("--columns", default=None, help="with --path: the run's columns=, comma-separated, in its "
                      "order (default: found among the data's columns by the state's hash)")
    show.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                      help="with --path: an fsspec storage option, repeatable")
    show.add_argument("--parse-option", action="append", default=[], metavar="KEY=VALUE",
                      help="with --path: a CSV/JSON Lines parse option of the run, repeatable")
    show.add_argument("--json", action="store_true", help="print the description as JSON")
    show.add_argument("--at", default=None, metavar="PATH", help="the key path of the state to show, when the "
                      "checkpoint holds several (as the output names them, e.g. loaders[1])")
    show.add_argument("--trust-pickle", action="store_true", help="load a torch.save file that weights_only=True "
                      "refuses with full unpickling (runs code from the file: only for files you trust)")
    show.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                      help="on an error, print the traceback instead of one line")


def whole(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (a bad value is a usage error, exit status 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
        return value
    return parse


def fraction(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1 (exclusive), got {text!r}")
    return value


def check_plot(path: str) -> None:
    """Fail before ``bench`` runs, not after it, when ``--plot`` cannot be drawn (no matplotlib) or written
    (no such folder). Called before the benchmark's own modules (torch, pyarrow) are imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        from .._core.install import install_hint
        from ..errors import MissingDependencyError
        raise MissingDependencyError(f'--plot needs matplotlib, which is not installed; {install_hint("cli")}') from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        from ..errors import InvalidArgumentError
        raise InvalidArgumentError(f"--plot: the folder {folder!r} of {path!r} does not exist; create it "
                                   "or name a file in an existing folder")


def key_values(pairs: list[str], flag: str = "--storage-option") -> dict[str, Any] | None:
    """``KEY=VALUE`` options given with ``flag`` as a dict, each value parsed as JSON when it parses (None: none
    given); ``InvalidArgumentError`` naming the flag for a pair without ``=``."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            from ..errors import InvalidArgumentError
            raise InvalidArgumentError(f"{flag}: expected KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options or None
