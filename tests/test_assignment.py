"""The assignment policies (``arrowstream._assignment``): one registry by name, asked instead of tested by name."""

from __future__ import annotations

import ast
import inspect
import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrowstream import StructuredDataset
from arrowstream._assignment import ASSIGNMENTS, Assignment
from arrowstream._assignment.dynamic import DynamicAssignment
from arrowstream._assignment.static import StaticAssignment

PACKAGE_DIR = os.path.join(os.path.dirname(__file__), "..", "arrowstream")
POLICY_FOLDER = "_assignment/"   # the policies and their registry: every module there may name them
KNOWN: set[tuple[str, str]] = set()   # comparisons that stay, each with its owner: none left


def protocol_members() -> set[str]:
    return {name for name, value in vars(Assignment).items()
            if not name.startswith("_") and (callable(value) or name in Assignment.__annotations__)} \
        | set(Assignment.__annotations__)


@pytest.mark.parametrize("name,policy", list(ASSIGNMENTS.items()))
def test_every_registered_policy_answers_the_protocol_under_its_own_name(name, policy):
    assert policy.name == name
    missing = {m for m in protocol_members() if not hasattr(policy, m)}
    assert missing == set()
    for member in protocol_members():
        value = getattr(Assignment, member, None)
        if callable(value):
            assert inspect.signature(getattr(type(policy), member)).parameters.keys() \
                == inspect.signature(value).parameters.keys(), member


def test_the_option_values_are_the_registered_names():
    assert list(ASSIGNMENTS) == ["static", "dynamic"]
    assert isinstance(ASSIGNMENTS["static"], StaticAssignment)
    assert isinstance(ASSIGNMENTS["dynamic"], DynamicAssignment)


def _policy_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and node.value in ASSIGNMENTS:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for elt in node.elts for n in _policy_names(elt)]
    return []


def _is_assignment(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("assignment", "_assignment")
    if isinstance(node, ast.Attribute):
        return node.attr in ("assignment", "_assignment")
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "assignment"


def assignment_knowledge(tree: ast.Module) -> set[str]:
    """What a module outside the policies knows of them by name: ``DYNAMIC``-like constants, comparisons of an
    ``assignment`` with a policy's name."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_assignment(side) for side in sides):
                found.update(f"compares assignment with {name!r}" for side in sides for name in _policy_names(side))
        elif isinstance(node, ast.Name) and node.id in ("DYNAMIC", "STATIC"):
            found.add(f"names {node.id}")
        elif isinstance(node, ast.alias) and node.name in ("DYNAMIC", "STATIC"):
            found.add(f"names {node.name}")
    return found


def test_no_module_outside_the_policies_tests_an_assignment_by_name():
    leaks = set()
    for folder, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            relative = os.path.relpath(os.path.join(folder, name), PACKAGE_DIR).replace(os.sep, "/")
            if not name.endswith(".py") or relative.startswith(POLICY_FOLDER):
                continue
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                leaks.update((relative, what) for what in assignment_knowledge(ast.parse(f.read(), relative)))
    assert leaks - KNOWN == set(), f"ask the dataset's policy (arrowstream/_assignment/) instead: {sorted(leaks)}"
    assert KNOWN - leaks == set(), f"fixed, so remove them from KNOWN: {sorted(KNOWN - leaks)}"


@pytest.mark.parametrize("source, leak", [
    ("if dataset._assignment == DYNAMIC: pass", "names DYNAMIC"),
    ('dynamic = kwargs.get("x").assignment != "dynamic"', "compares assignment with 'dynamic'"),
    ('ok = options["assignment"] in ("static", "dynamic")', "compares assignment with 'static'"),
])
def test_the_check_sees_what_it_looks_for(source, leak):
    assert leak in assignment_knowledge(ast.parse(source))


def test_a_new_policy_is_one_registry_line(tmp_path, monkeypatch):
    """A policy registered under a new name is taken by the dataset and asked by its loader: here one that reads
    as static does, counted when it lays out an epoch's batches."""
    asked: list[str] = []

    class Counted(StaticAssignment):
        name = "counted"

        def num_batches(self, dataset: Any, num_workers: int) -> int:
            asked.append("num_batches")
            return super().num_batches(dataset, num_workers)

    monkeypatch.setitem(ASSIGNMENTS, "counted", Counted())
    pq.write_table(pa.table({"id": list(range(100))}), tmp_path / "part.parquet", row_group_size=10)
    loader, _ = StructuredDataset.create_dataloader(str(tmp_path), batch_size=8, assignment="counted",
                                                    plan_cache=False, shuffle=True)
    assert len(loader) == 13 and asked == ["num_batches"]
    assert sorted(int(i) for batch in loader for i in batch["id"]) == list(range(100))


def _rows(tmp_path, count: int = 100) -> str:
    pq.write_table(pa.table({"id": list(range(count))}), tmp_path / "part.parquet", row_group_size=10)
    return str(tmp_path)


def test_each_dataset_owns_its_policy_and_the_policy_its_state(tmp_path):
    """A policy is made per dataset and holds what only it uses (the dynamic one: its epochs, the workers' lease
    pool and the loader's); the dataset and its loader hold none of it, and a loaded ledger forgets the leases."""
    path = _rows(tmp_path)
    loader, dataset = StructuredDataset.create_dataloader(path, batch_size=8, num_workers=2, assignment="dynamic",
                                                          plan_cache=False)
    other = StructuredDataset(path, batch_size=8, assignment="dynamic", plan_cache=False)
    assert type(dataset.policy) is DynamicAssignment and dataset.policy is not other.policy
    assert dataset.policy is not ASSIGNMENTS["dynamic"]
    assert not {"_dynamic", "_pool"} & set(vars(dataset)) and "_pool" not in vars(loader)
    assert dataset.policy.pool is None
    assert sorted(int(i) for batch in loader for i in batch["id"]) == list(range(100))
    pool = dataset.policy.pool
    assert pool is not None and pool.epoch == 0 and len(pool) > 0 and other.policy.pool is None
    assert len(dataset.policy.epochs.leases(0, 2, pool.pieces)) == len(pool)
    loader.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert dataset.policy.pool is None   # the leases of before say nothing of the loaded rest


def test_the_layouts_and_inspect_ask_the_policy_which_slot_reads_what(tmp_path, monkeypatch):
    """The epoch layout a dataset reads by and ``arrowstream inspect``'s report both come from the policy's
    ``assign``: here one that reads as static does, traced."""
    from arrowstream._tools.inspect import describe

    asked: list[int] = []

    class Traced(StaticAssignment):
        name = "traced"

        def assign(self, weights: Any, num_slots: int) -> list[list[int]]:
            asked.append(num_slots)
            return super().assign(weights, num_slots)

    monkeypatch.setitem(ASSIGNMENTS, "traced", Traced())
    path = _rows(tmp_path)
    dataset = StructuredDataset(path, batch_size=8, assignment="traced", rank=0, world_size=2, plan_locally=True,
                                plan_cache=False)
    rows = sorted(int(i) for batch in dataset for i in batch["id"])
    assert asked and set(asked) == {2} and len(rows) == dataset.slot_rows(0)[0]
    report = describe(dataset, 2)
    assert asked[-1] == 4 and sum(slot["splits"] for slot in report["slots"]) == dataset.num_splits(2)


@pytest.mark.filterwarnings("ignore::arrowstream.TrimWarning")   # unequal splits: even_batches trims a lot
def test_slot_rows_and_batch_limits_are_the_rows_each_slot_reads_under_the_policys_assign(tmp_path, monkeypatch):
    """``dataset.slot_rows``, ``batch_limits`` and ``slot_yields`` come from the epoch layout, given out by the
    policy's ``assign`` (one source of truth): under round robin, whose slots' rows change with the epoch's order,
    they are the rows and batches each (rank) slot reads and yields, epoch by epoch."""

    class RoundRobin(StaticAssignment):
        name = "round_robin"

        def assign(self, weights: Any, num_slots: int) -> list[list[int]]:
            return [list(range(slot, len(weights), num_slots)) for slot in range(num_slots)]

    monkeypatch.setitem(ASSIGNMENTS, "round_robin", RoundRobin())
    sizes, start = [5, 40, 7, 33, 12, 25, 9], 0
    for index, size in enumerate(sizes):   # one row group each: seven splits of unequal rows
        pq.write_table(pa.table({"id": list(range(start, start + size))}), tmp_path / f"part-{index}.parquet")
        start += size
    world_size, batch_size = 3, 4

    def dataset_of(rank: int) -> StructuredDataset:
        return StructuredDataset(str(tmp_path), batch_size=batch_size, assignment="round_robin", shuffle=True, seed=1,
                                 rank=rank, world_size=world_size, plan_locally=True, plan_cache=False)

    seen_orders = set()
    for epoch in range(3):
        read, yielded = [], []
        for rank in range(world_size):
            dataset = dataset_of(rank)
            dataset.set_epoch(epoch)
            batches = [len(batch["id"]) for batch in dataset]
            whole = StructuredDataset(   # even_batches off: every row of the slot
                                      str(tmp_path), batch_size=batch_size, assignment="round_robin", shuffle=True,
                                      seed=1, rank=rank, world_size=world_size, plan_locally=True, plan_cache=False,
                                      even_batches=False)
            whole.set_epoch(epoch)
            read.append(sum(len(batch["id"]) for batch in whole))
            yielded.append((len(batches), sum(batches)))
        assert dataset.slot_rows(0) == read, f"epoch {epoch}"
        limits = dataset.batch_limits(0)
        assert limits is not None and [count for count, _ in yielded] == limits
        assert [(rows, count, kept) for rows, count, kept in dataset.slot_yields(0)] == \
               [(rows, count, kept) for rows, (count, kept) in zip(read, yielded, strict=True)]
        seen_orders.add(tuple(read))
    assert sum(read) == sum(sizes)
    assert len(seen_orders) > 1   # round robin's rows per slot follow the epoch's order (LPT's never do)
