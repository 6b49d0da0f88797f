"""Where this process stands among ranks: explicit, Accelerate, torch.distributed, Horovod."""

from __future__ import annotations

from typing import Any

from .errors import InvalidArgumentError, NotSupportedYetError


def resolve_topology(rank: int | None, world_size: int | None, accelerator: Any) -> tuple[int, int]:
    """``(rank, world_size)``; this release reads on one rank and refuses more, clearly."""
    if (rank is None) != (world_size is None):
        raise InvalidArgumentError(f"rank/world_size: pass both or neither (got rank={rank}, world_size={world_size})")
    if rank is None or world_size is None:
        rank, world_size = 0, 1
        if accelerator is not None:
            rank, world_size = int(accelerator.process_index), int(accelerator.num_processes)
        else:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank, world_size = dist.get_rank(), dist.get_world_size()
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidArgumentError(f"rank/world_size: need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if world_size > 1:
        raise NotSupportedYetError(
            f"world_size={world_size}: rank-aware reading is planned but not in this release; every rank "
            "would read the whole dataset, so arrowstream refuses instead of duplicating data")
    return rank, world_size
