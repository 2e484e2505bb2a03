"""The hook seam: a pass tells whoever listens what happens to it, without knowing who listens.

A Loader has one :class:`Hooks`; its passes publish to it, observers subscribe
with :meth:`Hooks.add` (the Loader's own meter, the report's windows, a user's
logger). Two events:

* ``pass_event(run, event, before, after)``: a pass took a lifecycle event
  (``chute/pipeline/lifecycle.py``; events and states are passed by their string
  values, ``"start"``, ``"running"``, ...): the pass started, delivered its last
  batch, ended, failed, was closed, moved, restarted. A few per pass.
* ``batch(run, step, waited_ns, rows)``: the loop received batch ``step`` after
  waiting ``waited_ns`` for it. Published only while a hook that defines it is
  subscribed: with none, the pass's per-batch path makes no call for it.

The always-on counters and the trace are not hooks: they are attribute updates
written inline in the pass's stream (``chute/pipeline/run.py``), because a call
per batch per observer would break the hot path's budget of Python calls per
batch (``tests/pipeline/test_calls.py``). What reads them (the report, the
autotuner, the trace writer) reads the counters, never the pass.

A hook that raises does not stop the pass: the error is logged and the hook
is removed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

log = logging.getLogger("chute")


class Hook:
    """Base class of an observer: override the events it wants (each is a no-op here)."""

    def pass_event(self, run: Any, event: str, before: str, after: str) -> None:
        """``run`` took ``event`` and moved from state ``before`` to ``after`` (possibly the same)."""

    def batch(self, run: Any, step: int, waited_ns: int, rows: int) -> None:
        """The loop received batch ``step`` of ``run`` (``rows`` samples) after waiting ``waited_ns``."""


class Hooks:
    """The observers of one Loader, and the fan-out of its events to them."""

    def __init__(self) -> None:
        self._hooks: list[Hook] = []
        #: The hooks that want ``batch`` events (the pass's stream checks this list, no call when empty).
        self.per_batch: list[Hook] = []

    def add(self, hook: Hook) -> Callable[[], None]:
        """Subscribe ``hook``; returns a function that unsubscribes it."""
        self._hooks.append(hook)
        if type(hook).batch is not Hook.batch:
            self.per_batch.append(hook)
        return lambda: self.remove(hook)

    def remove(self, hook: Hook) -> None:
        for hooks in (self._hooks, self.per_batch):
            if hook in hooks:
                hooks.remove(hook)

    def pass_event(self, run: Any, event: str, before: str, after: str,
                   _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        for hook in list(self._hooks):
            try:
                hook.pass_event(run, event, before, after)
            except Exception:
                if _finalizing():  # an iterator collected at interpreter exit: modules are being torn down
                    return
                self._drop(hook)

    def batch(self, run: Any, step: int, waited_ns: int, rows: int) -> None:
        for hook in list(self.per_batch):
            try:
                hook.batch(run, step, waited_ns, rows)
            except Exception:
                self._drop(hook)

    def _drop(self, hook: Hook) -> None:
        log.exception("chute: the hook %r raised; it is removed", hook)
        self.remove(hook)
