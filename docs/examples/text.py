"""Read one CSV file (quoted fields hold line breaks) with two workers, checkpoint mid-epoch, resume, and see every row once."""

import csv
import json
import os
import tempfile

from arrowstream import StructuredDataset

NUM_ROWS, BATCH_SIZE, STOP_AFTER = 2_000, 128, 5   # the first run stops after 5 batches


def write_data(path):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["id", "score", "note"])
        for i in range(NUM_ROWS):
            # every 10th note is quoted and holds a line break, a comma and doubled quotes
            note = f'first line of {i}\nsecond, "quoted" line' if i % 10 == 0 else f"note {i}"
            writer.writerow([i, i % 7, note])


def make_loader(path):
    return StructuredDataset.create_dataloader(
        path=path, format="csv", batch_size=BATCH_SIZE, num_workers=2, shuffle=True, seed=0,
        split_bytes=2_048,                                      # splits of at most 2 KiB of text
        parse_options={"column_types": {"score": "float32"}},   # inferred as int64 without it
        output_format="dict")


def main():
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "rows.csv")
        write_data(path)

        # The first run: STOP_AFTER batches, then a checkpoint through JSON, then the job stops.
        loader, dataset = make_loader(path)
        # rows and batches are exact before reading: the planning scan counted every row
        assert dataset.num_rows == NUM_ROWS
        assert len(loader) == sum(-(-rows // BATCH_SIZE) for rows in dataset.slot_rows(num_workers=2))
        num_splits = dataset.num_splits(num_workers=2)
        dataset.set_epoch(0)
        seen, notes = [], {}
        for step, batch in enumerate(loader):
            seen += batch["id"]
            notes.update(zip(batch["id"], batch["note"]))
            if step + 1 == STOP_AFTER:
                state = json.loads(json.dumps(loader.state_dict()))
                break
        del loader, dataset

        # A fresh loader and dataset, as in a new process: load the state, finish the epoch.
        loader, dataset = make_loader(path)
        loader.load_state_dict(state)
        dataset.set_epoch(0)
        for batch in loader:
            seen += batch["id"]
            notes.update(zip(batch["id"], batch["note"]))
            assert all(isinstance(score, float) for score in batch["score"])   # column_types took effect

    assert sorted(seen) == list(range(NUM_ROWS)), "some row was lost or read twice"
    assert num_splits > 10, "one file, cut into many splits"
    assert all(notes[i] == f'first line of {i}\nsecond, "quoted" line' for i in range(0, NUM_ROWS, 10))
    print(f"text: {NUM_ROWS} CSV rows of one file in {num_splits} splits over 2 workers, each seen exactly "
          f"once across a JSON checkpoint after {STOP_AFTER} batches; {NUM_ROWS // 10} quoted line breaks "
          "kept inside their rows")


if __name__ == "__main__":
    main()
