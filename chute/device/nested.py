"""Nested batches: apply a function to every tensor inside dicts, lists, tuples, namedtuples and dataclasses."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import torch

_ATOMS = frozenset({str, bytes, int, float, bool, complex, type(None)})  # never hold tensors


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """Return ``batch`` with ``fn`` applied to every tensor in it.

    Recurses into mappings, lists, tuples, namedtuples and dataclass instances
    and rebuilds each with its own type (a ``defaultdict`` keeps its factory, a
    frozen dataclass stays frozen, ``__post_init__`` is not run again).
    Strings, ``None``, numbers, arrays and any other object pass through as the
    same object. A container in which no tensor changed is returned as is, so
    ``map_tensors(lambda t: t, batch) is batch``.
    """
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if type(batch) in _ATOMS or isinstance(batch, (str, bytes)):
        return batch
    if isinstance(batch, Mapping):
        changed = {}
        for key, value in batch.items():
            new = map_tensors(fn, value)
            if new is not value:
                changed[key] = new
        if not changed:
            return batch
        if type(batch) is dict:
            return {key: changed.get(key, value) for key, value in batch.items()}
        if isinstance(batch, MutableMapping):
            out = copy.copy(batch)
            out.update(changed)
            return out
        maker: Any = type(batch)  # a Mapping subclass that takes a dict, as dict does
        return maker({key: changed.get(key, value) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        items = [map_tensors(fn, value) for value in batch]
        if all(new is old for new, old in zip(items, batch)):
            return batch
        if type(batch) is list:
            return items
        if type(batch) is tuple:
            return tuple(items)
        if isinstance(batch, tuple) and hasattr(type(batch), "_fields"):
            return type(batch)(*items)  # namedtuple
        return type(batch)(items)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changed = {}
        for field in dataclasses.fields(batch):
            value = getattr(batch, field.name)
            new = map_tensors(fn, value)
            if new is not value:
                changed[field.name] = new
        if not changed:
            return batch
        # copy + setattr rather than dataclasses.replace: replace() re-runs
        # __init__/__post_init__ and cannot set init=False fields.
        copied = copy.copy(batch)
        for name, value in changed.items():
            object.__setattr__(copied, name, value)
        return copied
    return batch
