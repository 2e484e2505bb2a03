"""``chute convert --data-type TEXT``: column types written as text, parsed and never evaluated."""

from __future__ import annotations

import pytest

import chute
from chute.sources._column_type import parse_column_type


@pytest.mark.parametrize(
    "text, expected",
    [
        ("json", chute.Json()),
        ("Bytes", chute.Bytes()),
        ("str", chute.String()),
        ("string()", chute.String()),
        ("scalar(int64)", chute.Scalar("int64")),
        ("map", chute.Map("string")),
        ("map(json)", chute.Map("json")),
        ("ragged(float32, 2)", chute.Ragged("float32", 2)),
        ("ragged(float32)", chute.Ragged("float32", 1)),
        ('chute.Ragged("int16", ndim=2)', chute.Ragged("int16", 2)),
        ("tensor(uint8, (3, 32, 32))", chute.Tensor("uint8", (3, 32, 32))),
        (" Tensor('float32', [4]) ", chute.Tensor("float32", (4,))),
    ],
)
def test_spellings(text, expected):
    assert parse_column_type(text) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("ragged(float32", "cannot read 'ragged(float32' as a column type; write one of json, bytes, string"),
        ("list(int)", "'list(int)' is not a column type; write one of json"),
        ("os.system('x')", "is not a column type"),
        ("__import__('os')", "is not a column type"),
        ("tensor(float32, 5)", "'tensor(float32, 5)' is not a valid Tensor column type"),
        ("scalar(float128)", "is not a valid Scalar column type (unsupported dtype 'float128'"),
        ("ragged(float32, open('x'))", "is not a valid Ragged column type"),
    ],
)
def test_what_is_refused(text, message):
    with pytest.raises(ValueError) as info:
        parse_column_type(text)
    assert message in str(info.value)
