"""A small progress bar on stderr for the converters (no tqdm dependency).

On a terminal it redraws one line in place (``\\r``) at most ``1 / TTY_INTERVAL``
times a second; when stderr is a file or a pipe (CI logs, ``nohup``) it prints a
whole line at most every ``LOG_INTERVAL`` seconds, so logs stay short. Either
way a final line gives the count, the time and the rate.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

TTY_INTERVAL = 0.1
LOG_INTERVAL = 5.0


def format_duration(seconds: float) -> str:
    """``75.9`` -> ``'1:15'``; ``3725`` -> ``'1:02:05'`` (whole seconds, rounded down)."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Counts items done out of ``total`` (None if unknown) and shows done/total, rate and ETA.

    Use as a context manager; leaving the block prints the final line (or, after an
    error, just ends the in-place line so the error message starts on its own line)::

        with Progress(len(files), "reading files") as bar:
            for f in files:
                ...
                bar.update()
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        *,
        enabled: bool = True,
        unit: str = "items",
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.done = 0
        self.start = clock()
        self.tty = enabled and _isatty(self.stream)
        self.interval = TTY_INTERVAL if self.tty else LOG_INTERVAL
        self._next_draw = self.start + self.interval
        self._width = 0  # length of the line drawn last, to blank it out when redrawing

    def update(self, n: int = 1) -> None:
        """Record ``n`` more items done; redraw if the last draw is old enough."""
        self.done += n
        if self.enabled:
            now = self.clock()
            if now >= self._next_draw:
                self._next_draw = now + self.interval
                self._draw(self._status(now))

    def note(self, message: str) -> None:
        """Print a message on its own line (a warning about the source, say)."""
        if self.enabled:
            self._end_line()
            print(f"{self.desc}: {message}", file=self.stream, flush=True)

    def close(self, ok: bool = True) -> None:
        """Print the final line (``ok``) or just end the in-place line (after an error)."""
        if not self.enabled:
            return
        if ok:
            elapsed = max(self.clock() - self.start, 1e-9)
            self._draw(
                f"{self.desc}: {self.done:,} {self.unit} in {format_duration(elapsed)} "
                f"({self.done / elapsed:,.0f} {self.unit}/s)"
            )
        self._end_line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(ok=exc_type is None)

    def _status(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        text = f"{self.desc}: {self.done:,}"
        if self.total:
            text += f"/{self.total:,} {self.unit} ({100 * self.done / self.total:3.0f}%)"
        else:
            text += f" {self.unit}"
        text += f", {rate:,.0f} {self.unit}/s, {format_duration(elapsed)} elapsed"
        if self.total and rate > 0 and self.done < self.total:
            text += f", ETA {format_duration((self.total - self.done) / rate)}"
        return text

    def _draw(self, text: str) -> None:
        if self.tty:
            pad = " " * max(0, self._width - len(text))
            self.stream.write(f"\r{text}{pad}")
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _end_line(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
        self._width = 0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
