"""Checking a saved loader state before it is used (``Loader.load_state_dict``).

A state comes from a checkpoint file: it may be from another program, an older
chute, or damaged. What a resume needs of it is checked here, in one pure
function, so a bad state is one :class:`chute.ChuteError` saying which key is
missing or wrong, never a bare ``KeyError`` from deep inside the order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chute.errors import ChuteError

REQUIRED = ("epoch", "consumed")
"""Keys every loader state has; a mixture's and a progressive loader's add their own."""


def check_state(state: Any, required: tuple[str, ...] = REQUIRED) -> dict[str, Any]:
    """``state`` as a dict, once it is a mapping holding ``required`` keys with whole, non-negative
    ``epoch`` and ``consumed``; a ChuteError naming what is wrong otherwise."""
    advice = "pass what Loader.state_dict() returned (saved with torch.save or json), unchanged"
    if not isinstance(state, Mapping):
        raise ChuteError(f"cannot resume: the loader state is a {type(state).__name__}, not a dict; {advice}")
    missing = [key for key in required if key not in state]
    if missing:
        raise ChuteError(f"cannot resume: the loader state lacks {', '.join(map(repr, missing))} "
                         f"(it has {sorted(map(str, state))}); {advice}")
    for key in ("epoch", "consumed"):
        value = state.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) and not (hasattr(value, "__index__") and not isinstance(value, float)):
            raise ChuteError(f"cannot resume: the loader state's {key!r} is {value!r}, not a whole number; {advice}")
        if int(value) < 0:
            raise ChuteError(f"cannot resume: the loader state's {key!r} is {value}, below 0; {advice}")
    return dict(state)
