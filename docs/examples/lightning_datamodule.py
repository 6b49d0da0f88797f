"""PyTorch Lightning: a LightningDataModule whose checkpoint holds the loader state, resumed exactly mid-epoch.

A first ``Trainer.fit`` saves a checkpoint every 5 steps and crashes after step 7; a fresh Trainer and
DataModule resume from the step-5 checkpoint (``fit(ckpt_path=...)``) and train on exactly the batches an
uninterrupted run trains on after step 5, over two epochs. Done twice: with ``len(loader)`` known, and with a
``filter`` (no length), where Lightning fetches one batch ahead of the training step.
"""

import collections
import os
import tempfile
import warnings

import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from arrowstream import StructuredDataset

CHECKPOINT_EVERY, CRASH_AFTER = 5, 7   # the first run saves at step 5 and dies after step 7


class ArrowStreamDataModule(pl.LightningDataModule):
    """One arrowstream loader; its state goes into Lightning's checkpoint through ``state_dict``."""

    def __init__(self, **loader_options):
        super().__init__()
        self.loader, self.dataset = StructuredDataset.create_dataloader(**loader_options)
        self.state = None        # the loader state after the last batch given to training_step
        self.pending = collections.deque()   # the states of batches Lightning fetched, not yet trained on

    def train_dataloader(self):
        return TrainingBatches(self)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        # Lightning hands this batch to training_step now: the state after it is the one to checkpoint
        if self.trainer.training:
            self.state = self.pending.popleft()
        return batch

    def state_dict(self):
        return {"loader": self.state} if self.state is not None else {}

    def load_state_dict(self, state_dict):
        if "loader" in state_dict:
            self.loader.load_state_dict(state_dict["loader"])   # also restores the saved epoch
            self.state = state_dict["loader"]


class TrainingBatches:
    """The loader as Lightning sees it: without a ``state_dict`` of its own, so that the DataModule's
    checkpoint is the only one; the state after each batch waits until that batch is trained on."""

    def __init__(self, datamodule):
        self.datamodule = datamodule

    def __len__(self):
        return len(self.datamodule.loader)   # a TypeError with a filter: Lightning then reads to the end

    def __iter__(self):
        datamodule = self.datamodule
        datamodule.dataset.set_epoch(datamodule.trainer.current_epoch)
        datamodule.pending.clear()
        for batch in datamodule.loader:
            datamodule.pending.append(datamodule.loader.state_dict())
            if len(datamodule.pending) > 2:   # Lightning fetches one batch ahead at most
                raise RuntimeError("the DataModule's on_before_batch_transfer is not called (a LightningModule "
                                   "that overrides it is called instead): take the state there, or checkpoints "
                                   "would hold a stale loader state")
            yield batch


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Linear(1, 1)
        self.seen = []   # the ids of every batch trained on, to check the resume

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["id"].tolist())
        return (self.weight(batch["x"][:, None]).squeeze(1) - batch["y"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Crash(pl.Callback):
    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.global_step == CRASH_AFTER:
            raise SystemExit("the job dies")


def write_data(folder):
    for part in range(3):
        ids = np.arange(part * 400, (part + 1) * 400)
        x = np.random.default_rng(part).standard_normal(len(ids)).astype("float32")
        pq.write_table(pa.table({"id": ids, "x": x, "y": 3 * x}), os.path.join(folder, f"part-{part}.parquet"),
                       row_group_size=100)


def fit(folder, checkpoints, loader_options, callbacks=(), ckpt_path=None):
    model = Regression()
    data = ArrowStreamDataModule(path=folder, batch_size=50, num_workers=2, shuffle=True, seed=0,
                                 shuffle_buffer_size=200, **loader_options)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[*callbacks, pl.callbacks.ModelCheckpoint(
                             dirpath=checkpoints, every_n_train_steps=CHECKPOINT_EVERY, save_top_k=-1)])
    try:
        trainer.fit(model, data, ckpt_path=ckpt_path)
    except SystemExit:
        pass
    return model.seen


def check_resume(folder, checkpoints, loader_options):
    reference = fit(folder, os.path.join(checkpoints, "reference"), loader_options)
    half = len(reference) // 2
    assert reference[:half] != reference[half:], "epoch 1 repeats epoch 0's order: set_epoch was not called"
    first = fit(folder, os.path.join(checkpoints, "run"), loader_options, callbacks=[Crash()])
    assert first == reference[:CRASH_AFTER]
    checkpoint = os.path.join(checkpoints, "run", f"epoch=0-step={CHECKPOINT_EVERY}.ckpt")
    resumed = fit(folder, os.path.join(checkpoints, "resumed"), loader_options, ckpt_path=checkpoint)
    assert resumed == reference[CHECKPOINT_EVERY:], "the resumed run trained on other batches"
    ids = sorted(i for batch in first[:CHECKPOINT_EVERY] + resumed for i in batch)
    assert ids == sorted(list(range(1_200)) * 2), "a row was lost or repeated"
    return len(reference), len(resumed)


def main():
    warnings.filterwarnings("ignore")   # Lightning's advice for CPU-only runs
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as checkpoints:
        write_data(folder)
        for name, options in [("len(loader) known", {}), ("a filter, no length", {"filter": [("x", ">", -9.0)]})]:
            total, resumed = check_resume(folder, os.path.join(checkpoints, str(len(options))), options)
            print(f"lightning ({name}): a checkpoint at step {CHECKPOINT_EVERY}, a crash after step {CRASH_AFTER}, "
                  f"and the resumed Trainer trained on the same {resumed} batches as an uninterrupted run "
                  f"({total} batches over 2 epochs), every row once per epoch")


if __name__ == "__main__":
    main()
