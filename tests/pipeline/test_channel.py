"""The one hand-off: steps come out in order, a double put is an error, a closed channel drops quietly."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

from chute._channel import Channel, Closed, Failure, SlotFull


def test_steps_come_out_in_order_whatever_order_they_were_put_in():
    channel = Channel(4)
    for step in (2, 0, 3, 1):
        channel.put(step, f"batch {step}")
    assert [channel.take(s) for s in range(4)] == [f"batch {s}" for s in range(4)]


def test_a_failure_is_raised_at_its_step():
    channel = Channel(2)
    channel.put(0, "ok")
    channel.put(1, Failure(KeyError("bad sample")))
    assert channel.take(0) == "ok"
    with pytest.raises(KeyError, match="bad sample"):
        channel.take(1)


def test_a_double_put_into_an_open_channel_raises():
    channel = Channel(4)
    channel.put(1, "first")
    with pytest.raises(SlotFull, match="step 5 was put into slot 1 of 4"):
        channel.put(5, "second")  # slot 1 still holds step 1


def test_a_put_after_close_is_dropped_and_a_waiting_consumer_wakes():
    channel = Channel(2)
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(pytest.raises(Closed, channel.take, 0)))
    waiter.start()
    channel.close()
    waiter.join(10)
    assert woke and not waiter.is_alive()
    channel.put(0, "late")  # no error: the consumer is gone
    channel.put(0, "later")


def walked(channel: Channel, first: int, limit: int) -> int:
    """The results there in a row from ``first``, slot by slot (what ``count_ready`` counts without the walk)."""
    n = 0
    while n < min(limit, channel.slots) and not channel._full[(first + n) % channel.slots].locked():
        n += 1
    return n


@pytest.mark.parametrize("seed", range(6))
def test_count_ready_agrees_with_the_slots_under_random_puts_takes_failures_and_closes(seed):
    """The consumer's sample of results waiting is exact: after every put, take, failure and close, over passes
    of several laps of the slots, with results put out of order as a pool's threads do, and any limit."""
    rng = np.random.default_rng(seed)
    for pass_ in range(4):  # a channel per pass, as a Loader's pass makes one
        slots = int(rng.integers(1, 9))
        channel = Channel(slots, reserve=bool(pass_ % 2))
        depth = int(rng.integers(1, slots + 1))
        steps = int(rng.integers(1, 6 * slots + 2))
        pending: set[int] = set()  # submitted, not put yet
        submitted, taken = 0, 0
        checks = 0
        while taken < steps:
            while submitted < min(taken + depth, steps):  # the consumer submits up to depth ahead of what it took
                pending.add(submitted)
                submitted += 1
            move = rng.random()
            if move < 0.55 and pending:
                step = int(rng.choice(sorted(pending)))
                pending.discard(step)
                if channel._free is not None:  # (a relay's channel: the producer reserves the slot first)
                    assert channel.reserve(step)
                channel.put(step, Failure(KeyError(step)) if rng.random() < 0.1 else ("batch", step))
            elif move < 0.97 and channel.ready(taken):
                try:
                    assert channel.take(taken) == ("batch", taken)
                except KeyError as exc:
                    assert exc.args == (taken,)
                taken += 1
            elif move >= 0.995:
                channel.close()
            for limit in (1, depth, slots, slots + 3):
                assert channel.count_ready(taken, limit) == walked(channel, taken, limit), (seed, pass_, taken, limit)
                checks += 1
            if channel.closed:
                break
        assert checks


class _Batch:
    """A stand-in for a batch: weakly referenceable, so a test sees when its last reference goes."""

    def __init__(self, step: int) -> None:
        self.step = step


def test_a_kept_channel_lets_go_of_a_result_at_the_first_put_after_two_later_takes():
    channel = Channel(4, keep=True)
    gone: list[int] = []
    for step in range(3):
        batch = _Batch(step)
        weakref.finalize(batch, gone.append, step)
        channel.put(step, (batch,))
        del batch
    for step in range(3):
        assert channel.take(step)[0].step == step  # (the consumer drops each at once)
    assert gone == []  # taken and dropped, but kept by the channel until a producer's put
    channel.put(3, (_Batch(3),))
    assert gone == [0]  # on the producer's thread; 1 and 2, the last two taken, are still kept
    channel.close()
    assert sorted(gone) == [0, 1, 2]  # close lets go of everything


def test_a_kept_result_the_consumer_still_holds_is_only_unreferenced():
    channel = Channel(2, keep=True)
    held = []
    for step in range(6):
        channel.put(step, (_Batch(step),))
        held.append(channel.take(step))
    assert [h[0].step for h in held] == list(range(6))  # every result the consumer holds is intact
    ref = weakref.ref(held[0][0])
    del held
    assert ref() is None  # let go of already: the consumer's reference was the last


def test_a_failure_taken_from_a_kept_channel_is_not_kept():
    channel = Channel(2, keep=True)
    channel.put(0, Failure(KeyError("bad sample")))
    with pytest.raises(KeyError):
        channel.take(0)
    assert channel._kept == [None] * 4  # (a kept exception would hold the frames of its traceback)
