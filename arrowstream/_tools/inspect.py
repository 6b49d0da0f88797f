"""``arrowstream inspect``: what a loader will do with a dataset or a mixture, from its metadata alone.

For a dataset (``PATH`` or ``--iceberg-table``): files, rows, units (row groups, stripes, record batches),
the schema, the splits, and how they are assigned for a given ``--world-size`` and ``--num-workers``. For a
mixture (``--source NAME=PATH ...``, :mod:`arrowstream._tools.mixture_inspect`): each source's rows, quota and passes
at ``--epoch``, and each slot's rows of each source. Both share one walk over the (rank, worker) slots:
rows, exact batches, what ``even_batches`` trims and ``drop_last`` drops, then per rank ``len(loader)``.
Nothing is read but footers; the numbers are those the loader uses (same plan, same assignment policy, asked for
them). With ``--assignment dynamic`` and workers, a rank's workers lease its splits at run time: the report then has a
line per rank (its work) and none per worker.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import TYPE_CHECKING, Any

from .._assignment.canonical import CanonicalOrder
from .._core.order import SlotGrid, natural_batches
from .._formats import unit_format
from .._layout.canonical import check_workers
from ..errors import InvalidArgumentError
from .cli_args import key_values
from .describe_canonical import runs

if TYPE_CHECKING:
    from .._assignment.figures import Figure


def open_dataset(args: argparse.Namespace, **kwargs: Any) -> Any:
    """The dataset the source options name, with ``kwargs`` (rank, world_size, shuffle, ...)."""
    columns = args.columns.split(",") if args.columns else None
    common: dict[str, Any] = {"batch_size": args.batch_size, **kwargs}
    if args.split_bytes is not None:
        common["split_bytes"] = args.split_bytes
    if args.iceberg_table:
        if args.path is not None:
            raise InvalidArgumentError(f"path: give a path or --iceberg-table, not both (got {args.path!r})")
        from .. import IcebergDataset, iceberg_catalog_config

        if args.catalog_config:
            with open(args.catalog_config) as f:
                catalog_config = json.load(f)
        elif args.catalog_root:
            catalog_config = iceberg_catalog_config(args.catalog_root)
        else:
            raise InvalidArgumentError("--iceberg-table needs its catalog: --catalog-root DIR (arrowstream's "
                                       "default SQLite catalog) or --catalog-config FILE.json")
        return IcebergDataset(args.iceberg_table, catalog_config=catalog_config, snapshot_id=args.snapshot_id,
                              selected_fields=columns, **common)
    if args.path is None:
        raise InvalidArgumentError("path: name the data (a file, directory, glob or URL) or pass --iceberg-table")
    from .. import StructuredDataset

    parse_options = key_values(args.parse_option, "--parse-option")
    if parse_options is not None:
        common["parse_options"] = parse_options
    return StructuredDataset(args.path, format=args.format, columns=columns,
                             storage_options=key_values(args.storage_option), **common)


def describe(dataset: Any, num_workers: int) -> dict[str, Any]:
    """The whole report as plain data (what ``--json`` prints): the dataset's epoch as its assignment policy reads it
    (re-planned, when a loaded checkpoint of another topology re-planned it), its slots' and ranks' figures asked of
    the policy. Where the policy has no figures per worker (``"dynamic"`` with workers: they lease the rank's splits at
    run time) ``slots`` is empty, ``workers`` says why, and each rank's line holds its work's splits, rows and
    batches. With ``order="canonical"``, ``canonical`` says which (rank, worker) reads which canonical slots
    (:func:`canonical_report`)."""
    plan, options = dataset.plan, dataset.options
    grid = SlotGrid(dataset.world_size, num_workers)
    world_size, num_slots = grid.world_size, grid.num_slots
    footers = plan.files
    files = [{"name": f.entry.name, "rows": sum(f.unit_rows), "units": len(f.unit_rows), "bytes": f.entry.size}
             for f in footers]
    policy = dataset.policy
    canonical = canonical_report(policy, dataset, num_workers) if isinstance(policy, CanonicalOrder) else None
    # splits cut for the slots that read them: each (rank, worker) slot, or each rank whose workers lease
    splits = plan.splits_for(num_slots if policy.fixed_slots else world_size, options.planning)
    split_rows = [s.num_rows for s in splits]
    try:
        slots, workers = _lines(policy.slot_figures(dataset, num_workers), max(num_workers, 1), options), None
    except InvalidArgumentError as refusal:   # no figures per worker: the policy says why
        slots, workers = [], str(refusal)
    lines = slots or _lines(policy.rank_figures(dataset, num_workers), 1, options)   # a line per rank
    loads = [s["rows"] for s in lines]
    mean = sum(loads) / len(loads) if loads else 0
    summary = slots_summary(lines, world_size, ("splits",))
    if canonical is not None:   # a rank's workers each give a part of every batch of the rank: not a sum
        for rank, figure in zip(summary["ranks"], policy.rank_figures(dataset, num_workers), strict=True):
            rank["batches"] = figure.batches
        summary["batches_per_rank"] = [r["batches"] for r in summary["ranks"]]
    return {
        "source": {"format": options.format, "table": dataset.origin.table_name,
                   "snapshot_id": getattr(dataset, "snapshot_id", None)},
        "files": len(footers), "rows": plan.num_rows, "bytes": sum(f["bytes"] for f in files),
        "units": sum(f["units"] for f in files), "unit_name": unit_format(options.format).units,
        "schema": [[field.name, str(field.type)] for field in plan.schema],
        "file_list": files,
        "topology": {"world_size": world_size, "num_workers": num_workers, "slots": num_slots,
                     "batch_size": options.batch_size, "drop_last": options.drop_last,
                     "even_batches": dataset.even_batches, "planning": options.planning,
                     "assignment": dataset.assignment, "order": "canonical" if canonical else "topology"},
        "splits": {"count": len(splits), "rows_min": min(split_rows, default=0),
                   "rows_median": statistics.median(split_rows) if split_rows else 0,
                   "rows_max": max(split_rows, default=0)},
        "imbalance": (max(loads) / mean - 1) if mean else 0.0,
        **summary, "slots": slots, "workers": workers, "canonical": canonical,
    }


def canonical_report(policy: CanonicalOrder, dataset: Any, num_workers: int) -> dict[str, Any]:
    """``order="canonical"``: the canonical slots, the rows each gives a global batch (``chunk``), the global batches
    of the epoch, each (rank, worker) slot's canonical slots (``[first, last]``), and each canonical slot's rows and
    rows yielded in the dataset's epoch."""
    grid = SlotGrid(dataset.world_size, num_workers)
    check_workers(policy.canonical, dataset.world_size, num_workers)
    yields = policy.canonical_yields(dataset.epoch)
    readers = []
    for index in range(grid.num_slots):
        mine = policy.canonical.physical_range(grid.slot(index // grid.workers_per_rank,
                                                         index % grid.workers_per_rank))
        readers.append({"rank": index // grid.workers_per_rank, "worker": index % grid.workers_per_rank,
                        "canonical_slots": [mine.start, mine.stop - 1]})
    return {"slots": policy.slots, "chunk": policy.canonical.chunk,
            "global_batch": policy.canonical.chunk * policy.slots, "batches_per_epoch": yields[0][1] if yields else 0,
            "readers": readers, "rows": [rows for rows, _, _ in yields], "rows_yielded": [kept for _, _, kept in yields]}


def _lines(figures: list[Figure], per_rank: int, options: Any) -> list[dict[str, Any]]:
    """A line per slot of ``figures`` (``per_rank`` slots a rank; 1: a line per rank), with its splits (and
    replayed windows, in a re-planned epoch)."""
    return [{**slot_line(index, per_rank, f.rows, f.batches, f.rows_yielded, options.batch_size, options.drop_last),
             "splits": f.splits} for index, f in enumerate(figures)]


def slot_line(index: int, per_rank: int, rows: int, batches: int, kept: int, batch_size: int,
              drop_last: bool) -> dict[str, Any]:
    """A (rank, worker) slot's epoch: its ``rows``, the ``batches`` it yields and the rows they hold (``kept``);
    the rest is trimmed by ``even_batches`` (fewer batches than its rows make) or dropped by ``drop_last``."""
    trimmed = rows - kept if batches < natural_batches(rows, batch_size, drop_last) else 0
    return {"rank": index // per_rank, "worker": index % per_rank, "rows": rows, "batches": batches,
            "rows_yielded": kept, "rows_trimmed": trimmed, "rows_dropped": rows - kept - trimmed}


def slots_summary(slots: list[dict[str, Any]], world_size: int, more: tuple[str, ...] = ()) -> dict[str, Any]:
    """The slots, each rank's sums (its ``batches``: ``len(loader)`` on it; and those of ``more``) and the epoch's rows
    left out."""
    keys = ("rows", "batches", "rows_yielded", "rows_trimmed", "rows_dropped", *more)
    ranks = [{"rank": rank, **{key: sum(s[key] for s in slots if s["rank"] == rank) for key in keys}}
             for rank in range(world_size)]
    return {"slots": slots, "ranks": ranks, "batches_per_rank": [r["batches"] for r in ranks],
            "rows_trimmed": sum(s["rows_trimmed"] for s in slots), "rows_dropped": sum(s["rows_dropped"] for s in slots)}


def render(report: dict[str, Any], max_files: int = 20) -> str:
    """The report as text for a terminal."""
    topology, splits = report["topology"], report["splits"]
    source = report["source"]
    what = (f"Iceberg table {source['table']} at snapshot {source['snapshot_id']}" if source["table"]
            else f"{source['format']} files")
    lines = [(f"{what}: {report['files']:,} files, {report['rows']:,} rows, {report['units']:,} "
              f"{report['unit_name']}, {report['bytes'] / 2**20:,.1f} MiB"), "", "schema:"]
    lines += [f"  {name}: {type_}" for name, type_ in report["schema"]]
    lines += ["", f"files ({min(max_files, report['files'])} of {report['files']:,}):"]
    lines += [f"  {f['name']}  {f['rows']:,} rows  {f['units']} {report['unit_name']}  {f['bytes']:,} bytes"
              for f in report["file_list"][:max_files]]
    lines += ["", (f"world_size={topology['world_size']} num_workers={topology['num_workers']} "
                   f"batch_size={topology['batch_size']} drop_last={topology['drop_last']} "
                   f"even_batches={topology['even_batches']} assignment={topology['assignment']}: "
                   f"{topology['slots']} slots"),
              (f"splits: {splits['count']:,} (planning version {topology['planning']}; rows per split: min {splits['rows_min']:,}, median "
               f"{splits['rows_median']:,.0f}, max {splits['rows_max']:,})"), "",
              ]
    if report.get("canonical"):
        lines += _canonical_lines(report["canonical"], topology)
    if report["workers"] is None:
        lines.append("rank  worker  splits        rows   batches  rows trimmed  rows dropped")
        for s in report["slots"]:
            lines.append(f"{s['rank']:>4}  {s['worker']:>6}  {s['splits']:>6}  {s['rows']:>10,}  {s['batches']:>8,}  "
                         f"{s['rows_trimmed']:>12,}  {s['rows_dropped']:>12,}")
        lines.append("")
        fullest = "slot"
    else:
        lines += [f"per worker: {report['workers']}", ""]
        fullest = "rank"
    lines.append("rank  splits        rows   batches  rows yielded  rows trimmed")
    for r in report["ranks"]:
        lines.append(f"{r['rank']:>4}  {r['splits']:>6}  {r['rows']:>10,}  {r['batches']:>8,}  {r['rows_yielded']:>12,}  "
                     f"{r['rows_trimmed']:>12,}")
    lines += ["", f"imbalance: the fullest {fullest} holds {report['imbalance']:.1%} more rows than the mean",
              (f"even_batches trims {report['rows_trimmed']:,} rows per epoch; drop_last drops "
               f"{report['rows_dropped']:,}")]
    return "\n".join(lines)


def _canonical_lines(canonical: dict[str, Any], topology: dict[str, Any]) -> list[str]:
    """``order="canonical"``: the canonical slots, who reads which (a range per (rank, worker) slot), their rows."""
    c = canonical
    lines = [(f"order=canonical: {c['slots']} canonical slots, each gives {c['chunk']:,} rows to every global batch "
              f"of {c['global_batch']:,} rows (world_size {topology['world_size']} x batch_size "
              f"{topology['batch_size']:,}); {c['batches_per_epoch']:,} global batches per epoch")]
    for reader in c["readers"]:
        first, last = reader["canonical_slots"]
        which = f"canonical slots {first}-{last}" if last > first else f"canonical slot {first}"
        lines.append(f"  rank {reader['rank']} worker {reader['worker']}: {which}")
    lines.append(f"  rows per canonical slot: {runs(c['rows'])}")
    if c["rows_yielded"] != c["rows"]:
        lines.append(f"  rows yielded per canonical slot (even batches over the canonical slots): "
                     f"{runs(c['rows_yielded'])}")
    return lines + [""]


def run(args: argparse.Namespace) -> int:
    """``arrowstream inspect``: a mixture's report with ``--source``, else a dataset's."""
    if args.source:
        from . import mixture_inspect as _mix_inspect

        return _mix_inspect.run(args)
    dataset = open_dataset(args, rank=0, world_size=args.world_size, even_batches=not args.no_even_batches,
                           drop_last=args.drop_last, assignment=args.assignment, order=args.order,
                           canonical_slots=args.canonical_slots)
    report = describe(dataset, args.num_workers)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0
