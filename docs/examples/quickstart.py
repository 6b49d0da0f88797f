"""Train a tiny model on Parquet files with two workers, stop mid-epoch, resume, and see every row once."""

import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from arrowstream import StructuredDataset

NUM_FILES, ROWS_PER_FILE = 4, 2_000


def write_data(folder):
    for part in range(NUM_FILES):
        ids = np.arange(part * ROWS_PER_FILE, (part + 1) * ROWS_PER_FILE)
        x = np.random.default_rng(part).standard_normal(ROWS_PER_FILE).astype("float32")
        table = pa.table({"id": ids, "x": x, "label": (x > 0).astype("float32")})
        pq.write_table(table, os.path.join(folder, f"part-{part}.parquet"), row_group_size=500)


def make_loader(folder):
    return StructuredDataset.create_dataloader(path=folder, batch_size=256, num_workers=2, shuffle=True, seed=0)


def train_step(model, optimizer, batch):
    logits = model(batch["x"].unsqueeze(1)).squeeze(1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch["label"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    seen = []
    with tempfile.TemporaryDirectory() as folder:
        write_data(folder)

        # The first run: 10 steps of epoch 0, then a checkpoint, then the job stops.
        loader, dataset = make_loader(folder)
        dataset.set_epoch(0)
        for step, batch in enumerate(loader):
            train_step(model, optimizer, batch)
            seen += batch["id"].tolist()
            if step == 9:
                state = loader.state_dict()
                break
        del loader, dataset

        # A fresh loader and dataset, as in a new process: load the state, finish the epoch.
        loader, dataset = make_loader(folder)
        loader.load_state_dict(state)
        dataset.set_epoch(0)
        for batch in loader:
            loss = train_step(model, optimizer, batch)
            seen += batch["id"].tolist()

    num_rows = NUM_FILES * ROWS_PER_FILE
    assert sorted(seen) == list(range(num_rows)), "some row was lost or read twice"
    print(f"quickstart: {num_rows} rows over {len(loader)} batches, each seen exactly once across a "
          f"checkpoint after 10 batches (last loss {loss:.3f})")


if __name__ == "__main__":
    main()
