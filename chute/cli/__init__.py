"""The ``chute`` command: convert, inspect, bench, tune, doctor, demo, which (docs/cli.md).

One module per subcommand, each with ``add(subparsers)`` and ``run(args)``; this
module assembles the parser and turns errors into one line. Every command
imports what it needs when it runs, so ``chute --help`` and ``chute --version``
answer without loading torch. A mistake the user can fix (a
:class:`~chute.errors.ChuteError`, or an OSError on a path they gave) is one
line on stderr, ``chute <command>: error: ...``, and exit status 1; anything
else is a bug in chute and keeps its traceback.
"""

from __future__ import annotations

import argparse
import difflib
import os
import socket
import sys
from collections.abc import Sequence

from chute import __version__
from chute.cli import bench, convert, demo, doctor, inspect, tune, which
from chute.cli._args import os_error_text
from chute.errors import ChuteError

__all__ = ["build_parser", "main"]

SIGPIPE_EXIT = 128 + 13  # what a shell reports for a process stopped by SIGPIPE
COMMANDS = (convert, inspect, demo, bench, tune, doctor, which)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chute", description="Keep the accelerator fed: convert, inspect and read chute datasets.")
    parser.add_argument("--version", action="version", version=f"chute {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add(sub)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; an option the command does not know is refused with the command's usage and, when one is
    close, the option meant (``--tokeniser``: did you mean --tokenizer?)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = _subparser(parser, args.command)
        options = [o for action in command._actions for o in action.option_strings if o.startswith("--")]
        hints = []
        for arg in unknown:
            name = arg.split("=", 1)[0]
            close = difflib.get_close_matches(name, options, n=1, cutoff=0.6) if name.startswith("-") else []
            if close:
                hints.append(f"{name}: did you mean {close[0]}?")
        command.error(f"unrecognized arguments: {' '.join(unknown)}" + (f" ({'; '.join(hints)})" if hints else ""))
    return args


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:  # argparse keeps its subparsers in the one _SubParsersAction
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    return parser


def _fail(command: str, message: str) -> int:
    print(f"chute {command}: error: {message}", file=sys.stderr)
    return 1


def _stop_writing_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except KeyboardInterrupt:  # Ctrl-C while the arguments are parsed (--data-type imports chute)
        print("chute: interrupted", file=sys.stderr)
        return 130
    try:
        status = args.run(args)
        sys.stdout.flush()  # here, so that a closed pipe is seen below and not at exit
        return status
    except ChuteError as exc:
        return _fail(args.command, str(exc))
    except BrokenPipeError:
        # the reader went away (`chute inspect ds | head`): stop quietly, as other command-line tools do
        _stop_writing_stdout()
        return SIGPIPE_EXIT
    except (ConnectionError, TimeoutError, socket.gaierror) as exc:  # the network, not chute
        return _fail(args.command, f"{type(exc).__name__}: {exc}; check the address and that the server is up")
    except OSError as exc:
        if exc.filename is None:
            raise  # not about a path the user gave: a bug, keep the traceback
        return _fail(args.command, os_error_text(exc))
    except KeyboardInterrupt:
        print(f"chute {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
