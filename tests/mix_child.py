"""One rank of a torchrun test of a mixture (tests/test_mixing_ranks.py): quotas over ranks, DDP steps on
every batch (uneven batch counts would hang the all-reduce), a merged checkpoint mid-epoch and its resume.

argv: spec.json out_dir. The spec names the sources (name -> folder), the weights, epoch_rows and options.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import arrowstream


def build(spec: dict) -> tuple:
    sources = {name: arrowstream.Source(path) for name, path in spec["sources"].items()}
    return arrowstream.Mixture.create_dataloader(sources=sources, weights=spec["weights"],
                                                 epoch_rows=spec["epoch_rows"], **spec["options"])


def record(batch: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list:
    loss = model(batch["x"].reshape(-1, 1).float()).square().mean()
    optimizer.zero_grad()
    loss.backward()  # DDP all-reduces here: every rank must take this step
    optimizer.step()
    return [list(batch["src"]), [int(i) for i in batch["id"]]]


def elastic(spec: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """``save``: the whole epoch 1 of this rank, then a new run stopped after ``stop`` batches of it, and
    the merged checkpoint (rank 0 writes it); ``resume``: another world size loads it and reads the rest."""
    loader, mixture = build(spec)
    mixture.set_epoch(1)
    if spec["mode"] == "save":
        whole = [record(b, model, optimizer) for b in loader]
        loader, mixture = build(spec)
        mixture.set_epoch(1)
        it = iter(loader)
        before = [record(next(it), model, optimizer) for _ in range(spec["stop"])]
        merged = arrowstream.gather_state_dict(loader)
        if dist.get_rank() == 0:
            with open(spec["checkpoint"], "w") as f:
                json.dump(merged, f)
        dist.barrier()
        return {"whole": whole, "before": before}
    with open(spec["checkpoint"]) as f:
        loader.load_state_dict(json.load(f))
    rest = [record(b, model, optimizer) for b in loader]
    result = {"rest": rest, "len": len(loader)}
    mixture.set_epoch(2)   # a whole epoch of this topology after the re-planned one
    result.update(epoch2=[record(b, model, optimizer) for b in loader], len2=len(loader), quotas=mixture.quotas(),
                  slot_quotas=mixture.slot_quotas(spec["options"]["num_workers"], 2))
    return result


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out_dir = sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    if spec.get("mode") in ("save", "resume"):
        result = elastic(spec, model, optimizer)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()
        return
    loader, mixture = build(spec)
    result: dict = {"len": len(loader), "slot_quotas": mixture.slot_quotas(spec["options"]["num_workers"]),
                    "quotas": mixture.quotas(), "epochs": {}}
    for epoch in (0, 1):
        mixture.set_epoch(epoch)
        result["epochs"][epoch] = [record(b, model, optimizer) for b in loader]
    stop = spec["stop"]
    mixture.set_epoch(1)
    it = iter(loader)
    for _ in range(stop):
        record(next(it), model, optimizer)
    merged = arrowstream.gather_state_dict(loader)
    del it
    fresh, _ = build(spec)
    fresh.load_state_dict(json.loads(json.dumps(merged)))
    result["resumed"] = [record(b, model, optimizer) for b in fresh]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
