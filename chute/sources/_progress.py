"""The converters' progress bar on stderr: tqdm on a terminal or in a notebook, rare whole lines in logs.

On a terminal (or in a Jupyter notebook) it is a tqdm bar (done/total,
percent, rate, ETA), redrawn at most ``1 / TTY_INTERVAL`` times a second. When
stderr is a file or a pipe (CI logs, ``nohup``) a tqdm bar would fill the log
with carriage returns, so a whole line in tqdm's format is printed at most every
``LOG_INTERVAL`` seconds instead. Either way a final line gives the count, the
time and the rate; ``enabled=False`` prints nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

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
    error, just ends the bar's line so the error message starts on its own line)::

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
        self.tty = enabled and (_isatty(self.stream) or _in_notebook(self.stream))
        self.interval = TTY_INTERVAL if self.tty else LOG_INTERVAL
        self._next_draw = self.start + self.interval
        self._bar: Any = self._tqdm() if self.tty else None
        self._closed = False

    def _tqdm(self) -> Any:
        from tqdm.auto import tqdm

        return tqdm(total=self.total, desc=self.desc, unit=f" {self.unit}", file=self.stream, mininterval=TTY_INTERVAL,
                    dynamic_ncols=True, leave=True)

    def update(self, n: int = 1) -> None:
        """Record ``n`` more items done; redraw if the last draw is old enough."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled:
            now = self.clock()
            if now >= self._next_draw:
                self._next_draw = now + self.interval
                self._line(self._status(now))

    def note(self, message: str) -> None:
        """Print a message on its own line (a warning about the source, say)."""
        if self._bar is not None:
            self._bar.write(f"{self.desc}: {message}", file=self.stream)
        elif self.enabled:
            self._line(f"{self.desc}: {message}")

    def close(self, ok: bool = True) -> None:
        """Print the final line (``ok``) or just end the bar's line (after an error)."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
            return
        if self.enabled and ok:
            elapsed = max(self.clock() - self.start, 1e-9)
            self._line(f"{self.desc}: {self.done:,} {self.unit} in {format_duration(elapsed)} ({self.done / elapsed:,.0f} {self.unit}/s)")

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

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _in_notebook(stream: TextIO) -> bool:
    """Whether ``stream`` is a Jupyter kernel's stderr (where tqdm draws a widget or redraws in place)."""
    if stream is not sys.stderr or "ipykernel" not in sys.modules:
        return False
    return type(stream).__module__.startswith("ipykernel")
