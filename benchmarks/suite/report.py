"""The suite's markdown report: environment, one table per data table, conversions, reading."""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .common import cpu_model
from .measure import Entry, Settings
from .runner import Outcome
from .tables import Table

RAW = "raw pyarrow loop"
GOALS = {  # arrowstream rows/s over the raw loop's, whole epoch, medians
    ("numeric", 0): 0.9, ("mixed", 0): 0.9,
    ("numeric", 2): 1.2, ("mixed", 2): 0.8,
}
PEER_FACTOR = 10.0


# -- numbers --------------------------------------------------------------------------------


def ok_results(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    return [o.result for o in outcomes if o.ok]


def median_of(outcomes: list[Outcome], key: str) -> float | None:
    values = [r[key] for r in ok_results(outcomes) if r.get(key) is not None]
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Stats:
    """Medians of one entry's samples."""

    epoch_rps: float | None
    steady_rps: float | None
    first_s: float | None
    rows: int | None
    complete: bool
    resume_s: float | None
    resume_exact: bool | None
    tree_mib: float | None
    self_mib: float | None
    child_mib: float | None
    samples: int
    reads_ahead: bool  # decodes in background processes, unbounded, while the first batch is pending


def stats(entry: Entry) -> Stats:
    results = ok_results(entry.epochs)
    good = [o for o in entry.epochs if o.ok]
    resumes = [r for r in ok_results(entry.resumes) if "resume_first_s" in r]
    return Stats(
        epoch_rps=median_of(entry.epochs, "epoch_rps"),
        steady_rps=median_of(entry.epochs, "steady_rps"),
        first_s=median_of(entry.epochs, "first_s"),
        rows=int(statistics.median(r["rows"] for r in results)) if results else None,
        complete=all(r.get("complete", True) for r in results),
        resume_s=statistics.median(r["resume_first_s"] for r in resumes) if resumes else None,
        resume_exact=all(r.get("exact") for r in resumes) if resumes else None,
        tree_mib=statistics.median(o.tree_peak_kib for o in good) / 1024 if good else None,
        self_mib=kib_to_mib(median_of(entry.epochs, "self_maxrss_kib")),
        child_mib=kib_to_mib(median_of(entry.epochs, "children_maxrss_kib")),
        samples=len(good),
        reads_ahead=any(r.get("reads_ahead") for r in results),
    )


def kib_to_mib(value: float | None) -> float | None:
    return None if value is None else value / 1024


def best_peer(entries: list[Entry], key: Callable[[Stats], float | None]) -> tuple[Entry, float] | None:
    scored: list[tuple[Entry, float]] = []
    for entry in entries:
        value = key(stats(entry)) if entry.group == "peer" and entry.primary else None
        if value:
            scored.append((entry, value))
    return max(scored, key=lambda pair: pair[1]) if scored else None


def find(entries: list[Entry], name: str) -> Entry | None:
    return next((e for e in entries if e.name == name), None)


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


# -- formatting -----------------------------------------------------------------------------


def fmt_rps(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value / 1e6:.2f} M" if value >= 1e5 else f"{value / 1e3:.1f} k"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}x" if value >= 0.1 else f"{value:.3f}x"


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds * 1e3:,.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.1f}"


def fmt_mib(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def entry_notes(entry: Entry, s: Stats) -> str:
    notes = []
    if entry.error:
        notes.append(f"**{entry.error}**")
    for outcome in entry.epochs:
        if not outcome.ok:
            notes.append(f"**error**: `{outcome.error}`")
    for outcome in entry.resumes:
        if not outcome.ok:
            notes.append(f"**resume error**: `{outcome.error}`")
    if s.samples and not s.complete:
        notes.append(f"stopped at the time cap after {s.rows:,} rows")
    if front_loaded(s):
        notes.append(f"rate after 1st batch overstated: the first batch took {first_share(s):.0%} of the "
                     "epoch, and it decoded ahead meanwhile")
    if s.resume_exact is False:
        notes.append("**resume yielded a batch other than the one after the checkpoint**")
    extra = {r.get("note") for r in ok_results(entry.epochs) + ok_results(entry.resumes)} - {None}
    notes += sorted(str(n) for n in extra)
    if s.samples > 1:
        notes.append(f"median of {s.samples}")
    return "; ".join(cell(n) for n in notes)


def resume_cell(entry: Entry, s: Stats) -> str:
    if s.resume_s is not None:
        return fmt_ms(s.resume_s)
    return entry.resume_note or ("failed" if entry.resumes else "–")


def results_table(entries: list[Entry]) -> list[str]:
    raw_entry = find(entries, RAW)
    raw = stats(raw_entry) if raw_entry is not None else None
    best_epoch = best_peer(entries, lambda s: s.epoch_rps)
    best_steady = best_peer(entries, lambda s: s.steady_rps)
    lines = [
        ("| loader | how | rows read | rows/s, whole epoch | rows/s, after 1st batch | vs raw (epoch / steady) "
         "| vs best peer (epoch / steady) | first batch ms | resume at 90%: first batch ms "
         "| peak RSS MiB: tree (self + largest child) | notes |"),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for entry in entries:
        s = stats(entry)
        vs_raw = (f"{fmt_ratio(ratio(s.epoch_rps, raw.epoch_rps if raw else None))} / "
                  f"{fmt_ratio(ratio(s.steady_rps, raw.steady_rps if raw else None))}")
        vs_peer = (f"{fmt_ratio(ratio(s.epoch_rps, best_epoch[1] if best_epoch else None))} / "
                   f"{fmt_ratio(ratio(s.steady_rps, best_steady[1] if best_steady else None))}")
        memory = "–" if s.tree_mib is None else (
            f"{fmt_mib(s.tree_mib)} ({fmt_mib(s.self_mib)} + {fmt_mib(s.child_mib)})")
        rows = "–" if s.rows is None else f"{s.rows:,}"
        lines.append(
            f"| {entry.name} | {cell(entry.description)} | {rows} | {fmt_rps(s.epoch_rps)} | {fmt_rps(s.steady_rps)} "
            f"| {vs_raw} | {vs_peer} | {fmt_ms(s.first_s)} | {cell(resume_cell(entry, s))} | {memory} "
            f"| {entry_notes(entry, s)} |")
    peers = ", ".join(f"{label}: {e.name} ({fmt_rps(v)})" for label, pair in
                      (("whole epoch", best_epoch), ("after 1st batch", best_steady)) if pair for e, v in [pair])
    lines += ["", f"Best peer: {peers or 'none ran'}."]
    return lines


def conversion_table(by_table: dict[str, list[Entry]]) -> list[str]:
    rows = []
    for kind, entries in by_table.items():
        for entry in entries:
            if entry.convert is None:
                continue
            r = entry.convert.result
            if entry.convert.ok:
                rows.append(f"| {entry.name} | {kind} | {r['rows']:,} | {r['convert_s']:.1f} "
                            f"| {fmt_rps(r['rows'] / r['convert_s'])} | {r['bytes'] / 2**20:,.0f} "
                            f"| {fmt_mib(entry.convert.tree_peak_kib / 1024)} |")
            else:
                rows.append(f"| {entry.name} | {kind} | – | – | – | – | – | **error**: `{cell(entry.convert.error or '')}`")
    if not rows:
        return ["No peer converted data in this run."]
    return ["| peer | table | rows | conversion s | rows/s | size on disk MiB | peak RSS MiB (tree) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |", *rows]


def samples_table(by_table: dict[str, list[Entry]]) -> list[str]:
    lines = ["| table | loader | whole-epoch rows/s of each run | first batch ms of each run | resume ms of each run |",
             "| --- | --- | --- | --- | --- |"]
    for kind, entries in by_table.items():
        for entry in entries:
            if len(entry.epochs) + len(entry.resumes) < 2:
                continue
            epochs = ", ".join(fmt_rps(o.result.get("epoch_rps")) if o.ok else "error" for o in entry.epochs)
            firsts = ", ".join(fmt_ms(o.result.get("first_s")) if o.ok else "error" for o in entry.epochs)
            resumes = ", ".join(fmt_ms(o.result.get("resume_first_s")) if o.ok else "error" for o in entry.resumes)
            lines.append(f"| {kind} | {entry.name} | {epochs} | {firsts} | {resumes or '–'} |")
    return lines


# -- reading --------------------------------------------------------------------------------


def goal_sentence(kind: str, entries: list[Entry], workers: int) -> str:
    entry = find(entries, f"arrowstream num_workers={workers}")
    raw = find(entries, RAW)
    goal = GOALS[(kind, workers)]
    if entry is None or raw is None:
        return ""
    value = ratio(stats(entry).epoch_rps, stats(raw).epoch_rps)
    if value is None:
        return f"`num_workers={workers}` on {kind}: no number (see the notes), so the >= {goal}x goal is **not shown met**."
    verdict = "met" if value >= goal else "**not met**"
    return f"`num_workers={workers}` on {kind}: {value:.2f}x the raw loop (goal >= {goal}x): {verdict}."


def first_share(s: Stats) -> float | None:
    """The share of the epoch's time spent before the first batch."""
    if s.first_s is None or not s.epoch_rps or not s.rows:
        return None
    return s.first_s * s.epoch_rps / s.rows


def front_loaded(s: Stats) -> bool:
    """True for a loader that reads ahead in the background (Ray) and whose first batch took over
    20% of the epoch: it decoded much of the data meanwhile, which its rate after the first batch
    then leaves out. (HF's slow first batch is set-up in one process: no such overstatement.)"""
    share = first_share(s)
    return s.reads_ahead and share is not None and share > 0.2


def against_peer(entries: list[Entry], steady_rps: float, epoch_rps: float) -> list[str]:
    parts = []
    for workers in (0, 1, 2):
        entry = find(entries, f"arrowstream num_workers={workers}")
        if entry is None:
            continue
        s = stats(entry)
        steady, epoch = ratio(s.steady_rps, steady_rps), ratio(s.epoch_rps, epoch_rps)
        verdict = "met" if steady and epoch and min(steady, epoch) >= PEER_FACTOR else "**not met**"
        parts.append(f"`num_workers={workers}` {fmt_ratio(steady)} after the first batch and "
                     f"{fmt_ratio(epoch)} over the whole epoch ({verdict})")
    return parts


def peer_sentence(kind: str, entries: list[Entry]) -> str:
    best_epoch = best_peer(entries, lambda s: s.epoch_rps)
    best_steady = best_peer(entries, lambda s: s.steady_rps)
    if best_steady is None or best_epoch is None:
        return f"On {kind} no peer produced a number, so the >= {PEER_FACTOR:.0f}x goal cannot be judged."
    parts = against_peer(entries, best_steady[1], best_epoch[1])
    text = (f"On {kind} the best peer is {best_steady[0].name} after the first batch "
            f"({fmt_rps(best_steady[1])} rows/s) and {best_epoch[0].name} over the whole epoch "
            f"({fmt_rps(best_epoch[1])} rows/s); against them (goal >= {PEER_FACTOR:.0f}x on both measures) "
            f"arrowstream reaches " + ", ".join(parts) + ".")
    s_best = stats(best_steady[0])
    if front_loaded(s_best):
        text += (f" But {best_steady[0].name} spent {fmt_ms(s_best.first_s)} ms, "
                 f"{first_share(s_best):.0%} of its epoch, before its first batch and "
                 "decoded ahead meanwhile, so its rate after the first batch overstates its steady state.")
        others = best_peer(entries, lambda s: None if front_loaded(s) else s.steady_rps)
        if others is not None:
            text += (f" Leaving such peers out, the best after the first batch is {others[0].name} "
                     f"({fmt_rps(others[1])} rows/s), and arrowstream reaches "
                     + ", ".join(against_peer(entries, others[1], best_epoch[1])) + ".")
    return text


def resume_sentence(by_table: dict[str, list[Entry]]) -> str:
    parts = []
    for kind, entries in by_table.items():
        measured = [(e.name, stats(e)) for e in entries if stats(e).resume_s is not None]
        if measured:
            parts.append(f"{kind}: " + ", ".join(f"{name} {fmt_ms(s.resume_s)} ms" +
                                                  ("" if s.resume_exact else " (**not exact**)")
                                                  for name, s in measured))
    if not parts:
        return ""
    return "Time to the first batch after a resume at 90% (fresh loader included): " + "; ".join(parts) + "."


def failures(by_table: dict[str, list[Entry]]) -> str:
    failed = []
    for kind, entries in by_table.items():
        for entry in entries:
            candidates = [entry.error] + [o.error for o in entry.epochs + entry.resumes]
            if entry.convert is not None:
                candidates.append(entry.convert.error)
            problems = [p for p in candidates if p]
            if problems:
                failed.append(f"{entry.name} on {kind} ({problems[0][:200]})")
    return ("Failed measurements (their error is in the notes): " + "; ".join(failed) + ".") if failed else ""


def arrowstream_sources(by_table: dict[str, list[Entry]]) -> list[str]:
    """The distinct arrowstream source hashes measured, in the order first seen."""
    seen: list[str] = []
    for entries in by_table.values():
        for entry in entries:
            if entry.group != "arrowstream":
                continue
            for result in ok_results(entry.epochs + entry.resumes):
                source = result.get("source")
                if source and source not in seen:
                    seen.append(source)
    return seen


def source_warning(by_table: dict[str, list[Entry]]) -> str:
    sources = arrowstream_sources(by_table)
    if len(sources) <= 1:
        return ""
    return (f"**Warning: arrowstream's source changed while the suite ran** ({len(sources)} versions measured: "
            f"{', '.join(sources)}; see the `source` field of each run in the JSON file), so its medians mix "
            "versions. Run the suite again on a settled tree.")


def reading(by_table: dict[str, list[Entry]]) -> str:
    sentences = [source_warning(by_table)]
    for kind, entries in by_table.items():
        sentences += [goal_sentence(kind, entries, 0), goal_sentence(kind, entries, 2)]
    for kind, entries in by_table.items():
        sentences.append(peer_sentence(kind, entries))
    sentences += [resume_sentence(by_table), failures(by_table)]
    return " ".join(s for s in sentences if s)


# -- the document ---------------------------------------------------------------------------


def machine() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.platform()}; {cpu_model()}; {os.cpu_count()} cores ({usable} usable); {memory:.0f} GiB"


def table_line(table: Table) -> str:
    columns = "8 float32, 2 int64, 1 int8" + (", 1 string (4-12 chars), 1 list<float32> (0-8 values)"
                                              if table.spec.kind == "mixed" else "")
    return (f"- **{table.spec.kind}**: {table.spec.rows:,} rows in {len(table.files)} Parquet files "
            f"({table.bytes / 2**20:,.0f} MiB, snappy, {table.row_groups} row groups of up to "
            f"{table.spec.row_group_rows:,} rows; seed {table.spec.seed}); columns: {columns}.")


def render(*, title_date: str, command: str, versions: dict[str, str], tables: list[Table],
           by_table: dict[str, list[Entry]], settings: Settings, load: tuple[str, str], wall_s: float,
           notes: list[str]) -> str:
    lines = [f"# arrowstream benchmark suite ({title_date})", "",
             f"- Date: {dt.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
             f"- Machine: {machine()}",
             f"- Python: {platform.python_version()}",
             f"- Load average (1/5/15 min) at the start: {load[0]}; at the end: {load[1]} (the machine is shared)",
             f"- Versions: {', '.join(f'{k} {v}' for k, v in versions.items())}",
             f"- arrowstream sources measured (hash of `arrowstream/**/*.py`): {', '.join(arrowstream_sources(by_table))}"
             + (" (**changed during the run**)" if len(arrowstream_sources(by_table)) > 1 else ""),
             f"- Command: `{command}`",
             f"- Suite wall time: {wall_s / 60:.1f} min", "",
             "## Data and method", ""]
    lines += [table_line(t) for t in tables]
    lines += ["", (f"`batch_size={settings.batch_size}`. Every measurement runs in its own process. "
                   f"Baselines and arrowstream read all files, {settings.repeats} times interleaved (after one "
                   "untimed warm-up run of the raw loop and of arrowstream); the table shows medians. "
                   f"Peers read the first files of the same table that hold at least {settings.peer_rows:,} rows "
                   f"(\"rows read\"), once, with the epoch capped at {settings.peer_seconds:.0f} s "
                   f"({settings.peer_side_seconds:.0f} s for a secondary variant). The files sit in the page "
                   "cache: this measures decoding, conversion and loader overhead, not the disk."), "",
              ("- *Whole epoch*: rows / time from before the dataset or loader is built (imports excluded) to "
               "the last batch, so it includes planning, worker start-up and, for Ray, starting its local "
               "cluster. Peers read fewer rows, so their start-up weighs more here; *after 1st batch* (the "
               "steady state) leaves the first batch out and is the fairer comparison with peers."),
              "- *First batch*: the same start to the first batch in hand.",
              (f"- *Resume at 90%*: iterate {settings.resume_at:.0%} of the epoch's batches, take the state, stop; "
               "then time a fresh loader + `load_state_dict` + the first batch, and check it is the batch that "
               "followed the checkpoint."),
              ("- *Peak RSS*: the peak of the summed resident memory of the process and all its descendants, "
               "sampled every 50 ms (pages shared by forked workers count in each); in brackets "
               "`getrusage` `ru_maxrss` of the process itself and of its largest waited-for child."),
              ("- Output of every loader: numeric columns as tensors, the string and list columns as Python lists "
               "(HF: a list of one tensor per row for the list column; MosaicML: float32 arrays).")]
    lines += [f"- {n}" for n in notes]
    for kind, entries in by_table.items():
        lines += ["", f"## {kind.capitalize()} table", ""] + results_table(entries)
    lines += ["", "## Peer conversions (timed apart from the epoch)", ""] + conversion_table(by_table)
    lines += ["", "## Reading", "", reading(by_table)]
    lines += ["", "## Every run", ""] + samples_table(by_table)
    return "\n".join(lines).rstrip() + "\n"
