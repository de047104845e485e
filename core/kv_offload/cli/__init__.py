"""The ``kv-offload`` command: list plugins, validate a config, replay and compare traces.

Every failure a user can cause (missing file, malformed trace line, bad config, broken
plugin) exits with status 2 and one line on stderr; ``--debug`` (before or after the command)
shows the traceback. An unexpected error exits with status 1, also in one line unless
``--debug``. ``--no-module-path`` (before or after the command) forbids every ``module_path``
import whatever the config says, as ``KV_OFFLOAD_ALLOW_MODULE_PATH=0`` does. Machine-readable
output (``--json``) goes to stdout; progress bars go to stderr (shown on a terminal;
``--progress`` forces them, ``--no-progress`` hides them). A warning is one line on stderr
(``kv-offload replay: warning: ...``), printed once.

One job per module: :mod:`.parser` (arguments and global options), :mod:`.plugins_cmd`,
:mod:`.validate_cmd`, :mod:`.replay_cmd`, :mod:`.compare_cmd` (one command each, the
``compare`` plot in :mod:`.plot`), :mod:`.running` (loading a stack, replaying it, the
report), :mod:`.output` (tables and the replay report's text); this module runs a command
and turns its errors into exit statuses.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import TextIO

from ..errors import KVOffloadError
from ..plugins.env import forbid_module_paths
from .parser import build_parser

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_INTERNAL = 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.no_module_path:  # the process's own setting, so every import check sees it
        forbid_module_paths("--no-module-path")
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _warning_printer(args.command)
            return int(args.func(args))
    except (KVOffloadError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):  # `kv-offload ... | head`: not an error
            _silence_stdout()
            return 0
        if args.debug:
            traceback.print_exc()
        message = str(exc) if isinstance(exc, KVOffloadError) else _os_error(exc)
        print(f"kv-offload {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug, or a plugin's: still one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(
            f"kv-offload {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(run with --debug for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _warning_printer(command: str) -> Callable[..., None]:
    """``warnings.showwarning`` for a command: each warning as one line on stderr, without
    the source line of the code that issued it, and once. A command checks a stack more than
    once (the config, the scaled stack, the build), so a warning comes back with the same
    words up to its first figure (figures such as free disk space move between checks)."""
    seen: set[tuple[object, ...]] = set()

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = str(message)
        key = (category, filename, lineno, re.split(r"\d", text, maxsplit=1)[0])
        if key in seen:
            return
        seen.add(key)
        # A warning located in a config (a module_path import) names its file and line.
        where = "" if str(filename).endswith(".py") else f"{filename}:{lineno}: "
        print(f"kv-offload {command}: warning: {where}{text}", file=file or sys.stderr)

    return show


def _os_error(exc: OSError) -> str:
    where = f" {str(exc.filename)!r}" if exc.filename is not None else ""
    return f"{exc.strerror or exc}{':' if where else ''}{where}"


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at devnull so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
