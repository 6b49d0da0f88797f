"""``arrowstream state show CKPT``: what a checkpoint file says (:mod:`arrowstream._tools.describe`).

Without the data, the counts that follow from the plan (each rank's rows of the epoch, with several ranks)
are unknown and the columns read are a hash (a state stays small: it holds no names). With the data,
``--path DATA`` (and ``--storage-option``, ``--parse-option`` as the run had them), the dataset is built
with the checkpoint's own options (format, batch size, shuffle, seed, buffer, world size, planning
version) and checked against the state as ``load_state_dict`` checks it; its plan gives each rank's
rows, and the column names come from ``--columns`` or are found among the data's columns (in their
schema order) by the state's hash.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

from .._core.fields import shorten
from .._core.hashing import fingerprint
from ..errors import InvalidArgumentError
from .describe import describe_state, format_state

MAX_SEARCHED_COLUMNS = 16   # up to this many columns every list in schema order is tried; beyond, one or two


def load_checkpoint_file(path: str, trust_pickle: bool = False) -> Any:
    """The object a checkpoint file holds: JSON for ``.json``, else ``torch.load(weights_only=True)`` (a
    state is JSON types, which it loads), falling back to JSON for a file torch does not read."""
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"CKPT: no such file {shorten(path)}; give a torch.save file or a .json file "
                                   "that holds loader.state_dict()")
    if path.endswith(".json"):
        return _load_json(path)
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as exc:
        text = " ".join(str(exc).split())
        reason = text.partition("WeightsUnpickler error:")[2].strip() or text
        if "Unsupported global" not in reason:  # not a pickle torch wrote: maybe JSON without its suffix
            return _load_json(path, f" nor a torch.save file ({shorten(reason, 120)})")
        raise InvalidArgumentError(
            f"CKPT: {shorten(path)} holds objects that torch.load(weights_only=True) refuses "
            f"({shorten(reason.split(' was not an allowed')[0], 160)}); if you trust the file, pass --trust-pickle, "
            "or save the loader state where torch.load(weights_only=True) reads it") from None
    except (AttributeError, ImportError) as exc:  # --trust-pickle: a class of the script that saved it
        raise InvalidArgumentError(f"CKPT: unpickling {shorten(path)} needs code this process does not have "
                                   f"({shorten(str(exc), 120)}); save the loader state where "
                                   "torch.load(weights_only=True) reads it") from None
    except (RuntimeError, EOFError, OSError) as exc:
        return _load_json(path, f" nor a torch.save file ({shorten(' '.join(str(exc).split()), 120)})")


def _load_json(path: str, why: str = "") -> Any:
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"CKPT: {shorten(path)} is not JSON ({shorten(str(exc), 120)}){why}; give a "
                                   "torch.save file or a .json file that holds loader.state_dict()") from None


def run_show(args: Any) -> int:
    """``arrowstream state show CKPT [--path DATA ...] [--json] [--at PATH]``."""
    checkpoint = load_checkpoint_file(args.ckpt, args.trust_pickle)
    dataset = None if args.path is None else dataset_for(describe_state(checkpoint, at=args.at), args)
    description = describe_state(checkpoint, dataset=dataset, at=args.at)
    print(json.dumps(description, indent=2) if args.json else format_state(description))
    return 0


def dataset_for(description: dict[str, Any], args: Any) -> Any:
    """The dataset of ``--path`` built as the described checkpoint's run built it (its options, its world
    size and planning version), for the counts that need the plan."""
    from ..dataset import StructuredDataset
    from .cli_args import key_values

    options = description["options"]
    if description["reads"] == "mixture":
        raise InvalidArgumentError("--path: a mixture's checkpoint holds its epoch's rows (its quotas) and its sources' "
                                   "data; leave --path out")
    if description["source"] == "iceberg":
        raise InvalidArgumentError("--path: the checkpoint was taken on an Iceberg table, not files; describe it in "
                                   "Python with describe_state(state, dataset=IcebergDataset(...))")
    if not options:
        raise InvalidArgumentError("--path: the checkpoint holds no worker state yet (taken before its first batch), "
                                   "so nothing to count against the data; leave --path out")
    if options.get("filter") is not None:
        raise InvalidArgumentError(
            "--path: the checkpoint's run had a filter, which the state holds as a hash only (no expression to "
            "build the dataset with); describe it in Python with describe_state(state, dataset=...) built with "
            "that filter")
    if options.get("parse_options") is not None and not args.parse_option:
        raise InvalidArgumentError(
            "--parse-option: the checkpoint's run read its text files with parse options, which the state holds as "
            f"a hash only ({options['parse_options']}); pass them as the run did (--parse-option KEY=VALUE, "
            "repeatable)")
    kwargs: dict[str, Any] = {
        "format": options["format"], "batch_size": options["batch_size"],
        "shuffle": options["shuffle"], "seed": options["seed"], "shuffle_buffer_size": options["shuffle_buffer_size"],
        "interleave": options["interleave"], "drop_last": options["drop_last"], "split_bytes": options["split_bytes"],
        "even_batches": options.get("even_batches", True), "rank": 0,
        "world_size": description["topology"]["world_size"],
        "storage_options": key_values(args.storage_option),
        "parse_options": key_values(args.parse_option, "--parse-option"),
    }
    if "assignment" in options:
        kwargs["assignment"] = options["assignment"]
    if options.get("order") == "canonical":
        kwargs.update(order="canonical", canonical_slots=options["canonical_slots"])
    digest = options.get("columns")
    columns = args.columns.split(",") if args.columns else None
    if columns is not None and digest is not None and _digest(columns) != digest:
        raise InvalidArgumentError(
            f"--columns: {','.join(columns)} are not the columns the checkpoint read (hash {_digest(columns)}, the "
            f"state's {digest}); pass the run's columns= in its order, or leave --columns out to find them "
            "among the data's columns")
    if columns is None and digest is not None:
        names = StructuredDataset(args.path, columns=None, **kwargs).schema.names
        columns = columns_of(digest, names)
        if columns is None:
            raise InvalidArgumentError(
                f"--columns: the checkpoint read columns the state holds as a hash ({digest}), and no list of the "
                f"data's columns in their schema order has it; pass --columns as the run's columns= named them, "
                "in that order")
    dataset = StructuredDataset(args.path, columns=columns, **kwargs)
    dataset.use_planning(options["planning"])
    return dataset


def _digest(columns: Sequence[str]) -> str:
    """The hash a state holds for ``columns=`` (``Options.state_options``)."""
    return fingerprint(list(columns))[:16]


def _candidates(names: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Lists of ``names`` in their order: all of them for a few columns, else those of one or two."""
    most = len(names) if len(names) <= MAX_SEARCHED_COLUMNS else 2
    return itertools.chain.from_iterable(itertools.combinations(names, size) for size in range(1, most + 1))


def columns_of(digest: str, names: Sequence[str]) -> list[str] | None:
    """The columns, among ``names`` in their order, whose hash is ``digest`` (None when none is).

    Example:
        >>> columns_of(_digest(["id", "score"]), ["id", "text", "score"])
        ['id', 'score']
    """
    return next((list(c) for c in _candidates(names) if _digest(c) == digest), None)
