"""One rank of a torchrun test: scenarios from a JSON spec, results as JSON, one file per rank.

Each scenario builds a loader whose rank and world size come from the initialised process group,
reads whole epochs and records every batch's ids. With ``"ddp": true`` every batch also trains a
DistributedDataParallel model (gloo): an uneven batch count would hang its gradient all-reduce,
and the process group's timeout turns such a hang into an error. With ``"checkpoint"`` it also
gathers every rank's state mid-epoch, and a fresh loader resumes from the merged checkpoint.
``"load_from"`` loads a merged checkpoint first; ``"save_at"`` reads that many batches of epoch 0 and saves
every rank's state (gathered) in ``"checkpoint_file"``.
``"rank_paths"``/``"rank_options"`` give one rank its own path or options (ranks that disagree);
``"ranks"`` lists the only ranks that build the scenario's dataset, the others wait at a barrier;
``"iceberg"`` (table and catalog_config) builds an IcebergDataset instead of reading ``"path"``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import types

import torch
import torch.distributed as dist
from helpers import ids_of, make_loader

import arrowstream


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> None:
    x = batch["x"].reshape(-1, 1)
    loss = model(x).square().mean()
    optimizer.zero_grad()
    loss.backward()  # DDP all-reduces the gradients here: every rank must take this step
    optimizer.step()


def build(path: str | None, num_workers: int, **options) -> tuple:
    if "table" in options:
        return arrowstream.IcebergDataset.create_dataloader(num_workers=num_workers, **options)
    return make_loader(path, num_workers, **options)


def run(scenario: dict) -> dict:
    rank = str(os.environ["RANK"])
    if rank not in map(str, scenario.get("ranks", [rank])):  # a dataset that only some ranks build
        return {"skipped": True}
    # one rank's own path or options: ranks that disagree
    path = scenario.get("rank_paths", {}).get(rank, scenario.get("path"))
    options = {**scenario.get("options", {}), **scenario.get("rank_options", {}).get(rank, {})}
    if "iceberg" in scenario:  # {"table": ..., "catalog_config": ...}
        options.update(scenario["iceberg"])
    if scenario.get("expect_error"):
        started = time.monotonic()
        try:
            build(path, scenario["num_workers"], **options)
        except arrowstream.ArrowStreamError as exc:
            return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - started}
        return {"error": None}
    loader, dataset = build(path, scenario["num_workers"], **options)
    if "load_from" in scenario:
        with open(scenario["load_from"]) as f:
            loader.load_state_dict(json.load(f))
    if "save_at" in scenario:  # stop mid-epoch 0 (after a resume: save_at batches on) and save every rank's state
        dataset.set_epoch(0)
        before = []
        for step, batch in enumerate(loader):
            before.append(ids_of(batch))
            if step + 1 == scenario["save_at"]:
                break
        merged = arrowstream.gather_state_dict(loader)
        if dist.get_rank() == 0:
            with open(scenario["checkpoint_file"], "w") as f:
                json.dump(merged, f)
        return {"before": before}
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1)) if scenario.get("ddp") else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01) if model is not None else None
    checkpoint = scenario.get("checkpoint")
    out: dict = {"rank": int(os.environ["RANK"]), "len": len(loader), "epochs": {}, "merged": None,
                 "rows_trimmed": dataset.rows_trimmed_per_epoch(scenario["num_workers"]),
                 "data_rank": dataset.rank, "data_world_size": dataset.world_size,
                 "plan_cache": getattr(getattr(dataset._origin, "cache_outcome", None), "action", None)}
    for epoch in scenario["epochs"]:
        dataset.set_epoch(epoch)
        out.setdefault("lens", {})[str(epoch)] = len(loader)  # an epoch re-planned by elastic resume has its own
        out.setdefault("trimmed", {})[str(epoch)] = dataset.rows_trimmed_per_epoch(scenario["num_workers"])
        batches = []
        for step, batch in enumerate(loader):
            batches.append(ids_of(batch))
            if model is not None:
                train_step(model, optimizer, batch)
            if checkpoint and epoch == checkpoint["epoch"] and step + 1 == checkpoint["step"]:
                out["merged"] = json.loads(json.dumps(arrowstream.gather_state_dict(loader)))
        out["epochs"][str(epoch)] = batches
    if scenario.get("metrics"):
        out["metrics"] = arrowstream.gather_metrics(loader.metrics())
    if checkpoint:
        fresh, fresh_dataset = build(path, checkpoint.get("num_workers", scenario["num_workers"]), **options)
        fresh.load_state_dict(out["merged"])
        resumed = {}
        for epoch in range(checkpoint["epoch"], scenario["epochs"][-1] + 1):
            fresh_dataset.set_epoch(epoch)
            resumed[str(epoch)] = [ids_of(batch) for batch in fresh]
        out["resumed"] = resumed
    return out


def handshakes() -> dict:
    from torch.distributed import distributed_c10d

    from arrowstream._planning import collective as _collective

    store = distributed_c10d._get_default_store()
    completed = _collective._completed.get(distributed_c10d._get_default_group(), 0)
    names = ["rank0", "verdict", "read", "all-read", *(f"answer{r}" for r in range(dist.get_world_size()))]
    keys = [f"arrowstream/dataset/{n}/{name}" for n in range(completed + 2) for name in names]
    return {"completed": completed, "left": [key for key in keys if store.check([key])]}


def horovod_substitute() -> None:
    """Horovod 0.28 (the last release) does not build against torch 2.13, so this stands in for
    ``horovod.torch`` after ``hvd.init()``: the three calls arrowstream makes, answered from the
    rank and world size torchrun gave this process."""
    module = types.ModuleType("horovod.torch")
    module.is_initialized = lambda: True  # type: ignore[attr-defined]
    module.rank = lambda: int(os.environ["RANK"])  # type: ignore[attr-defined]
    module.size = lambda: int(os.environ["WORLD_SIZE"])  # type: ignore[attr-defined]
    sys.modules["horovod.torch"] = module


def init(spec: dict) -> None:
    """The process group, started the way the spec's launcher does it."""
    timeout = datetime.timedelta(seconds=spec.get("timeout_s", 60))
    if spec.get("launcher") == "horovod":
        horovod_substitute()
        return
    if spec.get("launcher") == "deepspeed":
        import deepspeed
        import deepspeed.ops

        # the shared-memory all-reduce kernel is compiled on first use (a minute of g++); gloo does the job here
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)


if __name__ == "__main__":
    spec_file, out_dir = sys.argv[1:3]
    with open(spec_file) as f:
        spec = json.load(f)
    os.environ.update(spec.get("environment", {}))
    init(spec)
    if not dist.is_initialized():  # Horovod alone: no torch.distributed
        results = {scenario["name"]: run(scenario) for scenario in spec["scenarios"]}
    else:
        try:
            results = {}
            for scenario in spec["scenarios"]:
                results[scenario["name"]] = run(scenario)
                if "ranks" in scenario:  # the ranks that skipped it wait, as a trainer's would after evaluation
                    dist.barrier()
            dist.barrier()
            if spec.get("handshakes"):  # how many dataset handshakes completed, and the keys they left
                results["handshakes"] = handshakes()
        finally:
            dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{int(os.environ['RANK'])}.json"), "w") as f:
        json.dump(results, f)
