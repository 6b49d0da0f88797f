"""Write the golden states of a mixture: run once per state version, never rewritten.

The folder is named by the versions of the states inside: ``mixture-v<N>`` (1 to 4), mixture worker states of
version N in a mixture loader state of the retired kind ``"arrowstream.mixture_loader"`` version 1; from state
format version 11 on (one loader state kind and one merged checkpoint kind for a dataset and a mixture),
``mixture-v<N>-state-v<M>``, worker states of version N in an ``"arrowstream.loader"`` (or
``"arrowstream.checkpoint"``) of version M. From state format version 12 on (one worker state kind too: a
mixture's worker states are ``"arrowstream.worker"`` with ``reads: "mixture"``, of the state's version) they are
written beside the dataset's, as ``v<M>/mixture-<case>.json``.

The two sources are the fixture folders ``data`` and ``data-cut`` (their recorded modification times make
the data fingerprint the same on every machine)."""

from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from make_golden import prepare_copy

MIXTURE = {"weights": {"a": 2, "b": 1}, "epoch_rows": 90, "batch_size": 8, "source_column": "src",
           "plan_cache": False}
CASES = [
    {"name": "workers0-buffer-mid", "num_workers": 0, "options": {"shuffle": True, "shuffle_buffer_size": 20},
     "point": ("mid", 1, 3), "epochs": [0, 1, 2]},
    {"name": "workers2-shuffle-interleave-mid", "num_workers": 2, "options": {"shuffle": True, "interleave": 2},
     "point": ("mid", 0, 5), "epochs": [0, 1]},
    {"name": "workers2-after-loop", "num_workers": 2, "options": {"shuffle": True},
     "point": ("after", 0, 0), "epochs": [0, 1, 2]},
    # from worker state version 2 on: source a's data with its layout (data_identity="layout"); the test
    # touches a's files before loading the state
    {"name": "workers1-layout-mid", "num_workers": 1, "options": {"shuffle": True}, "layout": "a",
     "point": ("mid", 0, 4), "epochs": [0, 1]},
    # from worker state version 4 on: passes laid out in spans; source b read in 7.5 passes an epoch (held, its
    # parts read whole), and a state inside an epoch re-planned from 2 workers to 3 (its old workers' parts
    # after the ones they stood in handed over whole)
    {"name": "workers2-passes-mid", "num_workers": 2,
     "options": {"shuffle": True, "shuffle_buffer_size": 16, "epoch_rows": 900, "weights": {"a": 1, "b": 2}},
     "point": ("mid", 1, 7), "epochs": [0, 1, 2]},
    {"name": "elastic-workers3-from-workers2-mid", "num_workers": 3, "elastic_from": (2, 3),
     "options": {"shuffle": True, "shuffle_buffer_size": 16, "epoch_rows": 600, "weights": {"a": 1, "b": 2}},
     "point": ("mid", 0, 2), "epochs": [0, 1]},
    # (v12, added with re-planning a re-planned epoch again) a state inside an epoch re-planned from 2 workers to
    # 3 and, from a checkpoint inside that, again to 1: its elastic's "before" is the first re-plan
    {"name": "elastic-twice-workers1-from-workers3-from-workers2-mid", "num_workers": 1,
     "elastic_chain": [(2, 3), (3, 2)],
     "options": {"shuffle": True, "shuffle_buffer_size": 16, "epoch_rows": 600, "weights": {"a": 1, "b": 2}},
     "point": ("mid", 0, 2), "epochs": [0, 1]},
    # from state version 11 on (a mixture's loader state and merged checkpoint are the dataset's kinds): a merged
    # checkpoint of 2 ranks with workers, at the same step; the recorded continuation is rank 1's
    {"name": "merged-rank1of2-workers2-mid", "num_workers": 2, "merge_ranks": 2,
     "options": {"shuffle": True, "shuffle_buffer_size": 16, "rank": 1, "world_size": 2},
     "point": ("mid", 0, 2), "epochs": [0, 1]},
    # from state version 13 on: order="canonical" (each canonical slot a slot of the mixture, its quotas of every
    # source): 2 workers of one rank (2 canonical slots each, parts joined in the trainer), and a merged checkpoint of
    # 2 ranks of 1 worker (batch 8 each: the global batch 16, chunks of 4 rows); 96 rows an epoch, 24 per canonical
    # slot, so that evening the canonical slots trims none
    {"name": "canonical4-workers2-mid", "num_workers": 2,
     "options": {"shuffle": True, "shuffle_buffer_size": 16, "interleave": 2, "order": "canonical",
                 "canonical_slots": 4, "epoch_rows": 96},
     "point": ("mid", 0, 5), "epochs": [0, 1]},
    {"name": "canonical4-merged-rank1of2-workers1-mid", "num_workers": 1, "merge_ranks": 2,
     "options": {"shuffle": True, "shuffle_buffer_size": 16, "rank": 1, "world_size": 2, "order": "canonical",
                 "canonical_slots": 4, "epoch_rows": 96},
     "point": ("mid", 0, 3), "epochs": [0, 1]},
]


def sources(root: str, layout: str | None = None) -> dict:
    """Sources a and b; ``layout`` names the one whose checkpoint identity leaves out modification times."""
    from arrowstream import Source

    def identity(name: str) -> str:
        return "layout" if name == layout else "strict"

    return {"a": Source(os.path.join(root, "data"), data_identity=identity("a")),
            "b": Source(os.path.join(root, "data-cut"), data_identity=identity("b"))}


def make(root: str, case: dict):
    from arrowstream import Mixture

    return Mixture.create_dataloader(sources=sources(root, case.get("layout")), num_workers=case["num_workers"],
                                     **{**MIXTURE, **case["options"]})


def batch_record(batch) -> list:
    return [list(batch["src"]), batch["id"].tolist()]


def capture(root: str, case: dict) -> dict:
    if case.get("merge_ranks"):   # every rank's state at the same step, merged; the continuation is the case's rank's
        from arrowstream import merge_state_dicts

        record = capture(root, {**case, "merge_ranks": 0})
        states = [capture(root, {**case, "options": {**case["options"], "rank": rank}, "merge_ranks": 0})["state"]
                  for rank in range(case["merge_ranks"])]
        record["state"] = json.loads(json.dumps(merge_state_dicts(states)))
        return record
    loader, mixture = make(root, case)
    if case.get("elastic_from"):   # start from a state of another number of workers, after some batches
        old_workers, steps = case["elastic_from"]
        old, old_mixture = make(root, {**case, "num_workers": old_workers})
        old_mixture.set_epoch(0)
        batches = iter(old)
        for _ in range(steps):
            next(batches)
        loader.load_state_dict(json.loads(json.dumps(old.state_dict())))
        del batches
    state = None
    for workers, steps in case.get("elastic_chain", ()):   # from one topology to the next, some batches each
        old, old_mixture = make(root, {**case, "num_workers": workers})
        if state is not None:
            old.load_state_dict(state)
        old_mixture.set_epoch(0)
        batches = iter(old)
        for _ in range(steps):
            next(batches)
        state = json.loads(json.dumps(old.state_dict()))
        del batches
    if state is not None:
        loader.load_state_dict(state)
    kind, at_epoch, at_step = case["point"]
    out, state, before = [], None, 0
    for epoch in case["epochs"]:
        mixture.set_epoch(epoch)
        for step, batch in enumerate(loader):
            out.append(batch_record(batch))
            if kind == "mid" and epoch == at_epoch and step + 1 == at_step:
                state, before = json.loads(json.dumps(loader.state_dict())), len(out)
        if kind == "after" and epoch == at_epoch:
            state, before = json.loads(json.dumps(loader.state_dict())), len(out)
    assert state is not None
    return {"state": state, "epoch": at_epoch, "continuation": out[before:]}


def main() -> None:
    from arrowstream._state.versions import STATE_VERSION

    out_dir = os.path.join(HERE, f"v{STATE_VERSION}")
    written = [name for name in os.listdir(out_dir) if name.startswith("mixture-")] if os.path.isdir(out_dir) else []
    new = "--new" in sys.argv   # only the cases of this version added since its files were written
    if written and "--force" not in sys.argv and not new:
        sys.exit(f"{out_dir} holds mixture states ({written[0]}, ...); golden files are never rewritten")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as root:
        prepare_copy(os.path.join(root, "data"), "data")
        prepare_copy(os.path.join(root, "data-cut"), "data-cut")
        for case in CASES:
            if new and f"mixture-{case['name']}.json" in written:
                continue
            record = {key: case[key] for key in ("num_workers", "options", "epochs", "layout") if key in case}
            record.update(capture(root, case))
            with open(os.path.join(out_dir, f"mixture-{case['name']}.json"), "w") as f:
                json.dump(record, f, indent=1, sort_keys=True)
                f.write("\n")


if __name__ == "__main__":
    main()
