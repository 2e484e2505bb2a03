"""The one hand-off: steps come out in order, a double put is an error, a closed channel drops quietly."""

from __future__ import annotations

import threading

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
