"""``arrowstream plan PATH``: build the plan cache entry of a dataset ahead of a job, and say what it holds.

It plans as a loader would (the same listing, footers and options), so the entry it writes is the one
the job finds; a second run reads no footer and says so (``hit``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from .._planning.cache import cache_folder, max_bytes
from .._planning.cache_entry import read_header

if TYPE_CHECKING:
    from ..dataset import StructuredDataset


def _folder_usage(folder: str) -> dict[str, int]:
    sizes = [entry.stat().st_size for entry in os.scandir(folder)
             if entry.name.endswith(".plan") and not entry.name.startswith(".")]
    return {"entries": len(sizes), "bytes": sum(sizes), "max_bytes": max_bytes()}


def report(dataset: StructuredDataset) -> dict[str, Any]:
    """What the plan cache did for ``dataset`` and what its entry holds, as plain data."""
    outcome = dataset.origin.cache_outcome
    assert outcome is not None, "a dataset is planned when it is built"
    out: dict[str, Any] = {"action": outcome.action, "reason": outcome.reason, "entry": outcome.path}
    if outcome.path is None:
        return out
    header = read_header(outcome.path)
    key = header["key"]
    out.update({
        "entry_bytes": os.path.getsize(outcome.path), "written": header["created"],
        "files": header["num_files"], "units": header["num_units"], "rows": header["num_rows"],
        "format": key["format"], "path": key.get("path"), "protocol": key["protocol"],
        "parse_options": key.get("parse_options"), "filter": (key.get("filter") or {}).get("text"),
        **({"table_uuid": key["table_uuid"], "snapshot_id": key["snapshot_id"], "row_filter": key["row_filter"]}
           if key["protocol"] == "iceberg" else {}),
        "folder": os.path.dirname(outcome.path), **{f"folder_{k}": v for k, v in
                                                    _folder_usage(os.path.dirname(outcome.path)).items()},
    })
    return out


def _text(info: dict[str, Any]) -> str:
    why = f" ({info['reason']})" if info["reason"] else ""
    if info["entry"] is None:
        return f"plan cache: {info['action']}{why}; nothing was written"
    lines = [
        f"plan cache entry: {info['entry']}",
        f"  this run: {info['action']}{why}",
        (f"  dataset: {info['format']} at {info['path']} ({info['protocol']})" if "snapshot_id" not in info else
         f"  table: {info['table_uuid']}, snapshot {info['snapshot_id']}, row filter {info['row_filter']} "
         f"({info['format']} data files)"),
        (f"  holds: {info['files']} files, {info['units']} units, {info['rows']} rows "
         "(the footers: unit rows and bytes, schemas, byte ranges, text row offsets, Parquet footers within the budget)"
         if "snapshot_id" not in info else
         f"  holds: {info['files']} data files, {info['units']} units, {info['rows']} rows before positional deletes "
         "(the data files' footers and the positions their delete files remove)"),
        f"  entry: {info['entry_bytes']} bytes, written {info['written']}",
        (f"  folder: {info['folder']}: {info['folder_entries']} entries, {info['folder_bytes']} bytes "
         f"(at most {info['folder_max_bytes']}, least recently used removed first)"),
    ]
    if info["parse_options"]:
        lines.insert(3, f"  parse options: {json.dumps(info['parse_options'], sort_keys=True)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from .inspect import open_dataset

    folder = cache_folder(args.cache_dir)
    dataset = open_dataset(args, plan_cache=folder)
    info = report(dataset)
    print(json.dumps(info, indent=2, sort_keys=True) if args.json else _text(info))
    return 0
