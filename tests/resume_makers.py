"""Module-level ``make_loader`` functions for ``check_resume(..., fresh_process=True)``: a spawned
process imports them by name (bind the dataset's path with ``functools.partial``)."""

from __future__ import annotations

from typing import Any

import torch

from arrowstream import StructuredDataset


def make_small(path: str, num_workers: int = 0, **options: Any) -> Any:
    """A shuffled loader with a shuffle buffer over ``path``: a pipeline that resumes exactly."""
    options = {"batch_size": 32, "shuffle": True, "seed": 3, "shuffle_buffer_size": 150, **options}
    return StructuredDataset.create_dataloader(path=path, num_workers=num_workers, **options)


def hashed_names(batch: dict[str, Any]) -> dict[str, Any]:
    """A transform that is deterministic inside one process only: ``hash`` of a str is salted per
    process (PYTHONHASHSEED), so a restarted job computes other values."""
    return {**batch, "bucket": torch.tensor([hash(name) % 1000 for name in batch["name"]])}


def make_with_hashed_names(path: str) -> Any:
    return make_small(path, transform=hashed_names)
