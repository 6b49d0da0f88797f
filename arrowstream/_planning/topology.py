"""Where this process stands among ranks: explicit, Accelerate, torch.distributed, Horovod.

The first source that is set decides; every other source that is set must agree with it, so a
``rank=local_rank`` typo or a launcher that was not initialised never makes two ranks read the
same rows. ``group_size`` > 1 makes consecutive ranks one group that reads the same data (tensor
or sequence parallel replicas): the data-parallel coordinates are ``rank // group_size`` of
``world_size // group_size``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import ArgumentTypeError, InvalidArgumentError, TopologyError
from .options import check_int

MAX_WORLD_SIZE = 2**20  # 1,048,576 ranks: far above any cluster; a larger value is a mistake


@dataclass(frozen=True)
class Topology:
    """This process's rank among ``world_size`` processes, and what data it reads."""

    rank: int
    world_size: int
    source: str
    group_size: int = 1

    @property
    def data_rank(self) -> int:
        """The rank's place among readers of distinct data (its group's index)."""
        return self.rank // self.group_size

    @property
    def data_world_size(self) -> int:
        """How many groups read distinct data."""
        return self.world_size // self.group_size


def _accelerate(accelerator: Any) -> tuple[int, int]:
    try:
        return int(accelerator.process_index), int(accelerator.num_processes)
    except AttributeError:
        raise ArgumentTypeError(
            f"accelerator: expected an accelerate.Accelerator (with process_index and num_processes), got "
            f"{type(accelerator).__name__}") from None


def _torch_distributed() -> tuple[int, int] | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _horovod() -> tuple[int, int] | None:
    """Horovod's rank and size, if the user's process imported and initialised it (never imported here)."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is None:
        return None
    try:
        if not hvd.is_initialized():
            return None
        return int(hvd.rank()), int(hvd.size())
    except (AttributeError, ValueError):
        return None


def resolve_topology(rank: Any = None, world_size: Any = None, accelerator: Any = None,
                     group_size: Any = 1, *, plan_locally: bool = False) -> Topology:
    """This process's :class:`Topology`, from the first source that is set.

    Sources in order: explicit ``rank``/``world_size``; ``accelerator``; an initialised
    ``torch.distributed`` (torchrun, DeepSpeed); Horovod (``horovod.torch``, once initialised).
    Any later source that is set must agree, else :class:`~arrowstream.TopologyError`; except
    that with ``plan_locally`` explicit values stand alone (a dataset of some ranks only, such as
    ``rank=0, world_size=1`` for evaluation on rank 0 under torchrun).

    Example:
        >>> resolve_topology(rank=1, world_size=4)
        Topology(rank=1, world_size=4, source='explicit', group_size=1)
    """
    rank = None if rank is None else check_int("rank", rank, 0)
    world_size = None if world_size is None else check_int("world_size", world_size, 1)
    if (rank is None) != (world_size is None):
        raise InvalidArgumentError(f"rank/world_size: pass both or neither (got rank={rank}, world_size={world_size})")
    found: list[tuple[str, tuple[int, int]]] = []
    if rank is not None and world_size is not None:
        found.append(("explicit rank/world_size", (rank, world_size)))
    if accelerator is not None and not (plan_locally and found):
        found.append(("accelerator", _accelerate(accelerator)))
    for name, probe in (("torch.distributed", _torch_distributed), ("horovod", _horovod)):
        values = None if plan_locally and found else probe()
        if values is not None:
            found.append((name, values))
    if not found:
        launched = os.environ.get("WORLD_SIZE", "1")
        if launched.isdigit() and int(launched) > 1:
            raise TopologyError(
                f"this process was launched as one of WORLD_SIZE={launched} processes (RANK="
                f"{os.environ.get('RANK', '?')}), but torch.distributed is not initialised and no rank was "
                "given: every rank would read every row. Call torch.distributed.init_process_group() before "
                "building the dataset, or pass rank= and world_size= (or accelerator=)")
        found.append(("single process", (0, 1)))
    source, (rank, world_size) = found[0]
    for other, values in found[1:]:
        if values != (rank, world_size):
            raise TopologyError(
                f"rank/world_size disagree: {source} says rank {rank} of {world_size}, {other} says rank "
                f"{values[0]} of {values[1]}; pass the global rank and world size (not a local rank), or leave "
                "rank/world_size unset to take them from the launcher (or pass plan_locally=True for a dataset of "
                "this rank alone, e.g. rank=0, world_size=1 for evaluation)")
    if world_size > MAX_WORLD_SIZE:
        raise InvalidArgumentError(
            f"rank/world_size: world_size={world_size} (from {source}) is above {MAX_WORLD_SIZE:,} (2**20), the most "
            "ranks arrowstream plans for; pass the number of processes of the job (not a product with workers)")
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank/world_size: need 0 <= rank < world_size, got rank={rank}, "
                                   f"world_size={world_size} (from {source})")
    if world_size % check_int("group_size", group_size, 1):
        raise InvalidArgumentError(f"group_size: {group_size} does not divide world_size={world_size}; groups "
                                   "are consecutive ranks that read the same data")
    return Topology(rank, world_size, source.split()[0], group_size)
