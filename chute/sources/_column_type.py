"""A column type written as text (``chute convert --data-type 'ragged(float32, 2)'``).

The text is the Python spelling of a :mod:`chute.format.schema` type, with or
without the ``chute.`` prefix and quotes, in any case: ``json``, ``bytes``,
``string``, ``scalar(int64)``, ``map(json)``, ``ragged(float32, 2)``,
``tensor(uint8, (3, 32, 32))``, ``chute.Ragged("int16", ndim=2)``,
``nullable(tensor(float32, (3,)))``. It is parsed, never evaluated.
``--column-type`` takes ``NAME=TYPE`` (:func:`parse_named_column_type`).
"""

from __future__ import annotations

import ast
from typing import Any

from chute.errors import SchemaError
from chute.format.schema import Bytes, ColumnType, Json, Map, Nullable, Ragged, Scalar, String, Tensor

TYPES: dict[str, type] = {
    "tensor": Tensor,
    "ragged": Ragged,
    "scalar": Scalar,
    "bytes": Bytes,
    "string": String,
    "str": String,
    "map": Map,
    "json": Json,
    "nullable": Nullable,
}
EXAMPLES = "json, bytes, string, scalar(int64), map(string), ragged(float32, 2), tensor(uint8, (3, 32, 32))"


def parse_column_type(text: str) -> ColumnType:
    """The column type ``text`` spells; ValueError saying what is accepted if it spells none."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"cannot read {text!r} as a column type; write one of {EXAMPLES}") from None
    return _parse_node(node, text)


def parse_named_column_type(text: str) -> tuple[str, ColumnType]:
    """``NAME=TYPE`` (``--column-type 'x=ragged(float32, 3)'``): the column's name and type."""
    name, sep, spelled = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"write a column type as NAME=TYPE, e.g. 'x=ragged(float32, 3)', got {text!r}")
    return name.strip(), parse_column_type(spelled)


def _parse_node(node: ast.AST, text: str) -> ColumnType:
    call = node if isinstance(node, ast.Call) else None
    name = _name(call.func if call else node)
    cls = TYPES.get((name or "").lower())
    if cls is None:
        raise ValueError(f"{text!r} is not a column type; write one of {EXAMPLES}")
    try:
        if cls is Nullable:
            if not call or len(call.args) != 1:
                raise ValueError("nullable takes one column type, e.g. nullable(scalar(int64))")
            return Nullable(_parse_node(call.args[0], text))  # type: ignore[arg-type]  # Nullable checks what it wraps
        args = [_literal(a) for a in call.args] if call else []
        kwargs: dict[Any, Any] = {k.arg: _literal(k.value) for k in call.keywords} if call else {}
        return cls(*args, **kwargs)
    except (ValueError, TypeError, SchemaError) as exc:
        raise ValueError(f"{text!r} is not a valid {cls.__name__} column type ({exc}); e.g. {EXAMPLES}") from None


def _name(node: ast.AST) -> str | None:
    """``ragged`` for ``ragged`` and for ``chute.Ragged``; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "chute":
        return node.attr
    return None


def _literal(node: ast.AST) -> Any:
    """A literal argument; a bare name (``float32``) is the string of that name."""
    if isinstance(node, ast.Name):
        return node.id
    return ast.literal_eval(node)
