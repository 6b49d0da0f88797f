"""The feature-parity matrix (issue #38): every loader feature on every front door, exact or refused.

A cell is (door, assignment, feature). Doors: ``StructuredDataset`` over Parquet files, ``IcebergDataset``
over a table of pyiceberg's SQL catalog, a ``Mixture`` of two sources; assignments ``"static"`` and
``"dynamic"``. A cell is either **exact** (every row of the epoch once, counted by the ``id`` column or the row
ids, through save and resume; and, where the feature promises it, the batches after a resume equal those of an
uninterrupted run) or **refused**: :data:`REFUSED` names the arrowstream error and a reason a user would accept.
Cells :data:`PENDING` are refused or failing today and being fixed by issue #38's other parts: they are
strict xfails, so they turn into failures the day they work (move them out of :data:`PENDING` then).
``docs/parity.md`` shows the same matrix; :func:`test_the_docs_table_is_this_matrix` keeps the two one.

The data is tiny: 320 rows per door (row groups of 40), batches of 16, 2 workers.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import arrowstream
from arrowstream import IcebergDataset, Mixture, Source, StructuredDataset, describe_state, merge_state_dicts
from arrowstream.errors import InvalidArgumentError
from arrowstream.testing import check_resume

DOORS = ("dataset", "iceberg", "mixture")
ASSIGNMENTS = ("static", "dynamic")
FEATURES = ("fresh_process", "elastic_workers", "elastic_twice", "elastic_ranks", "merge", "skip", "with_row_ids",
            "describe_state", "check_resume", "inspect", "metrics")

ROWS, ROW_GROUP, BATCH, WORKERS, SEED = 320, 40, 16, 2, 1
TAKEN = 5   # batches taken before a checkpoint
MIXTURE_BASE = 1000   # the mixture's second source holds ids 1000..1159, its first 0..159

_TIMING = "hands out batches in an order that depends on timing"
_MIXTURE_SHARES = "each batch's share of every source is fixed per worker slot"
REFUSED: dict[tuple[str, str, str], tuple[type[Exception], str]] = {
    ("dataset", "dynamic", "check_resume"): (InvalidArgumentError, _TIMING),
    ("iceberg", "dynamic", "check_resume"): (InvalidArgumentError, _TIMING),
    # a Mixture refuses assignment="dynamic" when it is built, whatever the feature
    **{("mixture", "dynamic", feature): (InvalidArgumentError, _MIXTURE_SHARES) for feature in FEATURES},
}

PENDING: dict[tuple[str, str, str], str] = {
}


# -- the doors ---------------------------------------------------------------------------------------------


def _write(folder: Path, start: int, sizes: list[int]) -> str:
    folder.mkdir(parents=True)
    for index, rows in enumerate(sizes):
        ids = np.arange(start, start + rows, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": ids * 0.5}), folder / f"part-{index}.parquet",
                       row_group_size=ROW_GROUP)
        start += rows
    return str(folder)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each door's 320 rows: two Parquet files, an Iceberg table of two appends, two mixture sources."""
    from pyiceberg.catalog import load_catalog

    root = tmp_path_factory.mktemp("parity")
    config = arrowstream.iceberg_catalog_config(str(root / "iceberg"))
    catalog = load_catalog("default", **config)
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=pa.schema([("id", pa.int64()), ("x", pa.float64())]),
                                 properties={"write.parquet.row-group-limit": str(ROW_GROUP)})
    for start in (0, ROWS // 2):
        ids = np.arange(start, start + ROWS // 2, dtype=np.int64)
        table.append(pa.table({"id": ids, "x": ids * 0.5}))
    return {"dataset": _write(root / "files", 0, [ROWS // 2, ROWS // 2]), "catalog": str(root / "iceberg"),
            "a": _write(root / "a", 0, [ROWS // 2]), "b": _write(root / "b", MIXTURE_BASE, [ROWS // 2])}


def build(data: dict[str, str], door: str, assignment: str, num_workers: int = WORKERS, **options: Any) -> Any:
    """``(loader, dataset)`` of a door: shuffled, batches of 16 (module level: a fresh process imports it)."""
    options = {"batch_size": BATCH, "shuffle": True, "seed": SEED, "num_workers": num_workers, **options}
    if assignment != "static":
        options["assignment"] = assignment
    if door == "dataset":
        return StructuredDataset.create_dataloader(path=data["dataset"], **options)
    if door == "iceberg":
        config = arrowstream.iceberg_catalog_config(data["catalog"])
        return IcebergDataset.create_dataloader("db.events", catalog_config=config, **options)
    return Mixture.create_dataloader(sources={"a": Source(data["a"]), "b": Source(data["b"])}, **options)


def every_id(door: str) -> list[int]:
    if door == "mixture":
        return [*range(ROWS // 2), *range(MIXTURE_BASE, MIXTURE_BASE + ROWS // 2)]
    return list(range(ROWS))


# -- running loaders ---------------------------------------------------------------------------------------


def _ids(batch: Any) -> list[int]:
    return [int(i) for i in batch["id"]]


def take(loader: Any, count: int | None = None) -> list[list[int]]:
    """The ids of the next ``count`` batches (None: to the end of the epoch); the workers ended after."""
    batches = iter(loader)
    try:
        if count is None:
            return [_ids(b) for b in batches]
        return [_ids(next(batches)) for _ in range(count)]
    finally:
        stop(batches)


def stop(batches: Any) -> None:
    """End an iterator's workers now (a loop left early), not at garbage collection (see helpers.all_batches)."""
    inner = getattr(batches, "_inner", batches)
    getattr(inner, "_shutdown_workers", lambda: None)()


def json_state(loader: Any) -> Any:
    return json.loads(json.dumps(loader.state_dict()))


def assert_once(batches: list[list[int]], expected: list[int], what: str) -> None:
    """Every id of ``expected`` exactly once in ``batches``."""
    counts = Counter(i for batch in batches for i in batch)
    repeated = sorted(i for i, n in counts.items() if n > 1)
    lost = sorted(set(expected) - set(counts))
    invented = sorted(set(counts) - set(expected))
    assert not (repeated or lost or invented), f"{what}: repeated {repeated[:10]}, lost {lost[:10]}, invented {invented[:10]}"


def uninterrupted(data: dict[str, str], door: str, assignment: str, epochs: int = 1, **options: Any) -> list[list[list[int]]]:
    loader, dataset = build(data, door, assignment, **options)
    out = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        out.append(take(loader))
    return out


def interrupted(data: dict[str, str], door: str, assignment: str, batches: int = TAKEN,
                **options: Any) -> tuple[list[list[int]], Any]:
    """The ids of the first ``batches`` batches of epoch 0, and the state after them (through JSON)."""
    loader, dataset = build(data, door, assignment, **options)
    dataset.set_epoch(0)
    batches_iter = iter(loader)
    try:
        seen = [_ids(next(batches_iter)) for _ in range(batches)]
        state = json_state(loader)
    finally:
        stop(batches_iter)
    return seen, state


# -- the features ------------------------------------------------------------------------------------------


_CHILD = """
import json, sys
sys.path.insert(0, {tests!r})
from test_parity import build, take
spec = json.loads(sys.argv[1])
loader, dataset = build(spec["data"], spec["door"], spec["assignment"])
loader.load_state_dict(json.load(open(spec["state"])))
out = []
for epoch in (0, 1):
    dataset.set_epoch(epoch)
    out.append(take(loader))
print(json.dumps(out))
"""


def fresh_process(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """A checkpoint of epoch 0 resumed by a new Python process: the rest of epoch 0 once, then epoch 1 whole
    (static: the very batches the loader that took the checkpoint went on to yield)."""
    loader, dataset = build(data, door, assignment)
    dataset.set_epoch(0)
    batches = iter(loader)
    try:
        seen = [_ids(next(batches)) for _ in range(TAKEN)]
        (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
        going_on = [seen + [_ids(b) for b in batches]]
    finally:
        stop(batches)
    dataset.set_epoch(1)
    going_on.append(take(loader))
    spec = {"data": data, "door": door, "assignment": assignment, "state": str(tmp_path / "state.json")}
    child = subprocess.run([sys.executable, "-c", _CHILD.format(tests=str(Path(__file__).parent)), json.dumps(spec)],
                           check=False, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    rest, next_epoch = json.loads(child.stdout.strip().splitlines()[-1])
    assert_once(seen + rest, every_id(door), "epoch 0 across the fresh process")
    assert_once(next_epoch, every_id(door), "epoch 1 in the fresh process")
    if assignment == "static":
        assert [seen + rest, next_epoch] == going_on, "the fresh process resumed other batches"


def elastic_workers(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """A checkpoint of 2 workers resumed by 3: the rest of the epoch once, the next epoch whole."""
    seen, state = interrupted(data, door, assignment)
    loader, dataset = build(data, door, assignment, num_workers=3)
    loader.load_state_dict(state)
    assert_once(seen + take(loader), every_id(door), "the epoch across 2 then 3 workers")
    dataset.set_epoch(1)
    assert_once(take(loader), every_id(door), "the next epoch on 3 workers")


def elastic_twice(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """A checkpoint inside an epoch re-planned from 2 workers to 3, resumed by 1: the rest of the epoch once."""
    seen, state = interrupted(data, door, assignment)
    loader, dataset = build(data, door, assignment, num_workers=3)
    loader.load_state_dict(state)
    dataset.set_epoch(0)
    seen += take(loader, 3)
    state = json_state(loader)
    loader, _ = build(data, door, assignment, num_workers=1)
    loader.load_state_dict(state)
    assert_once(seen + take(loader), every_id(door), "the epoch across 2, then 3, then 1 worker(s)")


def _ranks_states(data: dict[str, str], door: str, assignment: str, world_size: int,
                  batches: int) -> tuple[list[list[list[int]]], list[Any]]:
    seen, states = [], []
    for rank in range(world_size):
        ids, state = interrupted(data, door, assignment, batches, rank=rank, world_size=world_size, plan_locally=True)
        seen.append(ids)
        states.append(state)
    return seen, states


def elastic_ranks(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """A merged checkpoint of 2 ranks resumed on 3: the rest once (this data's re-planned shares need no trim)."""
    seen, states = _ranks_states(data, door, assignment, 2, 3)
    merged = json.loads(json.dumps(merge_state_dicts(states)))
    rest = []
    for rank in range(3):
        loader, _ = build(data, door, assignment, rank=rank, world_size=3, plan_locally=True)
        loader.load_state_dict(merged)
        rest.append(take(loader))
        assert len(rest[-1]) == len(loader), f"rank {rank}: len(loader) is not what it yields"
    assert len({len(r) for r in rest}) == 1, "even_batches: the ranks yield other batch counts"
    assert_once([b for rank in seen + rest for b in rank], every_id(door), "the epoch across 2 then 3 ranks")


def merge(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """``merge_state_dicts`` of 2 ranks, loaded by each rank again: the rest once, in equal batch counts
    (static: each rank's very batches of the uninterrupted run)."""
    seen, states = _ranks_states(data, door, assignment, 2, 3)
    merged = json.loads(json.dumps(merge_state_dicts(states)))
    rest, lengths = [], []
    for rank in range(2):
        loader, _ = build(data, door, assignment, rank=rank, world_size=2, plan_locally=True)
        loader.load_state_dict(merged)
        rest.append(take(loader))
        lengths.append(len(loader))
        if assignment == "static":
            whole = uninterrupted(data, door, assignment, rank=rank, world_size=2, plan_locally=True)[0]
            assert seen[rank] + rest[rank] == whole, f"rank {rank} resumed other batches"
    assert [3 + len(r) for r in rest] == lengths, "even_batches: every rank yields len(loader) batches"
    assert_once([b for rank in seen + rest for b in rank], every_id(door), "the epoch across the merged checkpoint")


def skip(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """``skip(batches=2)`` after 3 batches: 32 rows passed over and counted, the rest once across a resume
    (static: the batches after the skip are the uninterrupted run's from batch 5 on)."""
    loader, dataset = build(data, door, assignment)
    dataset.set_epoch(0)
    batches = iter(loader)
    try:
        seen = [_ids(next(batches)) for _ in range(3)]
        loader.skip(batches=2)
        seen += [_ids(next(batches)) for _ in range(2)]
        state = json_state(loader)
        assert loader.metrics()["skipped_rows"] == 2 * BATCH
    finally:
        stop(batches)
    fresh, _ = build(data, door, assignment)
    fresh.load_state_dict(state)
    rest = take(fresh)
    got = [i for b in seen + rest for i in b]
    assert len(got) == len(set(got)) == ROWS - 2 * BATCH and set(got) <= set(every_id(door))
    if assignment == "static":
        reference = uninterrupted(data, door, assignment)[0]
        assert seen + rest == reference[:3] + reference[5:]


def with_row_ids(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """``_file``/``_row`` name every row of the epoch once across a resume, and each names its own row."""
    loader, dataset = build(data, door, assignment, with_row_ids=True, output_format="dict")
    dataset.set_epoch(0)
    batches = iter(loader)
    try:
        rows = [next(batches) for _ in range(TAKEN)]
        state = json_state(loader)
    finally:
        stop(batches)
    fresh, _ = build(data, door, assignment, with_row_ids=True, output_format="dict")
    fresh.load_state_dict(state)
    rows += list(fresh)
    where = [(f, r) for b in rows for f, r in zip(b["_file"], b["_row"], strict=True)]
    assert len(where) == len(set(where)) == ROWS
    files = {index: pq.read_table(name.removeprefix("file://"), columns=["id"]).column("id").to_pylist()
             for index, name in enumerate(dataset.files)}
    assert [files[f][r] for f, r in where] == [i for b in rows for i in b["id"]]
    assert sorted(i for b in rows for i in b["id"]) == every_id(door)


def describe(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """``describe_state`` counts the rows and batches a checkpoint holds as consumed."""
    _, state = interrupted(data, door, assignment)
    about = describe_state({"loader": state, "epoch": 0})
    assert (about["epoch"], about["batches"], about["rows"]) == (0, TAKEN, TAKEN * BATCH)


def check_resume_cell(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """``arrowstream.testing.check_resume`` passes on the door's own pipeline."""
    report = check_resume(functools.partial(build, data, door, assignment), points=[TAKEN], epochs=2,
                          at_epoch_ends=False)
    assert report.batches_compared == 2 * ROWS // BATCH - TAKEN


def inspect(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """``arrowstream inspect --json`` for 2 ranks of 2 workers says each rank's batches and rows as loaded."""
    from arrowstream import cli

    source = {"dataset": [data["dataset"]],
              "iceberg": ["--iceberg-table", "db.events", "--catalog-root", data["catalog"]],
              "mixture": ["--source", f"a={data['a']}", "--source", f"b={data['b']}"]}[door]
    loaders = [build(data, door, assignment, rank=rank, world_size=2, plan_locally=True)[0] for rank in range(2)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["inspect", *source, "--world-size", "2", "--num-workers", str(WORKERS), "--batch-size", str(BATCH),
                  "--assignment", assignment, "--json"])
    report = json.loads(out.getvalue())
    for rank, loader in enumerate(loaders):
        batches = take(loader)
        if door == "mixture":
            slots = [s for s in report["slots"] if s["rank"] == rank]
            rows = sum(s["rows"] - s["rows_left_out"] for s in slots)
            predicted = report["batches_per_rank"][rank]
        else:
            rows, predicted = report["ranks"][rank]["rows_yielded"], report["ranks"][rank]["batches"]
        assert (len(batches), len(loader), sum(map(len, batches))) == (predicted, predicted, rows), f"rank {rank}"


def metrics(data: dict[str, str], door: str, assignment: str, tmp_path: Path) -> None:
    """``loader.metrics()`` after an epoch counts its rows and batches, per worker and in all."""
    loader, _ = build(data, door, assignment)
    batches = take(loader)
    counted = loader.metrics()
    assert (counted["rows"], counted["batches"]) == (ROWS, len(batches))
    assert sum(w["rows"] for w in counted["workers"]) == ROWS


CHECKS = {"fresh_process": fresh_process, "elastic_workers": elastic_workers, "elastic_twice": elastic_twice,
          "elastic_ranks": elastic_ranks,
          "merge": merge, "skip": skip, "with_row_ids": with_row_ids, "describe_state": describe,
          "check_resume": check_resume_cell, "inspect": inspect, "metrics": metrics}


def _cells() -> list[Any]:
    cells = []
    for door in DOORS:
        for assignment in ASSIGNMENTS:
            for feature in FEATURES:
                cell = (door, assignment, feature)
                marks = [pytest.mark.xfail(strict=True, reason=PENDING[cell])] if cell in PENDING else []
                cells.append(pytest.param(*cell, marks=marks, id="-".join(cell)))
    return cells


@pytest.mark.parametrize(("door", "assignment", "feature"), _cells())
def test_cell(data, door, assignment, feature, tmp_path):
    check = CHECKS[feature]
    refusal = REFUSED.get((door, assignment, feature))
    if refusal is None:
        check(data, door, assignment, tmp_path)
        return
    error, reason = refusal
    with pytest.raises(error) as raised:
        check(data, door, assignment, tmp_path)
    assert type(raised.value) is error and reason in str(raised.value)


# -- the docs page -----------------------------------------------------------------------------------------


def status(cell: tuple[str, str, str]) -> str:
    if cell in PENDING:
        return f"not yet (#38 {PENDING[cell].split(':')[0].removeprefix('issue #38 ')})"
    if cell in REFUSED:
        error, reason = REFUSED[cell]
        return f"refused: `{error.__name__}` ({reason})"
    return "exact"


def matrix_table() -> str:
    """The matrix as a Markdown table: a row per feature, a column per door and assignment."""
    columns = [(door, assignment) for door in DOORS for assignment in ASSIGNMENTS]
    head = "| feature | " + " | ".join(f"{door} {assignment}" for door, assignment in columns) + " |"
    rule = "| --- |" + " --- |" * len(columns)
    rows = [f"| {feature} | " + " | ".join(status((d, a, feature)) for d, a in columns) + " |" for feature in FEATURES]
    return "\n".join([head, rule, *rows])


def test_the_docs_table_is_this_matrix():
    page = (Path(__file__).parent.parent / "docs" / "parity.md").read_text()
    assert matrix_table() in page, f"docs/parity.md: replace its table with\n\n{matrix_table()}\n"
    pending = sorted({reason for reason in PENDING.values()})
    for reason in pending:
        assert reason.split(": ", 1)[1] in page, f"docs/parity.md: say what is not there yet: {reason}"
