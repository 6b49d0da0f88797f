"""The batches a loader yields, by ``output_format``, as type aliases for a training loop's annotations.

What comes out of a loader depends on ``output_format``, ``transform`` and ``collate_fn``, all chosen at
run time, so mypy sees a loader's batches as ``Any``: ``batch["feat"]`` and ``batch["feat"].sum()`` are
not checked. Declare the loop variable with the alias of the output format, and they are (a
``transform`` or ``collate_fn`` that returns something else: declare what it returns instead).
``output_format="arrow"`` yields ``pyarrow.RecordBatch``, a class already.

Example:
    >>> import arrowstream, pyarrow as pa, pyarrow.parquet as pq, tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"x": [1.0, 2.0, 3.0], "name": ["a", "b", "c"]}), os.path.join(folder, "p.parquet"))
    >>> loader, dataset = arrowstream.StructuredDataset.create_dataloader(path=folder, batch_size=2)
    >>> batch: arrowstream.TorchBatch   # mypy: batch["x"] is a Tensor or a list, not Any
    >>> for batch in loader:
    ...     print(batch["x"], batch["name"])
    tensor([1., 2.], dtype=torch.float64) ['a', 'b']
    tensor([3.], dtype=torch.float64) ['c']
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy.typing as npt
import torch

TorchBatch: TypeAlias = dict[str, torch.Tensor | list[Any]]
"""A batch of ``output_format="torch"`` (the default): numeric, bool, temporal and fixed-size list columns as
tensors, the others as Python lists.

Example:
    >>> import torch
    >>> from arrowstream import TorchBatch
    >>> def loss(batch: TorchBatch) -> torch.Tensor:   # mypy checks batch["x"] as Tensor | list
    ...     x = batch["x"]
    ...     assert isinstance(x, torch.Tensor)
    ...     return (x ** 2).mean()
"""

NumpyBatch: TypeAlias = dict[str, npt.NDArray[Any] | list[Any]]
"""A batch of ``output_format="numpy"``: the same columns as :data:`TorchBatch`, as numpy arrays.

Example:
    >>> import numpy as np
    >>> from arrowstream import NumpyBatch
    >>> batch: NumpyBatch = {"x": np.arange(3), "name": ["a", "b", "c"]}
"""

DictBatch: TypeAlias = dict[str, list[Any]]
"""A batch of ``output_format="dict"``: every column as a list of Python values.

Example:
    >>> from arrowstream import DictBatch
    >>> batch: DictBatch = {"x": [1, 2], "name": ["a", "b"]}
"""

__all__ = ["DictBatch", "NumpyBatch", "TorchBatch"]
