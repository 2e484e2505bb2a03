"""Mistakes a user makes with the ``chute`` command: one line ``chute <cmd>: error: ...``, no traceback.

Argparse's own usage errors (a bad flag value) keep argparse's form: the usage,
then ``chute <cmd>: error: argument ...``, exit status 2. Everything else a user
can fix exits 1 with one line. A bug in chute keeps its traceback.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import chute
from chute import __version__
from chute.cli import main

CHUTE = os.path.join(os.path.dirname(sys.executable), "chute")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    samples = ({"x": np.full(4, i, np.int32), "name": f"sample {i}"} for i in range(200))
    return chute.write(samples, tmp_path_factory.mktemp("cli-errors") / "ds", shard_size=1)  # a shard per row


@pytest.fixture
def index(tmp_path):
    (tmp_path / "src").mkdir()
    for i in range(3):
        (tmp_path / "src" / f"{i}.json").write_text(json.dumps({"i": i}))
    (tmp_path / "src" / "list.txt").write_text("0.json\n1.json\n2.json\n")
    return str(tmp_path / "src" / "list.txt")


def _error(capsys, *argv: str) -> str:
    """Run the command, check it failed with one line on stderr and nothing on stdout; return that line."""
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 1, out
    assert out.err.count("\n") == 1 and out.out == "", out.err
    return out.err.rstrip("\n")


def _usage_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: chute ")
    return err.rstrip("\n").splitlines()[-1]


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"chute {__version__}\n"


def test_negative_workers_and_zero_shard_size_are_usage_errors(capsys, index, tmp_path):
    dst = str(tmp_path / "out")
    assert _usage_error(capsys, "convert", index, dst, "--workers", "-1") == (
        "chute convert: error: argument --workers: must be 0 or more, got -1"
    )
    assert _usage_error(capsys, "convert", index, dst, "--shard-size", "0") == (
        "chute convert: error: argument --shard-size: must be more than 0 bytes, got 0"
    )
    assert _usage_error(capsys, "bench", dst, "--batch-size", "0") == "chute bench: error: argument --batch-size: must be 1 or more, got 0"
    assert _usage_error(capsys, "tune", dst, "--step-ms", "-5") == "chute tune: error: argument --step-ms: must be at least 0, got -5"
    assert _usage_error(capsys, "convert", index, dst, "--data-type", "float32[]") == (
        "chute convert: error: argument --data-type: cannot read 'float32[]' as a column type; write one of json, "
        "bytes, string, scalar(int64), map(string), ragged(float32, 2), tensor(uint8, (3, 32, 32))"
    )
    assert not os.path.exists(dst)


def test_a_destination_that_cannot_be_created(capsys, index, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    dst = str(tmp_path / "a-file" / "ds")
    line = _error(capsys, "convert", index, dst, "--workers", "0", "--quiet")
    assert line == f"chute convert: error: cannot create the dataset directory {dst}: Not a directory"
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_an_unsupported_url_scheme(capsys, index, tmp_path):
    assert _error(capsys, "inspect", "foo://bucket/ds") == "chute inspect: error: cannot open foo://bucket/ds: Protocol not known: foo"
    assert _error(capsys, "bench", "foo://bucket/ds").startswith("chute bench: error: cannot open foo://bucket/ds")
    assert _error(capsys, "convert", "foo://bucket/ds", str(tmp_path / "out")) == "chute convert: error: cannot open foo://bucket/ds: Protocol not known: foo"


def test_an_option_for_another_kind_of_source(capsys, index, tmp_path):
    line = _error(capsys, "convert", index, str(tmp_path / "out"), "--split", "train", "--workers", "0")
    assert line.startswith("chute convert: error: split= (--split) does not apply to index sources; from_index takes ")
    assert not (tmp_path / "out").exists()


def test_a_missing_dataset_and_a_missing_transform(capsys, dataset, tmp_path):
    assert _error(capsys, "inspect", str(tmp_path / "nothing")) == (
        f"chute inspect: error: {tmp_path / 'nothing'} does not exist or is not a directory; "
        "a chute dataset is a directory with a manifest.json"
    )
    assert _error(capsys, "bench", dataset.root, "--transform", "no_such_module_here:fn").startswith(
        "chute bench: error: --transform no_such_module_here:fn: cannot import no_such_module_here"
    )


def test_a_bug_keeps_its_traceback(monkeypatch):
    """An exception that is not a user's mistake is a bug in chute: main() lets it through, traceback and all."""
    from chute.tools import doctor

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(doctor, "gather", broken)
    with pytest.raises(ZeroDivisionError, match="a bug"):
        main(["doctor"])


def test_output_into_a_closed_pipe_stops_quietly(dataset, capsys):
    """``chute inspect ds --all | head -1``: no BrokenPipeError traceback, a non-zero status."""
    assert main(["inspect", dataset.root, "--all"]) == 0
    assert len(capsys.readouterr().out) > 2 * 4096  # more than the pipe below holds
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # the output below is larger than the pipe
    child = subprocess.Popen([CHUTE, "inspect", dataset.root, "--all"], stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"d"  # "dataset ...": the command is writing
    finally:
        os.close(read_end)  # the reader goes away, as `head` does
    _, err = child.communicate(timeout=120)
    assert child.returncode == 141  # what a shell reports for a command stopped by SIGPIPE
    assert err == b""


def test_a_mistyped_option_shows_the_commands_usage_and_the_closest_option(capsys, index, tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["convert", index, str(tmp_path / "out"), "--tokeniser", "gpt2"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: chute convert ")  # the command's usage, not the top-level one
    assert err.rstrip("\n").splitlines()[-1] == (
        "chute convert: error: unrecognized arguments: --tokeniser gpt2 (--tokeniser: did you mean --tokenizer?)"
    )
    assert _usage_error(capsys, "inspect", "ds", "--verfy") == (
        "chute inspect: error: unrecognized arguments: --verfy (--verfy: did you mean --verify?)"
    )
    assert not (tmp_path / "out").exists()


def test_a_dataset_already_at_the_destination_names_the_flag_first(capsys, index, tmp_path):
    assert main(["convert", index, str(tmp_path / "out"), "--workers", "0", "--quiet"]) == 0
    capsys.readouterr()
    line = _error(capsys, "convert", index, str(tmp_path / "out"), "--workers", "0", "--quiet")
    assert line == (f"chute convert: error: {tmp_path / 'out'} already holds a chute dataset (3 rows); to replace it: "
                    "chute convert --overwrite (overwrite=True in Python)")


def test_the_kinds_of_the_command_are_the_converters():
    from chute.cli.convert import KINDS as COMMAND_KINDS
    from chute.sources import KINDS

    assert COMMAND_KINDS == KINDS
