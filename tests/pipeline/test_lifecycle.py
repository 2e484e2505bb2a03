"""A pass's lifecycle as a table: every state x every event, and what len / state_dict read from each state.

The expected table is written out here independently of chute/pipeline/lifecycle.py: a
change to the rules must change both (and say why in its commit).
"""

from __future__ import annotations

import itertools

import pytest

from chute.pipeline.lifecycle import (
    TABLE,
    Action,
    Event,
    LifecycleError,
    State,
    after,
    delivering,
    holds_position,
)

S, E, A = State, Event, Action
X = None  # cannot happen: a LifecycleError

# One row per state; columns in this order:
EVENTS = (E.START, E.LAST, E.END, E.FAIL, E.CLOSE, E.SET_POSITION, E.SET_WEIGHTS, E.NATIVE, E.RESTARTED)
EXPECTED = {
    #               START         LAST           END         FAIL        CLOSE       SET_POSITION  SET_WEIGHTS    NATIVE         RESTARTED
    S.NEW:        (S.RUNNING,    X,             X,          X,          S.CLOSED,   S.NEW,        S.NEW,         X,             X),
    S.RUNNING:    (X,            S.FINISHED,    S.LEFT,     S.FAILED,   S.CLOSED,   S.MOVED,      S.RESTARTING,  S.RESTARTING,  X),
    S.RESTARTING: (S.RESTARTING, X,             S.LEFT,     S.FAILED,   S.CLOSED,   S.MOVED,      S.RESTARTING,  X,             S.RUNNING),
    S.MOVED:      (X,            S.FINISHED,    S.RETIRED,  S.RETIRED,  S.RETIRED,  S.MOVED,      S.MOVED,       X,             X),
    S.FINISHED:   (X,            S.FINISHED,    S.FINISHED, S.FINISHED, S.FINISHED, S.FINISHED,   S.FINISHED,    X,             X),
    S.LEFT:       (X,            X,             X,          X,          S.LEFT,     S.RETIRED,    S.LEFT,        X,             X),
    S.FAILED:     (X,            X,             X,          X,          S.FAILED,   S.RETIRED,    S.FAILED,      X,             X),
    S.CLOSED:     (X,            S.CLOSED,      S.CLOSED,   S.CLOSED,   S.CLOSED,   S.RETIRED,    S.CLOSED,      X,             X),
    S.RETIRED:    (X,            S.RETIRED,     S.RETIRED,  S.RETIRED,  S.RETIRED,  S.RETIRED,    S.RETIRED,     X,             X),
}
#: The only transitions that ask the Loader to act.
ACTIONS = {
    (S.RUNNING, E.LAST): A.ADVANCE,  # the epoch is over: the next pass runs the next one
    (S.RUNNING, E.SET_WEIGHTS): A.RESTART,
    (S.RESTARTING, E.SET_WEIGHTS): A.RESTART,
    (S.RUNNING, E.NATIVE): A.RESTART,  # a data-bound gather-only pass goes on on the native gather threads
}
#               len(loader) is the pass's   state_dict() is what the pass delivered
READS = {
    S.NEW:        (False, False),
    S.RUNNING:    (True, True),
    S.RESTARTING: (True, True),
    S.MOVED:      (True, False),  # set_epoch / load_state_dict during the pass: theirs wins
    S.FINISHED:   (False, False),  # the loader advanced to the next epoch
    S.LEFT:       (False, True),  # the next pass restarts where this one started; the state is what it delivered
    S.FAILED:     (False, True),
    S.CLOSED:     (False, True),
    S.RETIRED:    (False, False),
}


def test_the_expected_table_names_every_state_and_event():
    assert set(EXPECTED) == set(State) and set(READS) == set(State)
    assert set(EVENTS) == set(Event)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(State, Event)), ids=lambda v: v.name)
def test_every_state_and_event(state, event):
    expected = EXPECTED[state][EVENTS.index(event)]
    if expected is X:
        assert (state, event) not in TABLE
        with pytest.raises(LifecycleError, match=f"state {state.name} cannot take the event {event.name}"):
            after(state, event)
        return
    new, action = after(state, event)
    assert new is expected
    assert action is ACTIONS.get((state, event), A.NONE)


@pytest.mark.parametrize("state", list(State), ids=lambda v: v.name)
def test_what_len_and_state_dict_read(state):
    assert (delivering(state), holds_position(state)) == READS[state]


def test_no_pass_reads_the_loader():
    assert not delivering(None) and not holds_position(None)


def test_every_state_is_reachable_from_new():
    seen, frontier = {S.NEW}, [S.NEW]
    while frontier:
        state = frontier.pop()
        for (s, _), (new, _) in TABLE.items():
            if s is state and new not in seen:
                seen.add(new)
                frontier.append(new)
    assert seen == set(State)


def test_ended_states_never_run_again():
    ended = {S.FINISHED, S.LEFT, S.FAILED, S.CLOSED, S.RETIRED}
    for (state, _), (new, _) in TABLE.items():
        if state in ended:
            assert new in ended
