"""What the converters of dict samples share: the plan of their columns, and ``cast=True``'s rounding.

The samples are summarised as ``{"data": content}`` (:mod:`chute.format.infer`):
a record dict's keys become columns of their own (``data`` is "hoisted"),
anything else stays the column ``data``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from chute.format.infer import Column, InferenceError, Summary, plan
from chute.format.schema import ColumnType, Nullable, Ragged, Scalar, Tensor
from chute.sources._hints import from_inference

DATA_COLUMN = "data"


def plan_columns(summary: Summary, declared: Mapping[str, ColumnType], reserved: list[str], places: list[str], api: str) -> list[Column]:
    """The content's columns, or the error naming the first sample (by ``places``) that does not fit, with the fix."""
    try:
        return plan(summary, {k: v for k, v in declared.items() if k not in reserved}, hoist=DATA_COLUMN, reserved=reserved)
    except InferenceError as exc:
        detail = re.sub(r"\bsample (\d+)", lambda m: places[int(m.group(1))], exc.detail)
        raise from_inference(exc, detail, api, declared=declared) from None


def rounding(schema: Mapping[str, ColumnType]) -> dict[str, str]:
    """For ``cast=True``: the float dtype of each float array or scalar column (values are rounded to it)."""
    out = {}
    for name, ctype in schema.items():
        inner = ctype.value if isinstance(ctype, Nullable) else ctype
        if isinstance(inner, (Tensor, Ragged, Scalar)) and inner.dtype.startswith("float"):
            out[name] = inner.dtype
    return out


def rounded(sample: dict[str, Any], rounds: dict[str, str] | None) -> dict[str, Any]:
    """``sample`` with its float values rounded to their columns' dtypes (``cast=True``)."""
    if rounds:
        for name, dtype in rounds.items():
            sample[name] = _round(sample[name], dtype)
    return sample


def _round(value: Any, dtype: str) -> Any:
    if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.dtype.name != dtype:
        return value.astype(dtype)
    if isinstance(value, list) and value and all(isinstance(v, float) for v in value):
        return np.asarray(value, dtype=dtype)
    if isinstance(value, (float, np.floating)) and not isinstance(value, np.dtype(dtype).type):
        return np.dtype(dtype).type(value)
    return value
