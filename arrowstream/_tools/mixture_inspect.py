"""``arrowstream inspect --source NAME=PATH ...``: a mixture's parts of :mod:`arrowstream._tools.inspect`'s report.

Each source's rows, its quota per epoch and where its passes stand when the epoch starts, and each slot's
rows of each source; the slots, the ranks and the rows left out are the dataset report's
(``arrowstream._tools.inspect.slot_line``, ``slots_summary``). The numbers are those the loader uses.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._core.order import natural_batches
from ..errors import InvalidArgumentError
from .inspect import slot_line, slots_summary


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name or not rest:
            raise InvalidArgumentError(f"{flag}: expected NAME=VALUE, got {value!r}")
        out[name] = rest
    return out


def open_mixture(args: argparse.Namespace) -> Any:
    from .. import Mixture, Source

    paths = _pairs(args.source, "--source")
    formats = _pairs(args.source_format, "--source-format")
    weights = {name: float(w) for name, w in _pairs(args.weight, "--weight").items()} or None
    unknown = sorted(set(formats) - set(paths))
    if unknown:
        raise InvalidArgumentError(f"--source-format names {unknown}, which no --source names")
    columns = args.columns.split(",") if args.columns else None
    sources = {name: Source(path, format=formats.get(name, "parquet"), columns=columns, split_bytes=args.split_bytes)
               for name, path in paths.items()}
    return Mixture(sources, weights=weights, epoch_rows=args.epoch_rows, batch_size=args.batch_size, rank=0,
                   assignment=getattr(args, "assignment", "static"),
                   world_size=args.world_size, plan_locally=True, drop_last=args.drop_last,
                   even_batches=not args.no_even_batches)


def describe(mixture: Any, num_workers: int, epoch: int) -> dict[str, Any]:
    rows, quotas, passes = mixture.source_rows(), mixture.quotas(), mixture.passes(epoch)
    per_slot = mixture.slot_quotas(num_workers, epoch)
    limits = mixture.batch_limits(num_workers, epoch)
    batch_size, drop_last = mixture.batch_size, mixture.options.drop_last
    slots = []
    for index, (shares, limit) in enumerate(zip(per_slot, limits, strict=True)):
        total = sum(shares.values())
        kept = min(total, limit * batch_size)
        slots.append({**slot_line(index, max(num_workers, 1), total, limit, kept, batch_size, drop_last),
                      "sources": shares, "rows_left_out": total - kept,
                      "trimmed_batches": natural_batches(total, batch_size, drop_last) - limit})
    return {"epoch": epoch, "batch_size": batch_size, "world_size": mixture.world_size, "num_workers": num_workers,
            "sources": {name: {"rows": rows[name], "quota": quotas[name], "pass": passes[name][0],
                               "pass_row": passes[name][1]} for name in rows},
            "epoch_rows": sum(quotas.values()), **slots_summary(slots, mixture.world_size),
            "rows_left_out": sum(s["rows_left_out"] for s in slots)}


def render(report: dict[str, Any]) -> str:
    head = (f"mixture epoch {report['epoch']}: {report['epoch_rows']:,} rows, batch_size {report['batch_size']}, "
            f"world_size {report['world_size']}, num_workers {report['num_workers']}")
    lines = [head, "",
             f"{'source':<16} {'rows':>12} {'quota':>12} {'share':>7}  passes at the epoch's start"]
    for name, s in report["sources"].items():
        share = s["quota"] / report["epoch_rows"] if report["epoch_rows"] else 0.0
        lines.append(f"{name:<16} {s['rows']:>12,} {s['quota']:>12,} {share:>7.1%}  pass {s['pass']}, "
                     f"row {s['pass_row']:,}")
    names = list(report["sources"])
    lines += ["", f"{'rank':>4} {'worker':>6} {'rows':>10} " + " ".join(f"{n[:10]:>10}" for n in names)
              + f" {'batches':>8} {'left out':>9}"]
    for s in report["slots"]:
        lines.append(f"{s['rank']:>4} {s['worker']:>6} {s['rows']:>10,} "
                     + " ".join(f"{s['sources'][n]:>10,}" for n in names) + f" {s['batches']:>8} {s['rows_left_out']:>9,}")
    lines += ["", "len(loader) per rank: " + ", ".join(map(str, report["batches_per_rank"])),
              f"rows left out this epoch (even_batches, drop_last): {report['rows_left_out']:,}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.path is not None or args.iceberg_table:
        raise InvalidArgumentError("inspect: give a PATH (or --iceberg-table) or --source NAME=PATH ..., not both")
    report = describe(open_mixture(args), args.num_workers, args.epoch)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0
