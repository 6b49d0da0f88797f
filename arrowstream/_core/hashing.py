"""Stable pseudo-randomness: splitmix64 on numpy uint64, the same on every machine and release.

numpy's ``Generator`` streams may change between numpy versions; a checkpoint must resume
to the same order after an upgrade, so the orders here are built from plain integer
arithmetic that never changes. :func:`fingerprint` is the stable digest of a JSON-able value
(a plan's files, an option) that states compare on resume.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

_MASK = (1 << 64) - 1


def _mix_scalar(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """Fold integers (seed, epoch, slot, ...) into one 64-bit seed; order matters."""
    h = 0x6A09E667F3BCC908
    for part in parts:
        h = _mix_scalar(h ^ _mix_scalar(part & _MASK))
    return h


def mix64(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 finalizer, vectorized; wraps modulo 2**64 by design."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    _finish_mix(z)
    return z


def _finish_mix(z: npt.NDArray[np.uint64]) -> None:
    """:func:`mix64` after its first addition, in place (no temporaries but one: this runs for every batch
    of a mixture)."""
    shifted = z >> np.uint64(30)
    z ^= shifted
    z *= np.uint64(0xBF58476D1CE4E5B9)
    np.right_shift(z, np.uint64(27), out=shifted)
    z ^= shifted
    z *= np.uint64(0x94D049BB133111EB)
    np.right_shift(z, np.uint64(31), out=shifted)
    z ^= shifted


def derive_seeds(last: npt.NDArray[np.uint64], *parts: int) -> npt.NDArray[np.uint64]:
    """:func:`derive_seed` of ``(*parts, x)`` for each ``x`` of ``last`` (unsigned 64-bit), vectorized."""
    prefix = 0x6A09E667F3BCC908
    for part in parts:
        prefix = _mix_scalar(prefix ^ _mix_scalar(part & _MASK))
    seeds = mix64(last)
    seeds ^= np.uint64(prefix)
    seeds += np.uint64(0x9E3779B97F4A7C15)
    _finish_mix(seeds)
    return seeds


def permutation(n: int, seed: int) -> npt.NDArray[np.int64]:
    """A pseudo-random permutation of ``range(n)``, a pure function of ``(n, seed)``.

    The sort keys are distinct (``mix64`` is a bijection of 64-bit integers, and so is ``^ seed``),
    so every sorting algorithm gives the same order and the fastest one can be used.
    """
    keys = mix64(np.arange(n, dtype=np.uint64) ^ np.uint64(seed & _MASK))
    return np.argsort(keys).astype(np.int64, copy=False)


def permutation_part(n: int, seed: int, start: int, stop: int) -> npt.NDArray[np.int64]:
    """The values of ``permutation(n, seed)[start:stop]`` in ascending order, not in the permutation's:
    the keys of those places selected (a partition, not a sort; a dynamic ledger sums what a shuffle
    window hands out from a place to another, ``arrowstream._state.ledger_rows``)."""
    if start >= stop:
        return np.zeros(0, dtype=np.int64)
    keys = mix64(np.arange(n, dtype=np.uint64) ^ np.uint64(seed & _MASK))
    placed = np.partition(keys, (start, stop - 1))
    low, high = placed[start], placed[stop - 1]
    return np.flatnonzero((keys >= low) & (keys <= high))   # distinct keys: exactly stop - start of them


def permutations(n: int, seeds: Sequence[int] | npt.NDArray[np.uint64],
                 index_bits: int | None = None) -> npt.NDArray[np.int64]:
    """:func:`permutation` of ``range(n)`` for each of ``seeds``, as the rows of one array, computed together
    (a mixture mixes every batch of a span, a few thousand permutations of an epoch).

    Sorting values is faster than sorting indices: each key's low ``index_bits`` bits (enough for ``n``)
    are replaced by its index, and the sorted values give the order of the keys wherever no two keys of a
    row agree on the bits above; a row where two do is argsorted, as :func:`permutation` does.
    """
    seeds = seeds if isinstance(seeds, np.ndarray) else np.array([s & _MASK for s in seeds], dtype=np.uint64)
    index = np.arange(n, dtype=np.uint64)
    keys = index[None, :] ^ seeds[:, None]
    keys += np.uint64(0x9E3779B97F4A7C15)
    _finish_mix(keys)
    bits = max((n - 1).bit_length(), 1) if index_bits is None else index_bits
    low = np.uint64((1 << bits) - 1)
    packed = keys & ~low
    packed |= index
    packed.sort(axis=1)
    orders = (packed & low).astype(np.int64)
    # two neighbours that agree above the index bits: that row's order is not the keys' order yet
    np.bitwise_xor(packed[:, 1:], packed[:, :-1], out=packed[:, 1:])
    for row in np.flatnonzero((packed[:, 1:] <= low).any(axis=1)):
        orders[row] = np.argsort(keys[row])
    return orders


def fingerprint(payload: Any) -> str:
    """A short, stable digest of a JSON-able value."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
