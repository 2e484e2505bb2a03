"""Measurement: counters, the stall report, the hang watchdog, the autotuner, the hooks passes publish to.

``chute.observe`` is this package, and it is callable: ``chute.observe(iterable)``
is :func:`chute.observe.consumer.observe` (measure whether any loop of batches
waits for data). One object, so importing a submodule
(``from chute.observe.report import Report``) never changes what
``chute.observe`` is.
"""

import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from chute.observe.autotune import Decision
from chute.observe.consumer import Observed, observe
from chute.observe.counters import Counters
from chute.observe.hooks import Hook, Hooks
from chute.observe.report import Report, StageReport

__all__ = ["Counters", "Decision", "Hook", "Hooks", "Observed", "Report", "StageReport", "observe"]


class _Package(types.ModuleType):
    """The package's module type: calling it is calling :func:`observe`."""

    def __call__(self, iterable: Iterable[Any], *, samples: Callable[[Any], int] | None = None) -> Observed:
        return observe(iterable, samples=samples)


sys.modules[__name__].__class__ = _Package
