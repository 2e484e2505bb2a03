"""The converters' progress bar: in-place on a terminal, rare whole lines in logs, silent when off."""

from __future__ import annotations

import io
import re

from chute.sources._progress import Progress, format_duration


class FakeClock:
    """Time in whole milliseconds, so elapsed times are exact."""

    def __init__(self) -> None:
        self.ms = 100_000

    def __call__(self) -> float:
        return self.ms / 1000


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_redraws_in_place_at_most_ten_times_a_second():
    clock, stream = FakeClock(), TTY()
    with Progress(1000, "convert", stream=stream, clock=clock, unit="files") as bar:
        for _ in range(1000):
            clock.ms += 1  # 1000 items/s for one second
            bar.update()
    text = stream.getvalue()
    draws = text.count("\r")
    assert 5 <= draws <= 12  # ~10 redraws plus the final line, not one per item
    assert text.endswith("\n") and text.count("\n") == 1
    assert re.search(r"\rconvert: 500/1,000 files \( 50%\), 1,000 files/s, 0:00 elapsed, ETA 0:00", text)
    assert "convert: 1,000 files in 0:01 (1,000 files/s)" in text


def test_logs_get_a_line_every_few_seconds_and_a_final_line():
    clock, stream = FakeClock(), io.StringIO()
    bar = Progress(None, "convert", stream=stream, clock=clock, unit="samples")
    for _ in range(120):
        clock.ms += 250  # 30 s in all
        bar.update(10)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert 5 <= len(lines) <= 8  # every 5 s, plus the final line
    assert lines[0].startswith("convert: 200 samples, 40 samples/s")  # no total: no percent, no ETA
    assert "ETA" not in lines[0]
    assert lines[-1] == "convert: 1,200 samples in 0:30 (40 samples/s)"


def test_disabled_prints_nothing_and_errors_only_end_the_line():
    stream = TTY()
    with Progress(10, "x", enabled=False, stream=stream) as bar:
        bar.update(10)
        bar.note("hello")
    assert stream.getvalue() == ""
    clock, stream = FakeClock(), TTY()
    try:
        with Progress(10, "x", stream=stream, clock=clock) as bar:
            clock.ms += 1000
            bar.update(3)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert stream.getvalue().startswith("\rx: 3/10") and stream.getvalue().endswith("\n")
    assert " in " not in stream.getvalue()  # no final "done" line after an error


def test_format_duration():
    assert format_duration(0) == "0:00"
    assert format_duration(75.9) == "1:15"
    assert format_duration(3725) == "1:02:05"
