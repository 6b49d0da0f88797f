"""Several ranks for real (guarantees 1, 2, 9 and the Distribution section of DESIGN.md).

Each test starts ``torchrun`` with the gloo backend on 127.0.0.1; every rank runs
``dist_child.py`` and writes what it read. Checked here: ranks read disjoint rows, every row
is read or counted as trimmed, every rank yields the same number of batches (and trains a DDP
model on each, which would hang otherwise), and a merged checkpoint resumes every rank exactly.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pytest
from helpers import ids_of, make_loader, write_dataset

HERE = os.path.dirname(__file__)

# skewed: one big file, small ones; 5,950 rows in row groups of 50 to 1,000
SKEWED = [(3000, 1000), (200, 100), (50, 50), (1700, 300), (1000, 500)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(nproc: int, spec: dict, tmp_path, script: str = "dist_child.py", timeout: int = 240,
             args: list[str] | None = None) -> list[dict]:
    """Run ``script`` on ``nproc`` ranks with ``args`` (default: a spec file) and an output folder;
    the per-rank results, by rank."""
    out_dir = tmp_path / f"out-{nproc}"
    out_dir.mkdir()
    if args is None:
        spec_file = tmp_path / f"spec-{nproc}.json"
        spec_file.write_text(json.dumps(spec))
        args = [str(spec_file)]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", os.path.join(HERE, script),
               *args, str(out_dir)]
    done = subprocess.run(command, check=False, env=env, cwd=HERE, timeout=timeout, capture_output=True, text=True)
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(nproc)]


def check_epoch(per_rank: list[dict], name: str, epoch: str, num_rows: int) -> None:
    """Disjoint rows, every row read or trimmed, equal batch counts equal to len(loader)."""
    results = [r[name] for r in per_rank]
    counts = Counter(i for r in results for batch in r["epochs"][epoch] for i in batch)
    assert max(counts.values()) == 1, f"{name}: a row was read twice in epoch {epoch}"
    trimmed = sum(r["trimmed"][epoch] for r in results)
    assert len(counts) + trimmed == num_rows, f"{name}: rows missing beyond the {trimmed} trimmed"
    assert set(counts) <= set(range(num_rows))
    batches = [len(r["epochs"][epoch]) for r in results]
    assert len(set(batches)) == 1, f"{name}: ranks yield {batches} batches in epoch {epoch}"
    assert batches[0] == results[0]["lens"][epoch], f"{name}: len(loader) is {results[0]['lens'][epoch]}, not {batches[0]}"


@pytest.mark.parametrize("world_size", [2, 3])  # 3: uneven ranks, more ranks than the tiny file has row groups
def test_ranks_read_disjoint_rows_in_equal_batches(tmp_path, world_size):
    skewed = write_dataset(tmp_path / "skewed", SKEWED)
    tiny = write_dataset(tmp_path / "tiny", [(500, 250)])  # one file, 2 row groups
    scenarios = []
    for num_workers in (0, 1, 2):
        options = {"batch_size": 64, "shuffle": True, "seed": 11}
        scenarios.append({"name": f"skewed-w{num_workers}", "path": skewed, "num_workers": num_workers,
                          "options": options, "epochs": [0, 1], "ddp": True})
    scenarios.append({"name": "skewed-buffer-interleave", "path": skewed, "num_workers": 2, "epochs": [0],
                      "options": {"batch_size": 50, "shuffle": True, "shuffle_buffer_size": 300, "interleave": 2},
                      "ddp": True})
    scenarios.append({"name": "skewed-drop-last", "path": skewed, "num_workers": 1, "epochs": [0],
                      "options": {"batch_size": 100, "drop_last": True}, "ddp": True})
    if world_size == 3:  # 2 row groups over 3 ranks x 2 workers: row ranges
        scenarios.append({"name": "tiny", "path": tiny, "num_workers": 2, "epochs": [0, 1],
                          "options": {"batch_size": 16, "shuffle": True}, "ddp": True})
        # without even_batches the ranks' counts differ: what DDP would hang on
        scenarios.append({"name": "uneven", "path": skewed, "num_workers": 0, "epochs": [0],
                          "options": {"batch_size": 64, "even_batches": False}})
    if world_size == 2:  # a local rank passed as if it were the global one
        scenarios.append({"name": "disagree", "path": skewed, "num_workers": 0, "expect_error": True,
                          "options": {"rank": 0, "world_size": 1}})
    if world_size == 4:  # two groups of two ranks (tensor parallel replicas) read the same rows
        scenarios.append({"name": "groups", "path": skewed, "num_workers": 1, "epochs": [0], "ddp": True,
                          "options": {"batch_size": 64, "shuffle": True, "group_size": 2}})
    scenarios.append({"name": "checkpoint", "path": skewed, "num_workers": 2, "epochs": [0, 1],
                      "options": {"batch_size": 64, "shuffle": True, "shuffle_buffer_size": 200},
                      "checkpoint": {"epoch": 0, "step": 7}})
    per_rank = torchrun(world_size, {"scenarios": scenarios}, tmp_path)
    for scenario in scenarios:
        if scenario["name"] == "disagree":
            for rank, r in enumerate(per_rank):
                assert r["disagree"]["error"] == "TopologyError"
                assert (f"explicit rank/world_size says rank 0 of 1, torch.distributed says rank {rank} of 2"
                        in r["disagree"]["message"])
            continue
        if scenario["name"] == "groups":
            results = [r["groups"] for r in per_rank]
            assert [(r["data_rank"], r["data_world_size"]) for r in results] == [(0, 2), (0, 2), (1, 2), (1, 2)]
            assert results[0]["epochs"] == results[1]["epochs"] and results[2]["epochs"] == results[3]["epochs"]
            check_epoch([per_rank[0], per_rank[2]], "groups", "0", sum(rows for rows, _ in SKEWED))
            continue
        if scenario["name"] == "uneven":
            counts = [len(r["uneven"]["epochs"]["0"]) for r in per_rank]
            assert len(set(counts)) > 1 and [r["uneven"]["len"] for r in per_rank] == counts
            assert all(r["uneven"]["rows_trimmed"] == 0 for r in per_rank)
            continue
        if scenario.get("checkpoint"):
            for r in per_rank:
                ours = r[scenario["name"]]
                reference = [b for e in ("0", "1") for b in ours["epochs"][e]][7:]
                assert [b for e in ("0", "1") for b in ours["resumed"][e]] == reference
        num_rows = 500 if scenario["name"] == "tiny" else sum(rows for rows, _ in SKEWED)
        for epoch in map(str, scenario["epochs"]):
            if scenario["options"].get("drop_last"):
                results = [r[scenario["name"]] for r in per_rank]
                counts = Counter(i for r in results for b in r["epochs"][epoch] for i in b)
                assert max(counts.values()) == 1 and len({len(r["epochs"][epoch]) for r in results}) == 1
                assert all(len(b) == 100 for r in results for b in r["epochs"][epoch])
                continue
            check_epoch(per_rank, scenario["name"], epoch, num_rows)
    first = per_rank[0]["skewed-w2"]["epochs"]
    assert first["0"] != first["1"], "each epoch is shuffled anew"



def test_accelerate_recipe_inside_torchrun(tmp_path):
    """DESIGN's Distribution section: Accelerate must neither re-shard nor broadcast our batches."""
    skewed = write_dataset(tmp_path / "skewed", SKEWED)
    per_rank = torchrun(2, {}, tmp_path, script="accelerate_child.py", args=[skewed])
    num_rows = sum(rows for rows, _ in SKEWED)
    assert [(r["rank"], r["world_size"]) for r in per_rank] == [(0, 2), (1, 2)]
    # the recipe: disjoint rows, all of them (or counted as trimmed), equal steps
    counts = Counter(i for r in per_rank for b in r["recipe"] for i in b)
    assert max(counts.values()) == 1
    assert len(counts) + sum(r["rows_trimmed"] for r in per_rank) == num_rows
    assert len(per_rank[0]["recipe"]) == len(per_rank[1]["recipe"]) == per_rank[0]["len"]
    # prepare(loader) re-shards rank-aware batches: most rows are never seen (why the recipe avoids it)
    prepared = Counter(i for r in per_rank for b in r["prepared"] for i in b)
    print("rows seen through accelerator.prepare(loader):", len(prepared), "of", num_rows)
    assert len(prepared) < len(counts)


@pytest.mark.timeout(180)
def test_ranks_agree_or_stop_and_no_hidden_collective(tmp_path):
    """Issue 17: building a dataset is a collective with a bounded wait. One torchrun of 3 ranks:

    - one rank with another seed, batch_size, path, columns, group_size, drop_last, output_format, or
      Iceberg snapshot: a TopologyError on every rank naming the option, rank 0's value and rank 1's;
    - a dataset on rank 0 alone: with plan_locally=True (rank=0, world_size=1) it reads every row;
      without it, rank 0 raises within the handshake timeout (2 s here) naming the missing ranks;
      on ranks 0 and 1 only, both raise naming rank 2; on rank 1 alone, it names rank 0;
    - after all of that the ranks still meet: a dataset of all ranks reads every row once, with DDP.
    """
    skewed = write_dataset(tmp_path / "skewed", SKEWED)
    tiny = write_dataset(tmp_path / "tiny", [(500, 250)])
    num_rows = sum(rows for rows, _ in SKEWED)
    base = {"batch_size": 64, "shuffle": True, "seed": 1}
    differing = {"seed": (1, 2), "batch_size": (64, 32), "columns": (None, ["id", "x"]), "group_size": (1, 3),
                 "drop_last": (False, True), "output_format": ("torch", "numpy")}
    scenarios = [{"name": f"differ-{option}", "path": skewed, "num_workers": 0, "expect_error": True,
                  "options": {**base, option: ours}, "rank_options": {"1": {option: theirs}}}
                 for option, (ours, theirs) in differing.items()]
    scenarios.append({"name": "differ-path", "path": skewed, "rank_paths": {"1": tiny}, "num_workers": 0,
                      "expect_error": True, "options": base})
    # Iceberg: rank 1 pinned to the first snapshot, the others on the latest (as around a commit)
    from iceberg_tables import make_catalog

    catalog, config = make_catalog(str(tmp_path / "iceberg"))
    events = catalog.create_table("db.events", schema=pa.schema([("id", pa.int64())]))
    events.append(pa.table({"id": pa.array(range(100), pa.int64())}))
    first = events.current_snapshot().snapshot_id
    events.append(pa.table({"id": pa.array(range(100, 150), pa.int64())}))
    latest = events.current_snapshot().snapshot_id
    scenarios.append({"name": "differ-snapshot_id", "iceberg": {"table": "db.events", "catalog_config": config},
                      "num_workers": 0, "expect_error": True, "options": base,
                      "rank_options": {"1": {"snapshot_id": first}}})
    scenarios += [
        {"name": "rank0-locally", "ranks": [0], "path": skewed, "num_workers": 1, "epochs": [0],
         "options": {**base, "rank": 0, "world_size": 1, "plan_locally": True}},
        {"name": "rank0-alone", "ranks": [0], "path": skewed, "num_workers": 0, "expect_error": True, "options": base},
        {"name": "ranks01", "ranks": [0, 1], "path": skewed, "num_workers": 0, "expect_error": True, "options": base},
        {"name": "rank1-alone", "ranks": [1], "path": skewed, "num_workers": 0, "expect_error": True, "options": base},
        {"name": "together", "path": skewed, "num_workers": 1, "epochs": [0], "options": base, "ddp": True},
    ]
    spec = {"scenarios": scenarios, "environment": {"ARROWSTREAM_HANDSHAKE_TIMEOUT": "2"}, "handshakes": True}
    per_rank = torchrun(3, spec, tmp_path, timeout=150)

    def shown(value):
        return json.dumps(value, separators=(",", ":"))

    for option, (ours, theirs) in [*differing.items(), ("path", (skewed, tiny)), ("snapshot_id", (latest, first))]:
        for r in per_rank:
            result = r[f"differ-{option}"]
            assert result["error"] == "TopologyError", (option, result)
            assert f"{option} is {shown(ours)} on rank 0 but {shown(theirs)} on rank 1" in result["message"]
            assert "rank 2" not in result["message"]  # rank 2 agrees with rank 0
    # evaluation on rank 0: every row there, nothing on the others
    local = per_rank[0]["rank0-locally"]
    assert (local["data_rank"], local["data_world_size"]) == (0, 1)
    assert sorted(i for batch in local["epochs"]["0"] for i in batch) == list(range(num_rows))
    assert per_rank[1]["rank0-locally"] == per_rank[2]["rank0-locally"] == {"skipped": True}
    # a dataset not every rank builds: a clear error within the bound, never a hang
    missing = [("rank0-alone", 0, "built on rank 0 under torch.distributed, but rank(s) [1, 2] did not build one"),
               ("ranks01", 0, "built on ranks [0, 1] under torch.distributed, but rank(s) [2] did not build one"),
               ("ranks01", 1, "built on ranks [0, 1] under torch.distributed, but rank(s) [2] did not build one"),
               ("rank1-alone", 1, "rank 1 built a dataset under torch.distributed, but rank 0 did not build one")]
    for name, rank, words in missing:
        result = per_rank[rank][name]
        assert result["error"] == "TopologyError" and words in result["message"], (name, rank, result)
        assert "within 2 s" in result["message"] and "plan_locally=True" in result["message"]
        assert 1.5 < result["seconds"] < 30, (name, rank, result["seconds"])
    # the ranks still meet afterwards, under the same keys; only the handshakes of all ranks counted
    check_epoch(per_rank, "together", "0", num_rows)
    complete = len(differing) + 3  # path and snapshot_id differ too; then "together"
    assert [r["handshakes"] for r in per_rank] == [{"completed": complete, "left": []}] * 3


def test_handshake_timeout_and_fingerprint_values(monkeypatch, small_dataset):
    """The handshake's knob and how values are compared and shown (the handshake itself needs torchrun, above)."""
    import functools

    from arrowstream import StructuredDataset, errors
    from arrowstream._planning import collective as _collective
    from arrowstream._sources import files as _source

    assert _collective.handshake_timeout() == 300
    monkeypatch.setenv("ARROWSTREAM_HANDSHAKE_TIMEOUT", "2.5")
    assert _collective.handshake_timeout() == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("ARROWSTREAM_HANDSHAKE_TIMEOUT", bad)
        with pytest.raises(errors.InvalidArgumentError, match=f"ARROWSTREAM_HANDSHAKE_TIMEOUT='{bad}': expected seconds"):
            _collective.handshake_timeout()
    # long values are cut for the message but still compared whole
    one, other = _collective.show(["/data/" + "a" * 300]), _collective.show(["/data/" + "a" * 299 + "b"])
    assert one != other and len(one) < 130 and "(310 chars, sha256 " in one
    assert _collective._ranks(list(range(1, 1000))) == "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, ... (999 ranks)]"
    assert _source.path_names(["data/", "./data", "s3://bucket/data/"]) == ["data", "data", "s3://bucket/data"]
    # a callable by its name, never its repr (an address that differs by process)
    assert _collective.callable_name(ids_of) == "helpers.ids_of"
    assert _collective.callable_name(functools.partial(ids_of)) == "functools.partial"
    with pytest.raises(errors.ArgumentTypeError, match="plan_locally: expected True or False"):
        StructuredDataset(small_dataset, plan_locally="yes")


def test_merge_state_dicts_checks_every_rank(small_dataset):
    import arrowstream
    from arrowstream import errors

    def state(rank, world_size=2, **options):
        loader, _ = make_loader(small_dataset, 1, batch_size=16, rank=rank, world_size=world_size, **options)
        return loader.state_dict()

    merged = arrowstream.merge_state_dicts([state(1), state(0)])
    assert merged["kind"] == "arrowstream.checkpoint" and merged["world_size"] == 2
    assert [s["rank"] for s in merged["ranks"]] == [0, 1]
    assert json.loads(json.dumps(merged)) == merged
    with pytest.raises(errors.StateMismatchError, match=r"no state for rank\(s\) \[1\] of world_size=2"):
        arrowstream.merge_state_dicts([state(0)])
    with pytest.raises(errors.StateMismatchError, match="state 1 has num_workers=0, state 0 has num_workers=1"):
        loader, _ = make_loader(small_dataset, 0, batch_size=16, rank=1, world_size=2)
        arrowstream.merge_state_dicts([state(0), loader.state_dict()])
    with pytest.raises(errors.StateError, match="non-empty list"):
        arrowstream.merge_state_dicts([])

    # each rank takes its part; a state of one rank refuses another rank
    loader, _ = make_loader(small_dataset, 1, batch_size=16, rank=1, world_size=2)
    loader.load_state_dict(merged)
    with pytest.raises(errors.StateMismatchError, match="belongs to rank 0 of 2, this loader is rank 1 of 2"):
        loader.load_state_dict(state(0))
    # another world size re-plans the epoch (elastic resume, tested across torchrun below); one rank's
    # state of several cannot, and says what to load instead
    wider, _ = make_loader(small_dataset, 1, batch_size=16, rank=1, world_size=3)
    wider.load_state_dict(merged)
    expected = len(wider)
    assert expected > 0 and len(list(wider)) == expected
    with pytest.raises(errors.StateMismatchError, match="belongs to rank 1 of 2, this loader is rank 1 of 3"):
        wider.load_state_dict(state(1))
    other_workers, _ = make_loader(small_dataset, 2, batch_size=16, rank=1, world_size=2)
    with pytest.raises(errors.StateMismatchError, match="re-planning the epoch for other workers needs every rank"):
        other_workers.load_state_dict(state(1))


def test_rank_sources_must_agree(small_dataset, monkeypatch):
    from accelerate import Accelerator

    from arrowstream import StructuredDataset, errors

    accelerator = Accelerator(cpu=True)  # one process: rank 0 of 1
    assert StructuredDataset(small_dataset, accelerator=accelerator).world_size == 1
    with pytest.raises(errors.TopologyError, match="explicit rank/world_size says rank 1 of 2, accelerator says rank 0 of 1"):
        StructuredDataset(small_dataset, rank=1, world_size=2, accelerator=accelerator)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(errors.TopologyError, match="launched as one of WORLD_SIZE=4 processes .* not initialised"):
        StructuredDataset(small_dataset)
    assert StructuredDataset(small_dataset, rank=2, world_size=4).rank == 2


def test_even_batch_limits_are_minimal_and_even():
    from hypothesis import given
    from hypothesis import strategies as st

    from arrowstream._core.order import even_batch_limits, natural_batches, rows_yielded

    @given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 50), st.booleans(), st.data())
    def check(world_size, per_rank, batch_size, drop_last, data):
        rows = data.draw(st.lists(st.integers(0, 500), min_size=world_size * per_rank,
                                  max_size=world_size * per_rank))
        limits = even_batch_limits(rows, world_size, batch_size, drop_last)
        natural = [natural_batches(r, batch_size, drop_last) for r in rows]
        totals = [sum(limits[k * per_rank:(k + 1) * per_rank]) for k in range(world_size)]
        assert len(set(totals)) == 1
        assert totals[0] == min(sum(natural[k * per_rank:(k + 1) * per_rank]) for k in range(world_size))
        assert all(0 <= lim <= nat for lim, nat in zip(limits, natural))
        for r, lim in zip(rows, limits):
            kept = rows_yielded(r, lim, batch_size, drop_last)
            assert kept <= r and (lim == natural_batches(r, batch_size, drop_last) or kept == lim * batch_size)

    check()


def test_deepspeed_initialised_ranks(tmp_path):
    """DeepSpeed starts torch.distributed itself (``deepspeed.init_distributed``): ranks come from it."""
    skewed = write_dataset(tmp_path / "skewed", SKEWED)
    scenarios = [{"name": "deepspeed", "path": skewed, "num_workers": 1, "epochs": [0], "ddp": True,
                  "options": {"batch_size": 64, "shuffle": True}}]
    per_rank = torchrun(2, {"scenarios": scenarios, "launcher": "deepspeed"}, tmp_path)
    assert [r["deepspeed"]["data_rank"] for r in per_rank] == [0, 1]
    check_epoch(per_rank, "deepspeed", "0", sum(rows for rows, _ in SKEWED))


def test_horovod_ranks_through_a_substitute(tmp_path):
    """Horovod does not install here (0.28.1, its last release, fails to build against torch 2.13:
    it compiles as C++14). The processes are real; ``horovod.torch`` is a stand-in answering
    ``is_initialized``/``rank``/``size`` (all arrowstream calls) from torchrun's rank."""
    skewed = write_dataset(tmp_path / "skewed", SKEWED)
    scenarios = [{"name": "horovod", "path": skewed, "num_workers": 2, "epochs": [0],
                  "options": {"batch_size": 64, "shuffle": True}},
                 {"name": "horovod-disagrees", "path": skewed, "num_workers": 0, "expect_error": True,
                  "options": {"rank": 0, "world_size": 3}}]
    per_rank = torchrun(3, {"scenarios": scenarios, "launcher": "horovod"}, tmp_path)
    assert [r["horovod"]["data_rank"] for r in per_rank] == [0, 1, 2]
    check_epoch(per_rank, "horovod", "0", sum(rows for rows, _ in SKEWED))
    assert [r["horovod-disagrees"]["error"] for r in per_rank] == [None, "TopologyError", "TopologyError"]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (4, 2)])
def test_elastic_resume_across_world_sizes(tmp_path, old, new):
    """A checkpoint of ``old`` ranks (merged by gather_state_dict) resumes on ``new`` ranks: the rest
    of the epoch is re-planned, every row comes once, ranks stay even (DDP on every batch)."""
    skewed = write_dataset(tmp_path / "skewed", SKEWED)
    options = {"batch_size": 50, "shuffle": True, "seed": 5, "shuffle_buffer_size": 200, "interleave": 2}
    checkpoint_file = str(tmp_path / "merged.json")
    save = [{"name": "save", "path": skewed, "num_workers": 1, "options": options, "save_at": 6,
             "checkpoint_file": checkpoint_file}]
    saved = torchrun(old, {"scenarios": save}, tmp_path)
    load = [{"name": "load", "path": skewed, "num_workers": 2, "options": options, "load_from": checkpoint_file,
             "epochs": [0, 1], "ddp": True}]
    resumed = torchrun(new, {"scenarios": load}, tmp_path)
    num_rows = sum(rows for rows, _ in SKEWED)
    before = Counter(i for r in saved for b in r["save"]["before"] for i in b)
    after = Counter(i for r in resumed for b in r["load"]["epochs"]["0"] for i in b)
    assert max((before + after).values()) == 1, "a row came twice in the re-planned epoch"
    trimmed = sum(r["load"]["trimmed"]["0"] for r in resumed)
    assert len(before) + len(after) + trimmed == num_rows
    counts = [len(r["load"]["epochs"]["0"]) for r in resumed]
    assert len(set(counts)) == 1 and counts[0] == resumed[0]["load"]["lens"]["0"]
    check_epoch(resumed, "load", "1", num_rows)


# a few hundred rows in uneven files and row groups
CANONICAL_FILES = [(130, 40), (75, 25), (110, 50)]


def test_canonical_order_is_one_global_sequence_across_world_sizes(tmp_path):
    """Issue 39: with order="canonical", global batch k (every rank's k-th batch, ranks in rank order) holds the same
    rows in the same order on any topology that divides canonical_slots, the global batch fixed; a checkpoint of
    one topology continues that one sequence on another. 2 ranks x 2 workers (batch 16) save mid-epoch; 4 ranks x 1
    worker (batch 8) resume, read on and save again; 1 rank without workers (batch 32) resumes to the end of the
    epoch and reads the next: every step equals the single process's, every row once an epoch. (With
    order="topology" the 2-rank steps already differ from the single process's.)"""
    path = write_dataset(tmp_path / "data", CANONICAL_FILES)
    num_rows = sum(rows for rows, _ in CANONICAL_FILES)
    options = {"order": "canonical", "canonical_slots": 8, "shuffle": True, "seed": 3, "shuffle_buffer_size": 24,
               "interleave": 2}
    reference_loader, reference_dataset = make_loader(path, 0, batch_size=32, **options)
    reference = {}
    for epoch in (0, 1):
        reference_dataset.set_epoch(epoch)
        reference[epoch] = [ids_of(batch) for batch in reference_loader]
    for epoch, batches in reference.items():
        assert sorted(i for b in batches for i in b) == list(range(num_rows)), f"epoch {epoch}: not every row once"
    assert reference[0] != reference[1] and len(reference[0]) >= 8

    def steps(per_rank: list[dict]) -> list[list[int]]:
        """Each global step: the ranks' batches in rank order."""
        return [[i for rank in ranks for i in rank] for ranks in zip(*(r["save"]["before"] for r in per_rank),
                                                                    strict=True)]

    first, second = str(tmp_path / "at-3.json"), str(tmp_path / "at-6.json")
    saved = torchrun(2, {"scenarios": [{"name": "save", "path": path, "num_workers": 2, "save_at": 3,
                                        "checkpoint_file": first, "options": {**options, "batch_size": 16}}]},
                     tmp_path)
    assert steps(saved) == reference[0][:3], "2 ranks x 2 workers: not the single process's global batches"
    resaved = torchrun(4, {"scenarios": [{"name": "save", "path": path, "num_workers": 1, "save_at": 3,
                                          "load_from": first, "checkpoint_file": second,
                                          "options": {**options, "batch_size": 8}}]}, tmp_path)
    assert steps(resaved) == reference[0][3:6], "4 ranks resumed from 2: not the single process's global batches"
    with open(second) as f:
        checkpoint = json.load(f)
    assert checkpoint["kind"] == "arrowstream.checkpoint" and checkpoint["world_size"] == 4
    loader, dataset = make_loader(path, 0, batch_size=32, **options)
    loader.load_state_dict(checkpoint)
    resumed = {}
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        resumed[epoch] = [ids_of(batch) for batch in loader]
    assert resumed[0] == reference[0][6:], "1 rank resumed from 4: not the rest of the single process's epoch"
    assert resumed[1] == reference[1], "the next epoch differs"
    whole = steps(saved) + steps(resaved) + resumed[0]
    counts = Counter(i for batch in whole for i in batch)
    assert sorted(counts) == list(range(num_rows)) and max(counts.values()) == 1, "epoch 0 across 3 topologies"
