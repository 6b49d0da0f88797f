"""Check that a pipeline with its own transform resumes exactly, and see check_resume catch one that does not."""

import functools
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from arrowstream import StructuredDataset
from arrowstream.testing import check_resume


def write_data(folder):
    for part in range(2):
        ids = np.arange(part * 2_000, (part + 1) * 2_000)
        table = pa.table({"id": ids, "x": np.random.default_rng(part).standard_normal(len(ids)).astype(np.float32)})
        pq.write_table(table, os.path.join(folder, f"part-{part}.parquet"), row_group_size=500)


def augment(batch):
    # noise seeded by the batch's own rows: the same batch gets the same noise, in any run
    rng = np.random.default_rng(int(batch["id"][0]))
    return {**batch, "x": batch["x"] + torch.from_numpy(rng.normal(0, 0.1, len(batch["x"])).astype(np.float32))}


def augment_unseeded(batch):
    rng = np.random.default_rng()   # the bug: fresh entropy on every call, so no run repeats another
    return {**batch, "x": batch["x"] + torch.from_numpy(rng.normal(0, 0.1, len(batch["x"])).astype(np.float32))}


def make_loader(folder, transform):
    # the pipeline under test, built the same way on every call
    return StructuredDataset.create_dataloader(path=folder, batch_size=200, num_workers=2, shuffle=True, seed=0,
                                               shuffle_buffer_size=1_000, transform=transform)


def main():
    with tempfile.TemporaryDirectory() as folder:
        write_data(folder)

        # 3 checkpoints spread over 2 epochs, one before the first batch and one at the epoch boundary
        report = check_resume(functools.partial(make_loader, folder, augment), points=3, epochs=2)
        print(report)

        # a restarted job: the resume runs in a new process (make_loader is a module-level function)
        report = check_resume(functools.partial(make_loader, folder, augment), points=[15], at_epoch_ends=False,
                              fresh_process=True)
        print(report)

        try:
            check_resume(functools.partial(make_loader, folder, augment_unseeded), points=2)
        except AssertionError as error:
            print(f"the unseeded transform is caught: {str(error)[:160]}...")
        else:
            raise SystemExit("check_resume missed the unseeded transform")


if __name__ == "__main__":   # fresh_process=True starts a process that imports this file: keep the guard
    main()
