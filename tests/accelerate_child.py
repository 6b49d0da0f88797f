"""One rank of the Accelerate test: the documented recipe, and what ``accelerator.prepare(loader)`` does.

The recipe: hand the accelerator to the dataset (``accelerator=accelerator``) and prepare the
model and optimizer only, never the loader; batches are already this rank's own.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from accelerate import Accelerator
from helpers import ids_of, make_loader

if __name__ == "__main__":
    path, out_dir = sys.argv[1:3]
    accelerator = Accelerator(cpu=True)
    # the recipe
    loader, dataset = make_loader(path, 2, batch_size=64, shuffle=True, accelerator=accelerator)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    recipe = []
    for batch in loader:
        recipe.append(ids_of(batch))
        loss = model(batch["x"].reshape(-1, 1).to(accelerator.device)).square().mean()
        accelerator.backward(loss)  # all-reduces gradients: every rank takes the same number of steps
        optimizer.step()
        optimizer.zero_grad()
    # what the recipe avoids: the loader prepared by Accelerate
    other, _ = make_loader(path, 0, batch_size=64, shuffle=True, accelerator=accelerator, columns=["id", "x"])
    prepared = [ids_of(batch) for batch in accelerator.prepare(other)]
    result = {"rank": accelerator.process_index, "world_size": accelerator.num_processes,
              "distributed_type": str(accelerator.distributed_type), "len": len(loader),
              "rows_trimmed": dataset.rows_trimmed_per_epoch(2), "recipe": recipe, "prepared": prepared}
    accelerator.wait_for_everyone()
    with open(os.path.join(out_dir, f"rank{int(os.environ['RANK'])}.json"), "w") as f:
        json.dump(result, f)
    accelerator.end_training()
