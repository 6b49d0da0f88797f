"""Hugging Face transformers.Trainer: train from an arrowstream loader, checkpoint the loader with each Trainer
checkpoint, and resume mid-epoch with exactly the batches an uninterrupted run trains on.

The Trainer builds its own DataLoader from a dataset; a subclass hands it the arrowstream loader instead
(``get_train_dataloader``). A callback writes the loader state into each checkpoint folder (``on_save``), and
the resumed run loads it before ``train(resume_from_checkpoint=...)``, with ``ignore_data_skip=True``: the loader
state already stands after the trained batches, so the Trainer must not skip any.
"""

import json
import os
import tempfile
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import transformers

from arrowstream import StructuredDataset

LOADER_STATE = "arrowstream_loader.json"
SAVE_EVERY, CRASH_AFTER = 5, 7   # the first run saves at step 5 and dies after step 7


class EpochLoader:
    """The arrowstream loader with the ``set_epoch`` that the Trainer calls at the start of each epoch."""

    def __init__(self, loader, dataset):
        self.loader, self.dataset = loader, dataset

    def __iter__(self):
        return iter(self.loader)

    def __len__(self):
        return len(self.loader)

    def set_epoch(self, epoch):
        self.dataset.set_epoch(epoch)


class ArrowStreamTrainer(transformers.Trainer):
    """A Trainer that trains on an arrowstream loader instead of a DataLoader of its own making."""

    def __init__(self, *args, loader, dataset, **kwargs):
        super().__init__(*args, **kwargs)
        self.loader = EpochLoader(loader, dataset)
        self.add_callback(SaveLoaderState(loader))

    def get_train_dataloader(self):
        return self.loader


class SaveLoaderState(transformers.TrainerCallback):
    """Writes the loader state into the checkpoint folder the Trainer has just written."""

    def __init__(self, loader):
        self.loader = loader

    def on_save(self, args, state, control, **kwargs):
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        with open(os.path.join(folder, LOADER_STATE), "w") as f:
            json.dump(self.loader.state_dict(), f)


def load_loader_state(loader, checkpoint):
    """Before ``trainer.train(resume_from_checkpoint=checkpoint)``: the loader continues after the saved step."""
    with open(os.path.join(checkpoint, LOADER_STATE)) as f:
        loader.load_state_dict(json.load(f))


class Regression(torch.nn.Module):
    """A one-weight model; the Trainer calls it with the batch's columns as keywords."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Linear(1, 1)
        self.seen = []   # the ids of every batch trained on, to check the resume

    def forward(self, id, x, y):
        self.seen.append(id.tolist())
        return {"loss": (self.weight(x[:, None]).squeeze(1) - y).pow(2).mean()}


class Crash(transformers.TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == CRASH_AFTER:
            raise SystemExit("the job dies")


def write_data(folder):
    for part in range(3):
        ids = np.arange(part * 400, (part + 1) * 400)
        x = np.random.default_rng(part).standard_normal(len(ids)).astype("float32")
        pq.write_table(pa.table({"id": ids, "x": x, "y": 3 * x}), os.path.join(folder, f"part-{part}.parquet"),
                       row_group_size=100)


def train(folder, output_dir, callbacks=(), resume_from=None):
    loader, dataset = StructuredDataset.create_dataloader(path=folder, batch_size=50, num_workers=2, shuffle=True,
                                                          seed=0, shuffle_buffer_size=200)
    if resume_from is not None:
        load_loader_state(loader, resume_from)
    args = transformers.TrainingArguments(
        output_dir=output_dir, num_train_epochs=2, learning_rate=0.1, save_strategy="steps", save_steps=SAVE_EVERY,
        ignore_data_skip=True,   # the loader state resumes the data; the Trainer must not skip batches itself
        use_cpu=True, report_to="none", disable_tqdm=True, logging_strategy="no")
    model = Regression()
    trainer = ArrowStreamTrainer(model=model, args=args, loader=loader, dataset=dataset, callbacks=list(callbacks))
    try:
        trainer.train(resume_from_checkpoint=resume_from)
    except SystemExit:
        pass
    return model.seen


def main():
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as output:
        write_data(folder)
        reference = train(folder, os.path.join(output, "reference"))
        half = len(reference) // 2
        assert reference[:half] != reference[half:], "epoch 1 repeats epoch 0's order: set_epoch was not called"
        first = train(folder, os.path.join(output, "run"), callbacks=[Crash()])
        assert first == reference[:CRASH_AFTER]
        resumed = train(folder, os.path.join(output, "resumed"),
                        resume_from=os.path.join(output, "run", f"checkpoint-{SAVE_EVERY}"))
    assert resumed == reference[SAVE_EVERY:], "the resumed run trained on other batches"
    ids = sorted(i for batch in first[:SAVE_EVERY] + resumed for i in batch)
    assert ids == sorted(list(range(1_200)) * 2), "a row was lost or repeated"
    print(f"hf_trainer: a checkpoint at step {SAVE_EVERY}, a crash after step {CRASH_AFTER}, and the resumed Trainer "
          f"trained on the same {len(resumed)} batches as an uninterrupted run ({len(reference)} batches over "
          f"2 epochs), every row once per epoch")


if __name__ == "__main__":
    main()
