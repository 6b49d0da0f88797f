"""``describe_state`` and ``arrowstream state show``: what a checkpoint says, checked against what the loop
consumed, on real checkpoints of every kind; tampered states refused as ``load_state_dict`` refuses them."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import golden_worker_version, json_roundtrip, write_ids

import arrowstream
from arrowstream import Mixture, Source, StateError, StructuredDataset, cli, describe_state, format_state
from arrowstream.errors import StateMismatchError, StateVersionError

OPTIONS = {"batch_size": 10, "shuffle": True, "seed": 3, "shuffle_buffer_size": 30, "interleave": 2}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """2 files, 230 rows, row groups of 25: 10 splits."""
    return write_ids(tmp_path_factory.mktemp("describe"))


def loader_of(folder, num_workers=0, **options):
    return StructuredDataset.create_dataloader(path=folder, num_workers=num_workers, **{**OPTIONS, **options})


def take(batches, count):
    """Rows of the next ``count`` batches."""
    return sum(len(next(batches)["id"]) for _ in range(count))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_counts_are_what_the_loop_consumed_mid_epoch_and_after_it(folder, num_workers):
    loader, dataset = loader_of(folder, num_workers, batches_per_transfer=2)
    dataset.set_epoch(0)
    batches = iter(loader)
    rows = take(batches, 5)   # inside a chunk of 2 with workers
    checkpoint = json_roundtrip({"model": {"w": [1.0]}, "loader": loader.state_dict(), "epoch": 0})
    about = describe_state(checkpoint)
    assert (about["path"], about["other_paths"], about["kind"], about["version"]) == (
        "loader", [], "arrowstream.loader", arrowstream._state.versions.STATE_VERSION)
    assert (about["epoch"], about["rows"], about["batches"]) == (0, rows, 5)
    assert about["epoch_rows"] == dataset.num_rows == 230
    assert about["share"] == pytest.approx(rows / 230)
    [rank] = about["ranks"]
    assert len(rank["workers"]) == max(num_workers, 1)
    assert sum(w["rows"] for w in rank["workers"]) == rows and sum(w["batches"] for w in rank["workers"]) == 5
    assert {k: about["options"][k] for k in OPTIONS} == OPTIONS
    assert about["topology"] == {"world_size": 1, "num_workers": num_workers, "batches_per_transfer":
                                 2 if num_workers else 1, "ranks_in_state": 1, "group_size": None}
    assert (about["data"]["num_files"], about["data"]["num_rows"], about["source"]) == (2, 230, "files")
    text = format_state(about)
    assert f"epoch 0: {rows} rows in 5 batches consumed, {rows / 230:.1%} of 230 rows" in text
    assert "found at: loader" in text
    rows += sum(len(batch["id"]) for batch in batches)
    after = describe_state(loader.state_dict())
    assert rows == 230 and (after["rows"], after["share"], after["ranks"][0]["epoch_over"]) == (230, 1.0, True)
    assert after["batches"] == len(loader)


def test_a_merged_checkpoint_of_two_ranks_and_the_epoch_rows_from_the_data(folder):
    states, rows, datasets, epoch_rows = [], [], [], []
    for rank, count in ((0, 2), (1, 3)):
        loader, dataset = loader_of(folder, rank=rank, world_size=2)
        batches = iter(loader)
        rows.append(take(batches, count))
        states.append(loader.state_dict())
        datasets.append(dataset)
        full = loader_of(folder, rank=rank, world_size=2)[0]   # the rank's rows of a whole epoch, by reading it
        epoch_rows.append(sum(len(b["id"]) for b in full))
    merged = arrowstream.merge_state_dicts([states[1], states[0]])
    about = describe_state(merged)
    assert about["kind"] == "arrowstream.checkpoint" and about["topology"]["ranks_in_state"] == 2
    assert [(r["rank"], r["rows"], r["batches"]) for r in about["ranks"]] == [(0, rows[0], 2), (1, rows[1], 3)]
    assert about["share"] is None and "unknown without the data" in about["share_note"]
    known = describe_state(merged, dataset=datasets[0])
    assert [r["epoch_rows"] for r in known["ranks"]] == epoch_rows
    assert [r["share"] for r in known["ranks"]] == pytest.approx([r / e for r, e in zip(rows, epoch_rows)])
    assert known["share"] == pytest.approx(sum(rows) / sum(epoch_rows))
    one_rank = describe_state(states[1])   # one rank's state of two: no share of the whole epoch
    assert one_rank["ranks"][0]["rank"] == 1 and one_rank["share"] is None
    _, other = loader_of(folder, seed=4, rank=0, world_size=2)   # another seed: refused, saved vs current
    with pytest.raises(StateMismatchError, match="seed: saved 3 vs current 4"):
        describe_state(merged, dataset=other)


def test_an_elastic_epoch_names_its_old_topology(folder):
    states = []
    for rank in range(2):
        loader, _ = loader_of(folder, rank=rank, world_size=2)
        batches = iter(loader)
        take(batches, 2)
        states.append(loader.state_dict())
    loader, _ = loader_of(folder)
    loader.load_state_dict(arrowstream.merge_state_dicts(states))   # 2 ranks -> 1: the rest re-planned
    batches = iter(loader)
    rows = take(batches, 3)
    about = describe_state(loader.state_dict())
    assert about["elastic"] == {"epoch": 0, "old_world_size": 2, "old_num_workers": 0, "old_workers": 2,
                                "old_workers_done": 0, "replans": 1}
    assert (about["rows"], about["batches"], about["share"]) == (rows, 3, None)
    assert "re-planned" in about["share_note"]
    assert "elastic: epoch 0 re-planned from world_size 2, num_workers 0" in format_state(about)


def test_a_dynamic_ledger_leaves_what_was_not_consumed(folder):
    loader, dataset = loader_of(folder, assignment="dynamic")
    batches = iter(loader)
    rows = take(batches, 4)
    about = describe_state(loader.state_dict())
    assert about["assignment"] == "dynamic"
    ledger = about["ranks"][0]["dynamic"]
    left = ledger["replay_rows"] + ledger["split_rows"] + (dataset.num_rows - ledger["fresh_from_row"])
    assert left == ledger["rows_left"] == dataset.num_rows - rows
    assert ledger["epoch"] == 0 and 0 < ledger["ledger_bytes"] < 2000
    assert (about["rows"], about["epoch_rows"], about["share"]) == (rows, 230, pytest.approx(rows / 230))
    assert "dynamic ledger" in format_state(about)
    resumed, _ = loader_of(folder, assignment="dynamic")   # its workers count from the resume; the ledger does not
    resumed.load_state_dict(loader.state_dict())
    more = take(iter(resumed), 2)
    assert describe_state(resumed.state_dict())["rows"] == rows + more


def test_a_mixture_state_and_checkpoint(tmp_path):
    sources = {}
    for name, rows in (("a", 120), ("b", 40)):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"id": list(range(rows))}), tmp_path / name / "p.parquet", row_group_size=20)
        sources[name] = Source(str(tmp_path / name))
    states, taken = [], {"a": 0, "b": 0}
    for rank in range(2):
        loader, _mixture = Mixture.create_dataloader(sources=sources, weights={"a": 0.75, "b": 0.25}, epoch_rows=100,
                                                    batch_size=8, source_column="src", rank=rank, world_size=2,
                                                    plan_cache=False)
        batches = iter(loader)
        for _ in range(2 + rank):
            for name in next(batches)["src"]:
                taken[name] += 1
        states.append(loader.state_dict())
    about = describe_state({"loader": arrowstream.merge_state_dicts(states)})
    assert (about["kind"], about["saved_kind"], about["reads"], about["source"]) == (
        "arrowstream.checkpoint", "arrowstream.checkpoint", "mixture", "mixture")
    mix = about["mixture"]
    assert mix["epoch_rows"] == 100 and {n: s["quota"] for n, s in mix["sources"].items()} == {"a": 75, "b": 25}
    assert {n: s["rows"] for n, s in mix["sources"].items()} == taken
    assert about["rows"] == sum(taken.values()) == 8 * 5 and about["share"] == pytest.approx(0.4)
    assert [r["batches"] for r in about["ranks"]] == [2, 3]
    assert "a: weight 75.0%, quota 75" in format_state(about)
    assert describe_state(states[0])["share"] is None   # one rank of two


def test_an_iceberg_state_names_its_snapshot_and_no_location(tmp_path):
    from iceberg_tables import make_catalog

    catalog, config = make_catalog(str(tmp_path / "warehouse"))
    table = catalog.create_table("db.t", schema=pa.schema([("id", pa.int64())]))
    table.append(pa.table({"id": pa.array(range(50), pa.int64())}))
    loader, _ = arrowstream.IcebergDataset.create_dataloader(table="db.t", catalog_config=config, batch_size=8)
    batches = iter(loader)
    rows = take(batches, 2)
    about = describe_state(loader.state_dict())
    assert about["source"] == "iceberg" and about["rows"] == rows
    assert about["data"]["snapshot_id"] == table.refresh().current_snapshot().snapshot_id
    assert str(tmp_path) not in json.dumps(about) and str(tmp_path) not in format_state(about)
    assert f"snapshot {about['data']['snapshot_id']}" in format_state(about)


def test_several_states_in_one_checkpoint(folder):
    loader, _ = loader_of(folder)
    state = loader.state_dict()
    checkpoint = {"train": {"loaders": [state, json_roundtrip(state)]}, "step": 3}
    about = describe_state(checkpoint)
    assert (about["path"], about["other_paths"]) == ("train.loaders[0]", ["train.loaders[1]"])
    assert describe_state(checkpoint, at="train.loaders[1]")["path"] == "train.loaders[1]"
    with pytest.raises(StateError, match="no arrowstream state at 'train'"):
        describe_state(checkpoint, at="train")
    with pytest.raises(StateError, match="no arrowstream loader state inside the dict"):
        describe_state({"model": {"w": [1.0]}})


def _tampered(state):
    """(what is changed, the changed state, what the error names) for a loader state with workers."""
    def changed(edit):
        copy = json_roundtrip(state)
        edit(copy)
        return copy

    worker = ("dataloader", "_snapshot", "_worker_snapshots", "worker_1", "dataset_state")

    def at(copy, path):
        for key in path:
            copy = copy[key]
        return copy

    return [
        ("version", changed(lambda s: s.update(version=99)), StateVersionError, "newer than this arrowstream"),
        ("rows", changed(lambda s: at(s, worker)["counters"].update(rows=-1)), StateError, "counters.rows"),
        ("rank", changed(lambda s: s.update(rank=3)), StateError, "rank is 3"),
        ("slot", changed(lambda s: at(s, worker)["slot"].update(worker_id=0)), StateError, "worker"),
        ("torchdata", changed(lambda s: s["dataloader"]["_snapshot"].pop("_worker_snapshots")), StateError,
         "_worker_snapshots"),
        ("skips", changed(lambda s: s.update(skips=[{"epoch": 0, "at_batch": 0, "batches": 0, "rows": 1}])),
         StateError, "skips[0].batches"),
    ]


def test_tampered_states_are_refused_as_load_refuses_them(folder):
    loader, _ = loader_of(folder, 2)
    batches = iter(loader)
    take(batches, 2)
    state = loader.state_dict()
    loader._iterator._shutdown_workers()
    fresh, _ = loader_of(folder, 2)
    for what, bad, error, named in _tampered(state):
        with pytest.raises(error, match=re.escape(named)) as described:
            describe_state({"loader": bad})
        with pytest.raises(StateError) as loaded:
            fresh.load_state_dict(bad)
        if what not in ("slot",):   # the loader checks the slot against the plan's grid, with its own words
            assert type(described.value) is type(loaded.value), what
            assert str(described.value) == str(loaded.value), what


def test_state_show_on_a_torch_save_file_and_as_json(folder, tmp_path, capsys):
    loader, _ = loader_of(folder)
    batches = iter(loader)
    rows = take(batches, 3)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "loader": loader.state_dict(), "epoch": 0}, path)
    assert cli.main(["state", "show", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"epoch 0: {rows} rows in 3 batches consumed" in text and "found at: loader" in text
    assert cli.main(["state", "show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == json_roundtrip(describe_state({"loader": loader.state_dict()}))
    as_json = tmp_path / "ckpt.json"
    as_json.write_text(json.dumps({"loader": loader.state_dict()}))
    assert cli.main(["state", "show", str(as_json)]) == 0 and "found at: loader" in capsys.readouterr().out


def test_state_show_with_the_data_counts_every_rank_and_names_the_columns(folder, tmp_path, capsys):
    """Without the data: what the CLI can do (--path), and the columns as a hash said to be one; with --path the
    share of a 2-rank checkpoint and the column names (found by the hash, or checked against --columns)."""
    states, rows = [], 0
    for rank in range(2):
        loader, _ = loader_of(folder, rank=rank, world_size=2, columns=["id"])
        rows += take(iter(loader), 2)
        states.append(loader.state_dict())
    path = tmp_path / "ckpt.pt"
    torch.save({"loader": arrowstream.merge_state_dicts(states)}, path)
    assert cli.main(["state", "show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "pass dataset=)" not in text and "? of ? rows" in text and "state show CKPT --path DATA" in text
    digest = describe_state(states[0])["options"]["columns"]
    assert f"columns: hash {digest} (names not stored in the state" in text and f"columns={digest}" not in text
    _, dataset = loader_of(folder, rank=0, world_size=2, columns=["id"])
    known = describe_state(arrowstream.merge_state_dicts(states), dataset=dataset)   # the Python way
    assert known["column_names"] == ["id"] and known["share"] == pytest.approx(rows / known["epoch_rows"])
    assert cli.main(["state", "show", str(path), "--path", folder]) == 0
    text = capsys.readouterr().out
    assert f"epoch 0: {rows} rows in 4 batches consumed, {known['share']:.1%} of {known['epoch_rows']} rows" in text
    assert "\ncolumns: id\n" in text and "hash" not in text
    assert describe_state(states[0])["column_names"] is None
    assert cli.main(["state", "show", str(path), "--path", folder, "--columns", "id", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["column_names"] == ["id"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["state", "show", str(path), "--path", folder, "--columns", "x,id"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--columns: x,id are not the columns the checkpoint read" in err
    loader, _ = loader_of(folder, columns=["x", "id"])   # not in the schema's order: found only with --columns
    take(iter(loader), 1)
    torch.save(loader.state_dict(), path)
    with pytest.raises(SystemExit):
        cli.main(["state", "show", str(path), "--path", folder])
    assert "no list of the data's columns in their schema order has it" in capsys.readouterr().err
    assert cli.main(["state", "show", str(path), "--path", folder, "--columns", "x,id"]) == 0
    assert "\ncolumns: x, id\n" in capsys.readouterr().out


def test_state_show_with_the_data_asks_for_the_runs_parse_options(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("a;b\n" + "".join(f"{i};{i}\n" for i in range(40)))
    loader, _ = StructuredDataset.create_dataloader(path=str(tmp_path / "data"), format="csv", batch_size=4,
                                                    parse_options={"delimiter": ";"}, rank=1, world_size=2)
    next(iter(loader))
    path = tmp_path / "ckpt.json"
    path.write_text(json.dumps(loader.state_dict()))
    with pytest.raises(SystemExit):
        cli.main(["state", "show", str(path), "--path", str(tmp_path / "data")])
    assert "--parse-option: the checkpoint's run read its text files with parse options" in capsys.readouterr().err
    assert cli.main(["state", "show", str(path), "--path", str(tmp_path / "data"), "--parse-option", "delimiter=;"]) == 0
    assert "rank 1: epoch 0, 4 rows in 1 batches, 20.0% of 20 rows" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "no state", "not a checkpoint", "tampered"])
def test_state_show_user_errors_are_one_line(folder, tmp_path, capsys, case):
    path = tmp_path / "ckpt.pt"
    if case == "no state":
        torch.save({"model": {"w": torch.zeros(2)}}, path)
    elif case == "not a checkpoint":
        path.write_bytes(b"\x00garbage")
    elif case == "tampered":
        state = loader_of(folder)[0].state_dict()
        state["dataloader"]["dataset_state"]["epoch"] = "zero"
        torch.save({"loader": state}, path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["state", "show", str(path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("arrowstream: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    expected = {"missing": "no such file", "no state": "no arrowstream loader state", "not a checkpoint":
                "is not JSON", "tampered": "epoch"}[case]
    assert expected in err


def test_every_golden_state_of_every_version_is_described():
    """Old states are migrated as on load: the batches the golden run had consumed when it saved them."""
    golden = _dataset_golden()
    assert len(golden) > 50
    for path in golden:
        case = json.loads(path.read_text())
        about = describe_state(case)   # the state sits at case["state"]
        assert about["path"] == "state" and about["version"] == arrowstream._state.versions.STATE_VERSION, path
        assert about["saved_version"] == int(path.parent.name[1:]), path
        format_state(about)
        if "next-epoch" in path.name:   # consumed counts the epochs before too
            assert about["epoch"] == 1 and 0 < about["batches"] < case["consumed"], path
        elif about["kind"] == "arrowstream.loader":
            skipped = sum(skip["batches"] for skip in case["state"].get("skips", []))   # read, not yielded
            assert about["batches"] == case["consumed"] + skipped, path
        elif case["consumed"]:   # a merged checkpoint: each rank had consumed as many (0: taken by another topology)
            assert {rank["batches"] for rank in about["ranks"]} == {case["consumed"]}, path


GOLDEN = Path(__file__).parent / "golden"


def _dataset_golden() -> list[Path]:
    """The golden states of a dataset (``v<N>/<case>.json``; from v12 a mixture's are beside them, ``mixture-*``),
    but those of ``order="canonical"`` (from v13, ``canonical*``), whose workers each give a part of every batch
    (test_a_canonical_golden_state_is_described)."""
    return sorted(p for p in GOLDEN.glob("v*/*.json") if not p.name.startswith(("mixture-", "canonical")))


@pytest.mark.parametrize("path", sorted(GOLDEN.glob("v*/canonical*.json")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_canonical_golden_state_is_described(path):
    """A golden state of order="canonical": its epoch, version, canonical slots and the global batch they stand at
    (the batches its run had handed out in that epoch)."""
    case = json.loads(path.read_text())
    about = describe_state(case["state"])
    assert about["epoch"] == case["epoch"] and about["saved_version"] == int(path.parent.name[1:])
    assert about["order"] == "canonical" and about["canonical"]["slots"] == case["options"]["canonical_slots"]
    if case["consumed"]:
        assert about["canonical"]["global_batch"] == case["consumed"], path


@pytest.mark.parametrize("path", _dataset_golden(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_dataset_states_show_their_epoch_rows_and_workers(path):
    """Each golden state of every version: its epoch, its rows (checked against the rows the golden run yielded
    after it: together, every row of the epochs left once), and each worker's counters (rows in whole batches
    but for its last; with 2 workers handing out one batch each in turn, each worker's batches)."""
    case = json.loads(path.read_text())
    about = describe_state(case["state"])
    batch_size = case["options"]["batch_size"]
    assert about["epoch"] == case["epoch"] and about["saved_version"] == int(path.parent.name[1:])
    assert about["topology"]["num_workers"] == case["num_workers"]
    for rank in about["ranks"]:
        assert len(rank["workers"]) == max(case["num_workers"], 1)
        current = [w for w in rank["workers"] if w["epoch"] == rank["epoch"]]
        if rank.get("dynamic") is None:   # a dynamic rank counts its rows from the ledger
            assert rank["rows"] == sum(w["rows"] for w in current)
        assert rank["batches"] == sum(w["batches"] for w in current)
        for worker in current:
            full = worker["batches"] * batch_size   # whole batches, but for its last (the end of its share)
            assert worker["rows"] == full == 0 or full - batch_size < worker["rows"] <= full
    whole = about["topology"]["ranks_in_state"] == about["topology"]["world_size"]
    if whole and about["elastic"] is None and case["options"].get("world_size", 1) == 1:
        epochs_left = case["epochs"][-1] + 1 - case["epoch"]
        pending = sum(rank["pending_skip"] for rank in about["ranks"]) * batch_size   # skipped on resume
        yielded = sum(len(batch) for batch in case["continuation_ids"])
        assert about["rows"] + pending + yielded == about["data"]["num_rows"] * epochs_left
        if about["epoch_rows"] is not None:
            assert about["share"] == pytest.approx(about["rows"] / about["epoch_rows"])
    if about["elastic"] is not None:   # counts from the re-plan: no share of the epoch
        assert about["share"] is None and "re-planned" in about["share_note"]
    if case["num_workers"] == 2 and about["topology"]["batches_per_transfer"] == 1 and "next-epoch" not in path.name:
        batches = [w["batches"] for w in about["ranks"][0]["workers"]]   # one batch of each worker in turn
        assert batches == [len(range(w, case["consumed"], 2)) for w in range(2)]
    text = format_state(about)
    assert f"epoch {about['epoch']}: {about['rows']:,} rows in {about['batches']:,} batches consumed" in text


@pytest.mark.parametrize("path", sorted([*GOLDEN.glob("mixture-v*/*.json"), *GOLDEN.glob("v*/mixture-*.json")]), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_mixture_states_show_their_epoch_sources_and_workers(path):
    """Each golden mixture state of every version: its epoch, its saved worker-state version, each source's
    rows taken (with the rows of that source the golden run yielded after it: its quota in every epoch left),
    and each worker's rows per source."""
    case = json.loads(path.read_text())
    about = describe_state(case["state"])
    mix = about["mixture"]
    # the retired loader kind holds those of mixture-v<N>/ (mixture-v<N>-state-v<M>/ and v<M>/: the one loader kind)
    version, retired = golden_worker_version(str(path)), re.fullmatch(r"mixture-v\d+", path.parent.name) is not None
    assert (about["epoch"], about["source"], mix["saved_state_version"]) == (case["epoch"], "mixture", version)
    assert (about["kind"], about["reads"], about["version"]) == (
        "arrowstream.checkpoint" if "ranks" in case["state"] else "arrowstream.loader", "mixture",
        arrowstream._state.versions.STATE_VERSION)
    assert (about["saved_kind"], about["saved_version"]) == (
        ("arrowstream.mixture_loader", 1) if retired else (case["state"]["kind"], case["state"]["version"]))
    assert about["topology"]["num_workers"] == case["num_workers"]
    assert (", saved as arrowstream.mixture_loader version 1 " in format_state(about)) == retired
    ranks = about["ranks"]
    assert len(ranks) == case["options"].get("world_size", 1)
    for rank in ranks:
        assert len(rank["workers"]) == max(case["num_workers"], 1)
        for worker in rank["workers"]:
            assert sum(worker["sources"].values()) == worker["rows"]
        canonical = case["options"].get("order") == "canonical"   # each worker gives its part of every batch
        part = 8 // max(case["num_workers"], 1) if canonical else 8
        if canonical:
            assert about["canonical"]["slots"] == case["options"]["canonical_slots"]
            assert rank["batches"] == about["canonical"]["global_batch"] == rank["workers"][0]["batches"]
        for worker in rank["workers"]:   # batch_size 8: whole batches, but for a worker's last of the epoch
            full = part * worker["batches"]
            assert worker["rows"] == full if not worker["epoch_complete"] else full - 8 < worker["rows"] <= full
    assert about["rows"] == sum(r["rows"] for r in ranks) == sum(source["rows"] for source in mix["sources"].values())
    assert mix["epoch_rows"] == case["options"].get("epoch_rows", 90)
    if mix["replanned"] and "twice" in path.name:   # from 2 workers to 3, then from a checkpoint inside it to 1
        assert about["elastic"] == {"epoch": 0, "old_world_size": 1, "old_num_workers": 3, "old_workers": 3,
                                    "old_workers_done": 0, "replans": 2}
        assert about["share"] is None and "re-planned" in about["share_note"]
        return
    if mix["replanned"]:   # rows count from the re-plan (from 2 workers to 3): no share of the epoch
        assert about["elastic"] == {"epoch": 0, "old_world_size": 1, "old_num_workers": 2, "old_workers": 2,
                                    "old_workers_done": 0, "replans": 1}
        assert about["share"] is None and "re-planned" in about["share_note"]
        return
    if len(ranks) > 1:   # every rank in the state: the whole epoch's share (the continuation is one rank's)
        assert about["share"] == pytest.approx(about["rows"] / mix["epoch_rows"])
        assert "of a mixture, format version" in format_state(about)
        return
    [rank] = ranks
    epochs_left = case["epochs"][-1] + 1 - case["epoch"]
    for name, source in mix["sources"].items():
        later = sum(batch[0].count(name) for batch in case["continuation"])
        assert source["rows"] + later == source["quota"] * epochs_left, name
    assert about["share"] == (1.0 if rank["epoch_over"] else pytest.approx(about["rows"] / mix["epoch_rows"]))
    text = format_state(about)
    assert f"epoch {about['epoch']}: {about['rows']:,} rows in {about['batches']:,} batches consumed" in text
    assert all(f"  {name}: weight" in text for name in mix["sources"])


CANONICAL = {"order": "canonical", "canonical_slots": 8, "shuffle": True, "seed": 3, "shuffle_buffer_size": 30,
             "interleave": 2}


def canonical_worker_states(state):
    """Every worker state (a dict) of a loader state or a merged checkpoint, by (rank, worker)."""
    found = {}
    for outer in state.get("ranks", [state]):
        loader = outer["dataloader"]
        snapshots = loader["_snapshot"]["_worker_snapshots"] if "_snapshot" in loader else {"worker_0": loader}
        for name, snapshot in snapshots.items():
            found[outer["rank"], int(name.split("_")[1])] = snapshot["dataset_state"]
    return found


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_canonical_state_and_checkpoint_show_their_canonical_slots(folder, num_workers, tmp_path, capsys):
    """order="canonical": the order, the canonical slots (each at the global batch they stand at, their rows in runs),
    each rank's batches (its workers give a part of each), each worker's canonical slots; with the data, each
    canonical slot's rows of the epoch. One rank of batch 16 and a merged checkpoint of 2 ranks of batch 8: the same
    global batches, the same canonical slots' rows."""
    loader, dataset = StructuredDataset.create_dataloader(path=folder, num_workers=num_workers, batch_size=16,
                                                          **CANONICAL)
    batches = iter(loader)
    rows = take(batches, 3)
    about = describe_state(json_roundtrip(loader.state_dict()))
    assert (about["order"], about["epoch"], about["rows"], about["batches"]) == ("canonical", 0, rows, 3) and rows == 48
    canonical = about["canonical"]
    assert {k: canonical[k] for k in ("slots", "chunk", "epoch", "global_batch", "slots_in_state")} == {
        "slots": 8, "chunk": 2, "epoch": 0, "global_batch": 3, "slots_in_state": 8}
    assert canonical["rows"] == [6] * 8 and canonical["epoch_rows"] is None
    [rank] = about["ranks"]
    assert (rank["rows"], rank["batches"]) == (48, 3)
    per_worker = 8 // max(num_workers, 1)
    assert [(w["canonical_slots"], w["rows"], w["batches"]) for w in rank["workers"]] == [
        ([w * per_worker, (w + 1) * per_worker - 1], 6 * per_worker, 3) for w in range(max(num_workers, 1))]
    assert about["share"] is None and "canonical slots'" in about["share_note"]
    text = format_state(about)
    assert ("order: canonical, 8 canonical slots of 2 rows per global batch; they stand at global batch 3 of "
            "epoch 0 (8 of 8 in this state)") in text
    assert "  rows consumed per canonical slot: 0-7: 6\n" in text
    assert f"worker {max(num_workers, 1) - 1}: epoch 0, {6 * per_worker} rows, 3 batches, 0 dropped, canonical slots " \
           f"{8 - per_worker}-7" in text
    known = describe_state(loader.state_dict(), dataset=dataset)
    epoch_rows = known["canonical"]["epoch_rows"]
    whole = StructuredDataset.create_dataloader(path=folder, batch_size=16, **CANONICAL)[0]   # an epoch, read
    yielded = sum(len(b["id"]) for b in whole)
    # 230 rows over 8 canonical slots: 28 or 29 each, 14 chunks of 2 each (even batches): 6 rows trimmed
    assert sum(epoch_rows) == known["epoch_rows"] == yielded == 224 and epoch_rows == [28] * 8
    assert known["share"] == pytest.approx(48 / 224)
    assert "rows of the epoch per canonical slot: " in format_state(known)

    states, datasets = [], []
    for rank_index in (0, 1):
        loader, dataset = StructuredDataset.create_dataloader(path=folder, num_workers=num_workers, batch_size=8,
                                                              rank=rank_index, world_size=2, **CANONICAL)
        batches = iter(loader)
        take(batches, 3)
        states.append(loader.state_dict())
        datasets.append(dataset)
    merged = arrowstream.merge_state_dicts(states)
    about = describe_state(merged)
    assert about["canonical"]["rows"] == [6] * 8 and about["canonical"]["global_batch"] == 3
    assert [(r["rank"], r["rows"], r["batches"]) for r in about["ranks"]] == [(0, 24, 3), (1, 24, 3)]
    assert [w["canonical_slots"][0] for r in about["ranks"] for w in r["workers"]] == list(range(0, 8, per_worker // 2))
    known = describe_state(merged, dataset=datasets[0])
    assert known["canonical"]["epoch_rows"] == epoch_rows and known["share"] == pytest.approx(48 / 224)
    assert [r["epoch_rows"] for r in known["ranks"]] == [sum(epoch_rows[:4]), sum(epoch_rows[4:])]
    path = tmp_path / "ckpt.pt"
    torch.save({"loader": merged}, path)
    assert cli.main(["state", "show", str(path), "--path", folder]) == 0   # built with the run's canonical order
    text = capsys.readouterr().out
    assert "epoch 0: 48 rows in 6 batches consumed, 21.4% of 224 rows\n" in text
    assert "rank 1: epoch 0, 24 rows in 3 batches, 21.4% of 112 rows" in text
    assert "  rows of the epoch per canonical slot: 0-7: 28\n" in text
    one_rank = describe_state(states[1])   # one rank's state: its canonical slots, the others unknown
    assert one_rank["canonical"]["rows"] == [None] * 4 + [6] * 4 and one_rank["canonical"]["slots_in_state"] == 4
    assert "rows consumed per canonical slot: 0-3: ?, 4-7: 6" in format_state(one_rank)
    with pytest.raises(StateMismatchError, match="order='canonical', canonical_slots=8, the dataset has "
                                                 "order='topology'"):
        describe_state(merged, dataset=loader_of(folder, rank=0, world_size=2)[1])


def test_sixty_four_canonical_slots_are_one_line(folder):
    loader, _ = StructuredDataset.create_dataloader(path=folder, batch_size=64, **{**CANONICAL, "canonical_slots": 64})
    batches = iter(loader)
    take(batches, 2)
    text = format_state(describe_state(loader.state_dict()))
    assert "rows consumed per canonical slot: 0-63: 2\n" in text and "worker 0: epoch 0, 128 rows, 2 batches" in text
    assert len(text.splitlines()) < 15


def test_tampered_canonical_states_are_refused(folder):
    """Canonical slots that do not move together, or sit where the topology does not read them: a StateError
    naming them (loading the checkpoint on rank 1 refuses them too: the last, for the canonical slots it lacks)."""
    states = []
    for rank_index in (0, 1):
        loader, _ = StructuredDataset.create_dataloader(path=folder, num_workers=2, batch_size=8, rank=rank_index,
                                                        world_size=2, **CANONICAL)
        batches = iter(loader)
        take(batches, 3)
        states.append(loader.state_dict())
        loader._iterator._shutdown_workers()
    merged = json_roundtrip(arrowstream.merge_state_dicts(states))

    def changed(edit):
        copy = json_roundtrip(merged)
        edit(canonical_worker_states(copy))
        return copy

    def one_batch_on(workers):   # rank 1 worker 0 a batch further, its head and its canonical slots alike
        worker = workers[1, 0]
        for state in (worker, *worker["canonical"]["states"]):
            state["counters"]["batches"] += 1

    def inner_only(workers):     # one canonical slot of a worker a batch further than the worker
        workers[0, 1]["canonical"]["states"][0]["counters"]["batches"] += 1

    def moved(workers):          # rank 1 worker 1 holds the canonical slots of rank 1 worker 0
        workers[1, 1]["canonical"] = json_roundtrip(workers[1, 0]["canonical"])

    cases = [(one_batch_on, ("stand at different (epoch, global batch): rank 0 worker 0, rank 0 worker 1, rank 1 "
                            "worker 1 at epoch 0, global batch 3; rank 1 worker 0 at epoch 0, global batch 4")),
             (inner_only, ("rank 0 worker 1 state.canonical.states[0] stands at epoch 0, batch 4, the worker at "
                          "epoch 0, batch 3")),
             (moved, ("rank 1 worker 1 state holds canonical slots 4-5 of 8, but its slot (rank 1 of 2, worker 1 of "
                     "2) reads canonical slots 6-7"))]
    fresh, _ = StructuredDataset.create_dataloader(path=folder, num_workers=2, batch_size=8, rank=1, world_size=2,
                                                   **CANONICAL)   # rank 1: it reads the canonical slots moved
    for edit, named in cases:
        bad = changed(edit)
        with pytest.raises(StateError, match=re.escape(named)):
            describe_state(bad)
        with pytest.raises(StateError):
            fresh.load_state_dict(bad)
