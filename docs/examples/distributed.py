"""Two ranks in one process (explicit rank= and world_size=): disjoint rows, equal batch counts, one checkpoint."""

import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import arrowstream
from arrowstream import StructuredDataset

WORLD_SIZE, NUM_WORKERS = 2, 2


def write_data(folder):
    # files of unequal sizes, so that the ranks' shares differ and even_batches has something to trim
    start = 0
    for part, num_rows in enumerate([3_000, 1_700, 900, 2_400]):
        ids = np.arange(start, start + num_rows)
        pq.write_table(pa.table({"id": ids}), os.path.join(folder, f"part-{part}.parquet"), row_group_size=300)
        start += num_rows
    return start


def make_loader(folder, rank):
    # under torchrun, leave rank= and world_size= out: they come from torch.distributed
    return StructuredDataset.create_dataloader(path=folder, batch_size=128, num_workers=NUM_WORKERS, shuffle=True,
                                               seed=0, rank=rank, world_size=WORLD_SIZE)


def main():
    with tempfile.TemporaryDirectory() as folder:
        num_rows = write_data(folder)

        ids, num_batches, num_trimmed, num_before_checkpoint, states = {}, {}, 0, {}, []
        for rank in range(WORLD_SIZE):
            loader, dataset = make_loader(folder, rank)
            dataset.set_epoch(0)
            batches = iter(loader)
            ids[rank] = [i for _ in range(3) for i in next(batches)["id"].tolist()]
            states.append(loader.state_dict())   # each rank's state after 3 batches
            num_before_checkpoint[rank] = len(ids[rank])
            ids[rank] += [i for batch in batches for i in batch["id"].tolist()]
            num_batches[rank] = len(loader)
            num_trimmed += dataset.rows_trimmed_per_epoch(NUM_WORKERS)
            del batches, loader, dataset

        # One checkpoint of both ranks (gather_state_dict does this with a collective under torchrun);
        # each rank of a resumed run takes its own part.
        merged = arrowstream.merge_state_dicts(states)
        resumed = {}
        for rank in range(WORLD_SIZE):
            loader, dataset = make_loader(folder, rank)
            loader.load_state_dict(merged)
            dataset.set_epoch(0)
            resumed[rank] = [i for batch in loader for i in batch["id"].tolist()]
            del loader, dataset

    assert not set(ids[0]) & set(ids[1]), "a row was read on both ranks"
    assert num_batches[0] == num_batches[1], "the ranks yield different numbers of batches"
    assert len(ids[0]) + len(ids[1]) + num_trimmed == num_rows, "rows missing beyond those counted as trimmed"
    assert all(resumed[rank] == ids[rank][num_before_checkpoint[rank]:] for rank in range(WORLD_SIZE)), \
        "the resumed rows differ from those an uninterrupted run read after the checkpoint"
    print(f"distributed: {WORLD_SIZE} ranks read disjoint rows ({len(ids[0])} and {len(ids[1])}, "
          f"{num_trimmed} trimmed of {num_rows}) in {num_batches[0]} batches each, and resumed from one "
          "merged checkpoint")


if __name__ == "__main__":
    main()
