"""Watch what each worker does while training: rows, splits, and how long it waited for the trainer."""

import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from arrowstream import StructuredDataset


def write_data(folder):
    for part in range(4):
        ids = np.arange(part * 100_000, (part + 1) * 100_000)
        pq.write_table(pa.table({"id": ids, "x": np.sin(ids).astype(np.float32)}),
                       os.path.join(folder, f"part-{part}.parquet"), row_group_size=25_000)


def main():
    folder = tempfile.mkdtemp()
    write_data(folder)
    loader, dataset = StructuredDataset.create_dataloader(path=folder, batch_size=1_000, num_workers=2)
    dataset.set_epoch(0)
    for step, batch in enumerate(loader):
        time.sleep(0.002)                       # the training step
        if step == 40:  # 41 batches in
            early = loader.metrics()          # live: read while the epoch runs, no message to the workers
    end = loader.metrics()

    assert end["rows"] == dataset.num_rows and end["batches"] == len(loader)
    assert early["rows"] < end["rows"]
    for worker in end["workers"]:
        print(f"worker {worker['worker']}: {worker['rows']:,} rows in {worker['splits_done']} splits, "
              f"busy {worker['utilization']:.0%} of its time, {worker['idle_s']:.2f} s waiting for the trainer")
    flat = loader.metrics(flat=True)            # one level of numbers, for a logger
    assert flat["rank0/worker0/rows"] + flat["rank0/worker1/rows"] == dataset.num_rows
    print(f"metrics: {end['rows']:,} rows, {end['batches']} batches; after 41 batches the workers had made "
          f"{early['rows']:,} rows")


if __name__ == "__main__":
    main()
