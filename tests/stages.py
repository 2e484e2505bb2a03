"""Stages of one's own that tests of several areas share."""

from __future__ import annotations

import chute


class Running(chute.Stage):
    """A stage of one's own in the loop that keeps state: the running count of rows it handed on
    (``len(batch[key])`` per batch), added to each batch as ``"seen"``; its state nests its source's
    (the Loader's) under ``"source"``."""

    name = "running"

    def __init__(self, key: str = "id") -> None:
        self.key = key
        self.count = 0

    def reset(self, state=None):
        super().reset(state)
        self.source.reset(None if state is None else state["source"])
        self.count = 0 if state is None else state["count"]

    def next(self):
        batch = self.source.next()
        self.count += len(batch[self.key])
        return {**batch, "seen": self.count}

    def state(self):
        return {"source": self.source.state(), "count": self.count}
