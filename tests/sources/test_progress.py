"""The converters' progress bar: in-place on a terminal, rare whole lines in logs, silent when off."""

from __future__ import annotations

import io

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


def test_terminal_gets_a_tqdm_bar_redrawn_in_place():
    stream = TTY()
    with Progress(1000, "convert", stream=stream, unit="files") as bar:
        for _ in range(1000):
            bar.update()
    text = stream.getvalue()
    assert text.startswith("\r") and text.endswith("\n") and text.count("\n") == 1  # one line, redrawn
    assert text.count("\r") < 100  # not one draw per item
    final = text.rsplit("\r", 1)[1]
    assert final.startswith("convert: 100%") and "1000/1000" in final and "files/s" in final


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
    stream = TTY()
    try:
        with Progress(10, "x", stream=stream) as bar:
            bar.update(3)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    text = stream.getvalue()
    assert text.startswith("\r") and text.endswith("\n") and "3/10" in text.rsplit("\r", 1)[1]  # the bar stays where it stopped


def test_format_duration():
    assert format_duration(0) == "0:00"
    assert format_duration(75.9) == "1:15"
    assert format_duration(3725) == "1:02:05"
