"""What every subcommand shares: argparse types, the plain-text table, and OS errors told as one line."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator

from chute._sizes import parse_size
from chute.errors import ChuteError


def size(text: str) -> int:
    """An argparse type: a byte size such as ``64MB`` (more than 0)."""
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 bytes, got {text}")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be {minimum} or more, got {value}")
        return value

    return parse


def number(minimum: float, *, inclusive: bool) -> Callable[[str], float]:
    """An argparse type: a number above ``minimum`` (or equal to it, if ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not (value >= minimum if inclusive else value > minimum):
            raise argparse.ArgumentTypeError(f"must be {'at least' if inclusive else 'more than'} {minimum:g}, got {text}")
        return value

    return parse


positive = number(0, inclusive=False)
non_negative = number(0, inclusive=True)


def table(rows: list[list[str]], indent: str = "  ") -> str:
    """``rows`` as left-aligned columns (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def add_transform(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transform", metavar="MODULE:FUNCTION", default=None, help="per-sample transform to run, e.g. mypkg.transforms:decode")


def transform_kwargs(args: argparse.Namespace) -> dict:
    """``{"transform": fn}`` for ``--transform module:function``, else ``{}``."""
    return {"transform": function(args.transform)} if args.transform else {}


def function(spec: str):
    """The function named ``module:qualname`` (the current directory is importable, as with ``python -m``)."""
    import importlib

    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname:
        raise ChuteError(f"--transform wants module:function (e.g. mypkg.transforms:decode), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target = importlib.import_module(module_name)
    except ImportError as exc:
        raise ChuteError(f"--transform {spec}: cannot import {module_name} ({exc}); run from the directory that holds it") from None
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ChuteError(f"--transform {spec}: {module_name} has no {qualname}") from None
    if not callable(target):
        raise ChuteError(f"--transform {spec}: {qualname} is not callable")
    return target


def os_error_text(exc: OSError) -> str:
    """``/data/x: Permission denied`` plus what to do, for an OSError on a path the user gave."""
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    text = f"{paths}: {exc.strerror or exc}" if paths else str(exc.strerror or exc)
    hint = {
        errno.EACCES: "check its permissions",
        errno.EPERM: "check its permissions",
        errno.EROFS: "the file system is read-only",
        errno.ENOSPC: "the disk is full",
    }.get(exc.errno or 0)
    return f"{text} ({hint})" if hint else text


@contextlib.contextmanager
def writing_to(dst: str) -> Iterator[None]:
    """An OS error about ``dst`` (disk full, no permission) becomes a one-line ChuteError naming it."""
    try:
        yield
    except OSError as exc:
        if _concerns(exc, dst):
            raise ChuteError(f"cannot write the dataset to {dst}: {os_error_text(exc)}") from None
        raise


def _concerns(exc: OSError, path: str) -> bool:
    """Whether ``exc`` is about ``path``, a folder above it or a file inside it."""
    if exc.filename is None:
        return False
    target = os.path.abspath(os.path.expanduser(path))
    failed = os.path.abspath(os.fspath(exc.filename))
    return failed == target or target.startswith(failed.rstrip(os.sep) + os.sep) or failed.startswith(target + os.sep)
