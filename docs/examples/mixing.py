"""A weighted mixture of three sources: exact quotas, per-batch shares, passes of a small source, a
mid-epoch checkpoint resumed in a fresh loader, and new weights at an epoch boundary."""

import json
import os
import tempfile
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

from arrowstream import Mixture, Source


def write(folder, name, first, rows):
    os.makedirs(folder)
    ids = list(range(first, first + rows))
    pq.write_table(pa.table({"id": ids, "x": [i * 0.5 for i in ids]}), os.path.join(folder, f"{name}.parquet"),
                   row_group_size=250)
    return folder


def make_loader(sources, weights):
    return Mixture.create_dataloader(sources=sources, weights=weights, epoch_rows=2_000, batch_size=100,
                                     num_workers=2, shuffle=True, shuffle_buffer_size=500, source_column="source")


def main():
    with tempfile.TemporaryDirectory() as root:
        sources = {"web": Source(write(os.path.join(root, "web"), "web", 0, 5_000)),
                   "code": Source(write(os.path.join(root, "code"), "code", 100_000, 2_000)),
                   "wiki": Source(write(os.path.join(root, "wiki"), "wiki", 200_000, 150))}
        weights = {"web": 0.6, "code": 0.3, "wiki": 0.1}

        loader, mixture = make_loader(sources, weights)
        print("quotas per epoch:", mixture.quotas())   # web 1200, code 600, wiki 200: wiki's 150 rows, 1.33 passes
        wiki = []
        mixture.set_epoch(0)
        for batch in loader:
            shares = Counter(batch["source"])
            assert abs(shares["wiki"] - 10) <= 1   # every batch holds each source in proportion (here 10%)
            wiki += [int(i) for i, s in zip(batch["id"], batch["source"]) if s == "wiki"]
        assert len(wiki) == 200 and len(set(wiki)) == 150 and set(Counter(wiki).values()) == {1, 2}
        print("epoch 0: every batch 60/30/10 (within one row); wiki gave 200 rows: a whole pass of its 150, then 50")

        # A checkpoint inside epoch 1, resumed by a fresh loader: the very same batches follow.
        mixture.set_epoch(1)
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))   # JSON: torch.save works too
        rest = [batch["id"].tolist() for batch in it]
        fresh, _ = make_loader(sources, weights)
        fresh.load_state_dict(state)
        assert [batch["id"].tolist() for batch in fresh] == rest
        print(f"resumed mid-epoch: the {len(rest)} remaining batches of epoch 1 are identical")

        # At the epoch boundary the mixture may change: every source goes on where it stood.
        state = fresh.state_dict()
        changed, remixed = make_loader(sources, {"web": 0.2, "code": 0.2, "wiki": 0.6})
        changed.load_state_dict(state)
        remixed.set_epoch(2)
        counts = Counter(s for batch in changed for s in batch["source"])
        assert counts == remixed.quotas()
        print("epoch 2 with new weights:", dict(counts), "- passes kept:", remixed.passes(2))


if __name__ == "__main__":
    main()
