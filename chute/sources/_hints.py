"""Errors that say how to fix them, in the syntax of the interface in use.

A converter that fails for a reason an option would fix raises a
:class:`FixableError` holding that fix as options (``{"column_types": {"x":
chute.Ragged("float32", ndim=3)}}``, ``{"cast": True}``, ``{"path_column":
"file"}``). Its message says it in Python (``pass column_types={...}``);
``chute convert`` says it in flags (``add --column-type 'x=ragged(float32, 3)'``)
with :meth:`FixableError.render`. Tests apply the fix a message proposes and
check that the conversion then succeeds.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from chute.errors import ChuteError, SchemaError
from chute.format.infer import InferenceError
from chute.format.schema import ColumnType, Nullable, Tensor, spell

DATA_COLUMN = "data"


class FixableError(ChuteError):
    """A conversion error with the options that fix it (``fix``); ``detail`` says what went wrong."""

    def __init__(self, detail: str, fix: Mapping[str, Any], api: str = "convert()") -> None:
        self.detail, self.fix, self.api = detail, dict(fix), api
        super().__init__(self.render("api"))

    def render(self, style: str) -> str:
        """The message with the fix as Python arguments (``"api"``) or as ``chute convert`` flags (``"cli"``)."""
        if not self.fix:
            return self.detail
        if style == "cli":
            return f"{self.detail}; add {' '.join(cli_flags(self.fix))}"
        return f"{self.detail}; pass {', '.join(api_args(self.fix))} to {self.api}"


class FixableSchemaError(FixableError, SchemaError):
    """A :class:`FixableError` about the values (what ``chute.SchemaError`` catches)."""


def api_args(fix: Mapping[str, Any]) -> list[str]:
    """``fix`` as keyword arguments: ``column_types={'x': chute.Ragged('float32', ndim=3)}``."""
    out = []
    for name, value in fix.items():
        if name == "column_types":
            types = dict(value)
            if set(types) == {DATA_COLUMN}:
                out.append(f"data_type={spell(types[DATA_COLUMN])}")
                continue
            out.append("column_types={" + ", ".join(f"{k!r}: {spell(t)}" for k, t in types.items()) + "}")
        else:
            out.append(f"{name}={value!r}")
    return out


def cli_flags(fix: Mapping[str, Any]) -> list[str]:
    """``fix`` as ``chute convert`` flags, quoted for a shell: ``--column-type 'x=ragged(float32, 3)'``."""
    out = []
    for name, value in fix.items():
        flag = "--" + name.replace("_", "-")
        if name == "column_types":
            for column, ctype in dict(value).items():
                if column == DATA_COLUMN:
                    out.append(f"--data-type {shlex.quote(cli_type(ctype))}")
                else:
                    out.append(f"--column-type {shlex.quote(f'{column}={cli_type(ctype)}')}")
        elif value is True:
            out.append(flag)
        else:
            out.append(f"{flag} {shlex.quote(str(value))}")
    return out


def cli_type(ctype: ColumnType) -> str:
    """A column type as ``--column-type`` / ``--data-type`` take it: ``ragged(float32, 3)``."""
    if isinstance(ctype, Nullable):
        return f"nullable({cli_type(ctype.value)})"
    kind = ctype.kind
    if isinstance(ctype, Tensor):
        return f"tensor({ctype.dtype}, {tuple(ctype.shape)!r})"
    values = [str(v) for v in vars(ctype).values()] if hasattr(ctype, "__dict__") else []
    return f"{kind}({', '.join(values)})" if values else kind


def from_inference(exc: InferenceError, detail: str, api: str, *, declared: Mapping[str, ColumnType] | None = None) -> ChuteError:
    """The converter's error for a value that does not fit a column: the fix (a type, or ``cast``) as options.

    ``declared`` are the column types the caller already gave (kept in the fix, so applying it keeps them).
    """
    fix: dict[str, Any] = {}
    if exc.fix is not None:
        fix["column_types"] = {**dict(declared or {}), exc.column: exc.fix}
    if exc.cast:
        fix["cast"] = True
    if not fix:
        return SchemaError(detail)
    return FixableSchemaError(detail, fix, api)
