"""Measurement: counters, the stall report, the hang watchdog, the autotuner, the hooks passes publish to.

``chute.observe`` is this package, and it is callable: ``chute.observe(iterable)``
is :func:`chute.observe.consumer.observe` (measure whether any loop of batches
waits for data). One object, so importing a submodule
(``from chute.observe.report import Report``) never changes what
``chute.observe`` is.

The names below are resolved on first use (chute/_lazy.py): a Loader's first
batch loads the counters, hooks and autotuner it runs with, not the report
builder nor the consumer-side ``observe`` wrapper.
"""

import sys
import types
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from chute._lazy import exports

_EXPORTS = {
    "Counters": "chute.observe.counters",
    "Decision": "chute.observe.autotune",
    "Hook": "chute.observe.hooks",
    "Hooks": "chute.observe.hooks",
    "Observed": "chute.observe.consumer",
    "Report": "chute.observe.report",
    "StageReport": "chute.observe.report",
    "observe": "chute.observe.consumer",
}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from chute.observe.autotune import Decision as Decision
    from chute.observe.consumer import Observed as Observed, observe as observe
    from chute.observe.counters import Counters as Counters
    from chute.observe.hooks import Hook as Hook, Hooks as Hooks
    from chute.observe.report import Report as Report, StageReport as StageReport


class _Package(types.ModuleType):
    """The package's module type: calling it is calling :func:`observe`."""

    def __call__(self, iterable: Iterable[Any], *, samples: Callable[[Any], int] | None = None) -> "Observed":
        from chute.observe.consumer import observe

        return observe(iterable, samples=samples)


__getattr__, __dir__ = exports(__name__, _EXPORTS, globals())
sys.modules[__name__].__class__ = _Package
