"""The life of one pass, as a state machine: its states, the events that move it, and what follows.

A pass is made by ``iter(loader)`` (``NEW``), starts at its first ``next()``
(``RUNNING``) and ends one way: its last batch is delivered (``FINISHED``), the
loop leaves it (``LEFT``), it raises (``FAILED``), or it is ended from outside
by a newer pass or ``Loader.close()`` (``CLOSED``). ``set_epoch`` and
``load_state_dict`` during a pass take the position away from it (``MOVED``
while it runs, ``RETIRED`` once it ended); a mixture's ``set_weights`` during a
pass has its stream rebuild the stages from what the loop received
(``RESTARTING``), as does the Loader when a gather-only pass that started on
the worker threads turns out to be data-bound (``NATIVE``: the rest of it runs
on the native gather threads). Pure: no threads, no I/O; the Loader and the
pass's stream apply the transitions (``Pass.on``) and the action that comes
with them.

The whole table is :data:`TABLE`; an event missing from a state's row cannot
happen there, and :func:`after` raises :class:`LifecycleError` (a bug in chute).
"""

from __future__ import annotations

import enum

from chute.errors import ChuteError


class State(enum.Enum):
    NEW = "new"  # made by iter(), nothing started; not yet the loader's pass
    RUNNING = "running"  # stages started, batches flowing; the pass holds the loader's position
    RESTARTING = "restarting"  # set_weights: the stream rebuilds its stages before its next batch
    MOVED = "moved"  # still running, but set_epoch / load_state_dict moved the loader's position since it began
    FINISHED = "finished"  # its last batch was delivered (the epoch advanced, unless MOVED before)
    LEFT = "left"  # the stream ended before the last batch (the loop broke out, the iterator was closed)
    FAILED = "failed"  # the stream raised (a batch's error, a stall, the channel closed under it)
    CLOSED = "closed"  # ended from outside: a newer pass started, or Loader.close()
    RETIRED = "retired"  # ended, and the loader's position was set since: nothing of it counts any more


class Event(enum.Enum):
    START = "start"  # the first next(): stages built, threads started
    LAST = "last"  # the last batch was delivered to the loop
    END = "end"  # the stream ended without error (exhausted or closed)
    FAIL = "fail"  # the stream raised
    CLOSE = "close"  # ended from outside (a newer pass, Loader.close())
    SET_POSITION = "set_position"  # set_epoch / load_state_dict
    SET_WEIGHTS = "set_weights"  # a mixture's new weights
    NATIVE = "native"  # a gather-only pass on the worker threads, and the loop waits for data: to the native threads
    RESTARTED = "restarted"  # the stream rebuilt its stages after SET_WEIGHTS or NATIVE


class Action(enum.Enum):
    NONE = "none"
    ADVANCE = "advance"  # the loader's next pass runs the next epoch, from its start
    RESTART = "restart"  # the stream rebuilds its stages from the position the loop received


class LifecycleError(ChuteError):
    """An event that cannot happen in the pass's state: a bug in chute (please report it)."""


S, E, A = State, Event, Action
_STAY = A.NONE

#: (state, event) -> (next state, action). A pair that is not here cannot happen.
TABLE: dict[tuple[State, Event], tuple[State, Action]] = {
    (S.NEW, E.START): (S.RUNNING, _STAY),
    (S.NEW, E.CLOSE): (S.CLOSED, _STAY),
    (S.NEW, E.SET_POSITION): (S.NEW, _STAY),  # the pass keeps the position iter() gave it
    (S.NEW, E.SET_WEIGHTS): (S.NEW, _STAY),  # its stages are built with the new weights
    (S.RUNNING, E.LAST): (S.FINISHED, A.ADVANCE),
    (S.RUNNING, E.END): (S.LEFT, _STAY),
    (S.RUNNING, E.FAIL): (S.FAILED, _STAY),
    (S.RUNNING, E.CLOSE): (S.CLOSED, _STAY),
    (S.RUNNING, E.SET_POSITION): (S.MOVED, _STAY),
    (S.RUNNING, E.SET_WEIGHTS): (S.RESTARTING, A.RESTART),
    (S.RUNNING, E.NATIVE): (S.RESTARTING, A.RESTART),  # (the stream sends it only to a running pass)
    (S.RESTARTING, E.START): (S.RESTARTING, _STAY),  # the stream starts the new stages ...
    (S.RESTARTING, E.RESTARTED): (S.RUNNING, _STAY),  # ... and goes on
    (S.RESTARTING, E.END): (S.LEFT, _STAY),
    (S.RESTARTING, E.FAIL): (S.FAILED, _STAY),
    (S.RESTARTING, E.CLOSE): (S.CLOSED, _STAY),
    (S.RESTARTING, E.SET_POSITION): (S.MOVED, _STAY),
    (S.RESTARTING, E.SET_WEIGHTS): (S.RESTARTING, A.RESTART),
    (S.MOVED, E.LAST): (S.FINISHED, _STAY),  # the position set since wins over the pass's end
    (S.MOVED, E.END): (S.RETIRED, _STAY),
    (S.MOVED, E.FAIL): (S.RETIRED, _STAY),
    (S.MOVED, E.CLOSE): (S.RETIRED, _STAY),
    (S.MOVED, E.SET_POSITION): (S.MOVED, _STAY),
    (S.MOVED, E.SET_WEIGHTS): (S.MOVED, _STAY),  # the next pass starts from the set position, with the new weights
    (S.FINISHED, E.LAST): (S.FINISHED, _STAY),  # with a device: the loop's side sees the end after the host's
    (S.FINISHED, E.END): (S.FINISHED, _STAY),
    (S.FINISHED, E.FAIL): (S.FINISHED, _STAY),
    (S.FINISHED, E.CLOSE): (S.FINISHED, _STAY),
    (S.FINISHED, E.SET_POSITION): (S.FINISHED, _STAY),
    (S.FINISHED, E.SET_WEIGHTS): (S.FINISHED, _STAY),
    (S.LEFT, E.CLOSE): (S.LEFT, _STAY),
    (S.LEFT, E.SET_POSITION): (S.RETIRED, _STAY),
    (S.LEFT, E.SET_WEIGHTS): (S.LEFT, _STAY),
    (S.FAILED, E.CLOSE): (S.FAILED, _STAY),
    (S.FAILED, E.SET_POSITION): (S.RETIRED, _STAY),
    (S.FAILED, E.SET_WEIGHTS): (S.FAILED, _STAY),
    (S.CLOSED, E.LAST): (S.CLOSED, _STAY),  # a batch already on the device when the pass was closed
    (S.CLOSED, E.END): (S.CLOSED, _STAY),
    (S.CLOSED, E.FAIL): (S.CLOSED, _STAY),
    (S.CLOSED, E.CLOSE): (S.CLOSED, _STAY),
    (S.CLOSED, E.SET_POSITION): (S.RETIRED, _STAY),
    (S.CLOSED, E.SET_WEIGHTS): (S.CLOSED, _STAY),
    (S.RETIRED, E.LAST): (S.RETIRED, _STAY),
    (S.RETIRED, E.END): (S.RETIRED, _STAY),
    (S.RETIRED, E.FAIL): (S.RETIRED, _STAY),
    (S.RETIRED, E.CLOSE): (S.RETIRED, _STAY),
    (S.RETIRED, E.SET_POSITION): (S.RETIRED, _STAY),
    (S.RETIRED, E.SET_WEIGHTS): (S.RETIRED, _STAY),
}

#: The pass is delivering batches: ``len(loader)`` is the pass's length.
DELIVERING = frozenset({S.RUNNING, S.RESTARTING, S.MOVED})
#: The pass holds the loader's position: ``state_dict()`` is what the loop received from it.
HOLDS_POSITION = frozenset({S.RUNNING, S.RESTARTING, S.LEFT, S.FAILED, S.CLOSED})


def after(state: State, event: Event) -> tuple[State, Action]:
    """The state after ``event`` in ``state``, and what the Loader must do for it."""
    try:
        return TABLE[state, event]
    except KeyError:
        raise LifecycleError(f"a pass in state {state.name} cannot take the event {event.name} (a bug in chute: please report it)") from None


def delivering(state: State | None) -> bool:
    """Whether a pass in ``state`` is delivering batches (its length is the loader's)."""
    return state in DELIVERING


def holds_position(state: State | None) -> bool:
    """Whether the loader's position is what the loop received from a pass in ``state``."""
    return state in HOLDS_POSITION
