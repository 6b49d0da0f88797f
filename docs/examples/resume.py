"""Checkpoint mid-epoch with torch.save, resume in a fresh loader, and get the very batches of an uninterrupted run."""

import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from arrowstream import StructuredDataset

NUM_EPOCHS, STOP_AFTER = 2, 7   # the first run stops after 7 batches of epoch 0


def write_data(folder):
    for part in range(3):
        ids = np.arange(part * 3_000, (part + 1) * 3_000)
        table = pa.table({"id": ids, "x": np.random.default_rng(part).standard_normal(len(ids))})
        pq.write_table(table, os.path.join(folder, f"part-{part}.parquet"), row_group_size=1_000)


def make_loader(folder):
    # split shuffle, two splits read in rotation per worker, and a record-level shuffle buffer
    return StructuredDataset.create_dataloader(path=folder, batch_size=250, num_workers=2, shuffle=True, seed=0,
                                               interleave=2, shuffle_buffer_size=2_000)


def same_batch(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def main():
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as checkpoints:
        write_data(folder)
        checkpoint = os.path.join(checkpoints, "checkpoint.pt")   # not among the data files

        # The reference: two epochs without a stop.
        loader, dataset = make_loader(folder)
        reference = []
        for epoch in range(NUM_EPOCHS):
            dataset.set_epoch(epoch)
            reference += list(loader)
        del loader, dataset

        # The interrupted run: 7 batches, a checkpoint on disk, and the job stops.
        loader, dataset = make_loader(folder)
        dataset.set_epoch(0)
        batches = []
        for batch in loader:
            batches.append(batch)
            if len(batches) == STOP_AFTER:
                torch.save({"loader": loader.state_dict(), "epoch": 0}, checkpoint)
                break
        del loader, dataset

        # The resumed run, in a fresh loader: the training loop of the quickstart.
        loader, dataset = make_loader(folder)
        saved = torch.load(checkpoint)   # weights_only=True: the state is plain JSON types
        loader.load_state_dict(saved["loader"])
        for epoch in range(saved["epoch"], NUM_EPOCHS):
            dataset.set_epoch(epoch)
            batches += list(loader)

    assert len(batches) == len(reference)
    assert all(same_batch(a, b) for a, b in zip(batches, reference)), "the resumed batches differ"
    print(f"resume: after a checkpoint at batch {STOP_AFTER}, the resumed loader yielded the same "
          f"{len(reference) - STOP_AFTER} batches as an uninterrupted run, over {NUM_EPOCHS} epochs")


if __name__ == "__main__":
    main()
