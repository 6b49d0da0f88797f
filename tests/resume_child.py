"""Run in a fresh process: load a torch.save'd checkpoint, resume, and record the batches."""

from __future__ import annotations

import json
import pickle
import sys

import torch
from helpers import make_loader, resume_epochs

if __name__ == "__main__":
    path, checkpoint_file, options_json, out_file = sys.argv[1:5]
    options = json.loads(options_json)
    num_workers = options.pop("num_workers")
    checkpoint = torch.load(checkpoint_file, weights_only=True)
    loader, dataset = make_loader(path, num_workers, **options)
    batches = resume_epochs(loader, dataset, checkpoint["loader"], checkpoint["epoch"], checkpoint["last_epoch"])
    with open(out_file, "wb") as f:
        pickle.dump(batches, f)
