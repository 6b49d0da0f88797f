"""``arrowstream.format_state``: :func:`arrowstream.describe_state`'s dict as text, for people (``arrowstream
state show`` prints it); one layout for every kind of state, a mixture's sources and a dynamic ledger added
where the description holds them."""

from __future__ import annotations

from typing import Any

from .describe_canonical import runs
from .describe_kind import GIVE_THE_DATA

HASHED = ("columns", "filter", "parse_options")   # options a state holds as a hash only, to stay small


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value:.1%}"


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _earlier_replans(replans: int) -> str:
    """How many times the old topology's epoch had been re-planned before (none: nothing said)."""
    if replans <= 1:
        return ""
    return f"; their epoch itself re-planned {replans - 1} time(s) before, from other topologies"


def format_state(description: dict[str, Any]) -> str:
    """:func:`describe_state`'s dict as text, for people (``arrowstream state show`` prints it).

    Example:
        >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> pq.write_table(pa.table({"x": list(range(10))}), os.path.join(folder, "part.parquet"))
        >>> loader, dataset = arrowstream.StructuredDataset.create_dataloader(path=folder, batch_size=4)
        >>> print(arrowstream.format_state(arrowstream.describe_state(loader.state_dict())).splitlines()[0])
        arrowstream.loader of a dataset, format version 14 (written by arrowstream 0.2.0)
    """
    d, topology = description, description["topology"]
    written = f" (written by arrowstream {d['arrowstream_version']})" if d.get("arrowstream_version") else ""
    saved_kind = f"{d['saved_kind']} " if d.get("saved_kind") not in (None, d["kind"]) else ""
    migrated = f", saved as {saved_kind}version {d['saved_version']}" \
        if saved_kind or d.get("saved_version") not in (None, d["version"]) else ""
    lines = [f"{d['kind']} of a {d['reads']}, format version {d['version']}{migrated}{written}"]
    if d.get("path"):
        lines.append(f"found at: {d['path']}")
    if d.get("other_paths"):
        lines.append(f"other states in the checkpoint (not shown; --at PATH): {', '.join(d['other_paths'])}")
    lines.append(f"epoch {d['epoch']}: {d['rows']:,} rows in {d['batches']:,} batches consumed, "
                 f"{_share(d['share'])} of {_count(d['epoch_rows'])} rows"
                 + (f" ({d['share_note']})" if d.get("share_note") else ""))
    lines.append(f"topology: world_size {topology['world_size']}, num_workers {topology['num_workers']}, "
                 f"batches_per_transfer {topology['batches_per_transfer']}; ranks in this state: "
                 f"{topology['ranks_in_state']} (group_size is not recorded)")
    lines.append(f"source: {d['source']}, assignment {d['assignment']}")
    if d["options"]:
        lines.append("options: " + ", ".join(f"{k}={v}" for k, v in d["options"].items()
                                             if k not in HASHED or v is None))
        lines += _hashed_lines(d)
    if d.get("data"):
        data = d["data"]
        snapshot = "" if data.get("snapshot_id") is None else \
            f", snapshot {data['snapshot_id']} (schema {data.get('schema_id')})"
        lines.append(f"data: {data['num_files']:,} file(s), {data['num_rows']:,} rows{snapshot}, fingerprint "
                     f"{data['fingerprint']}")
    if d.get("elastic"):
        e = d["elastic"]
        lines.append(f"elastic: epoch {e['epoch']} re-planned from world_size {e['old_world_size']}, num_workers "
                     f"{e['old_num_workers']} ({e['old_workers_done']} of {e['old_workers']} old workers had "
                     f"nothing left{_earlier_replans(e.get('replans', 1))}); rows count from the re-plan")
    if d.get("canonical"):
        lines += _canonical_lines(d["canonical"])
    if d.get("mixture"):
        lines += _mixture_lines(d["mixture"])
    for rank in d["ranks"]:
        lines += _rank_lines(rank)
    return "\n".join(lines)


def _hashed_lines(description: dict[str, Any]) -> list[str]:
    """The options a state holds as a hash (columns, filter, parse options): the names where known."""
    lines, options = [], description["options"]
    if options.get("columns") is not None:
        names = description.get("column_names")
        lines.append(f"columns: {', '.join(names)}" if names else
                     f"columns: hash {options['columns']} (names not stored in the state; give the data to name them: "
                     f"{GIVE_THE_DATA})")
    if options.get("filter") is not None:
        lines.append(f"filter: hash {options['filter']} (the expression is not stored in the state)")
    if options.get("parse_options") is not None:
        lines.append(f"parse_options: hash {options['parse_options']} (not stored in the state)")
    return lines


def _canonical_lines(canonical: dict[str, Any]) -> list[str]:
    """``order="canonical"``: its canonical slots, the global batch they stand at, their rows (in runs)."""
    c = canonical
    lines = [(f"order: canonical, {c['slots']} canonical slots of {c['chunk']} rows per global batch; they stand at "
             f"global batch {c['global_batch']:,} of epoch {c['epoch']} ({c['slots_in_state']} of {c['slots']} in "
             "this state)"),
             f"  rows consumed per canonical slot: {runs(c['rows'])}"]
    if c.get("epoch_rows") is not None:
        lines.append(f"  rows of the epoch per canonical slot: {runs(c['epoch_rows'])}")
    return lines


def _mixture_lines(mixture: dict[str, Any]) -> list[str]:
    lines = [f"mixture: {_count(mixture['epoch_rows'])} rows an epoch"
             + (", epoch re-planned from another topology" if mixture["replanned"] else "")]
    for name, source in mixture["sources"].items():
        weight = mixture["weights"].get(name)
        lines.append(f"  {name}: weight {_share(weight)}, quota {source['quota']:,}, starts at row "
                     f"{source['start']:,} of its passes, {source['rows']:,} rows taken; data "
                     f"{source['data'].get('num_files')} file(s), {source['data'].get('num_rows')} rows")
    return lines


def _rank_lines(rank: dict[str, Any]) -> list[str]:
    over = ", epoch over" if rank["epoch_over"] else ""
    lines = [(f"rank {rank['rank']}: epoch {rank['epoch']}, {rank['rows']:,} rows in {rank['batches']:,} batches, "
             f"{_share(rank.get('share'))} of {_count(rank.get('epoch_rows'))} rows{over}")]
    if rank["batches_since_snapshot"]:
        lines.append(f"  + {rank['batches_since_snapshot']} batch(es) yielded after the workers' snapshot")
    for worker in rank["workers"]:
        if worker["epoch"] is None:
            lines.append(f"  worker {worker['worker']}: no state yet")
            continue
        done = ", done" if worker["epoch_complete"] else ""
        sources = "".join(f", {n} {r:,}" for n, r in worker.get("sources", {}).items())
        if worker.get("canonical_slots"):
            first, last = worker["canonical_slots"]
            sources += f", canonical slots {first}-{last}" if last > first else f", canonical slot {first}"
        lines.append(f"  worker {worker['worker']}: epoch {worker['epoch']}, {worker['rows']:,} rows, "
                     f"{worker['batches']:,} batches, {worker['rows_dropped']:,} dropped{sources}{done}")
    if rank.get("dynamic"):
        dyn = rank["dynamic"]
        lines.append(f"  dynamic ledger ({dyn['ledger_bytes']:,} bytes): epoch {dyn['epoch']}, {dyn['replays']} "
                     f"replay(s) of {dyn['replay_rows']:,} rows, {dyn['splits']} split(s) of {dyn['split_rows']:,} "
                     f"rows, and the rank's fresh rows from row {dyn['fresh_from_row']:,} on")
    for skip in rank.get("skips", []):
        lines.append(f"  skipped: epoch {skip['epoch']}, after batch {skip['at_batch']:,}: {skip['batches']:,} "
                     f"batch(es), {skip['rows']:,} rows")
    if rank.get("pending_skip"):
        lines.append(f"  pending skip: the next {rank['pending_skip']:,} batch(es)")
    return lines
