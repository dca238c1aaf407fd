"""The ``ckptplan`` command that pip installs: the Go binary, run as is.

``main`` hands its arguments to the binary found by ``ckptplan._binary``
and passes its standard output, standard error and exit status through
unchanged (0 success, 1 failure, 2 usage error). ``ckptplan trace`` runs
here instead (``ckptplan.trace``): it needs torch and transformers. When it is the program
(``argv`` left as None) on a POSIX system it replaces this process with the
binary (``os.execv``), so signals, the terminal and the exit status are the
binary's own; called with ``argv``, or on Windows, it runs the binary as a
child process and returns its status.

If there is no binary, the reason and how to get one go to standard error,
without a traceback, and the status is 1.

Example:
    >>> from ckptplan.cli import main
    >>> main(["plan", "tiny-llama"])  # the binary's usage message on stderr
    2
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional, Sequence

from ._binary import BinaryNotFoundError, binary

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ckptplan binary with argv (default: this process's arguments)
    and return its exit status; see the module doc."""
    as_program = argv is None
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "trace":
        # Tracing builds the model with transformers: it runs here.
        try:
            from ._trace import main as trace_main
        except ImportError as err:
            print(f"ckptplan trace needs torch and transformers ({err}): pip install torch transformers",
                  file=sys.stderr)
            return 1

        return trace_main(args[1:])
    try:
        path = binary()
    except BinaryNotFoundError as err:
        print(err, file=sys.stderr)
        return 1
    if as_program and os.name == "posix":
        _exec(path, args)  # returns only if exec failed
    return _wait(path, args)


def _exec(path: str, args: Sequence[str]) -> None:
    """Replace this process with the binary; on failure, fall back to _wait."""
    _flush()
    try:
        os.execv(path, [path, *args])
    except OSError:
        pass


def _wait(path: str, args: Sequence[str]) -> int:
    """Run the binary as a child sharing our standard streams; a child killed
    by a signal reports 128 plus the signal's number, as a shell does."""
    _flush()
    try:
        proc = subprocess.Popen([path, *args])
    except OSError as err:
        print("ckptplan: cannot run %s: %s" % (path, err.strerror or err), file=sys.stderr)
        return 1
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            # The child got the same SIGINT; its status says what it did.
            continue
    if code < 0:
        return 128 - code
    return code


def _flush() -> None:
    """Write out what Python buffered before the binary writes to the same
    file descriptors."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


if __name__ == "__main__":
    sys.exit(main())
