"""Finding and running the ckptplan executable, the Go program that plans.

The Python package only describes models and applies plans; every number
comes from the ``ckptplan`` binary. ``binary()`` looks for it, in order:

1. the file named by the environment variable ``CKPTPLAN_BINARY`` (it must
   exist and be executable: a wrong setting is an error, not a reason to
   look elsewhere);
2. the copy a wheel carries, ``ckptplan/_bin/ckptplan`` next to this file;
3. a ``ckptplan`` on ``PATH`` that is the Go program. pip installs this
   package's own console script under the same name; it is a Python script
   (``#!`` on Linux and macOS, a launcher with a zip archive appended on
   Windows), and running it would run this lookup again, so such files are
   skipped.

Otherwise it raises ``BinaryNotFoundError``, whose message says how to get
one. ``run`` executes the binary and captures its output; ``call`` returns
its standard output and raises ``CkptplanError`` when it fails.

Example:
    >>> import ckptplan._binary as b
    >>> print(b.call(["models"]).splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
    name family layers hidden heads kv ffn vocab parameters
"""
from __future__ import annotations

import json
import os
import subprocess
import zipfile
from typing import Optional, Sequence

__all__ = ["ENV", "TIMEOUT_ENV", "BinaryNotFoundError", "CkptplanError", "CkptplanUsageError", "binary", "call", "run"]

#: The environment variable that names the binary to use.
ENV = "CKPTPLAN_BINARY"
#: The environment variable that sets how long, in seconds, one run of the
#: binary may take (default 600: a plan takes seconds).
TIMEOUT_ENV = "CKPTPLAN_TIMEOUT"
_TIMEOUT = 600.0
_MAX_TIMEOUT = 1e6  # about 11 days; the OS's timers take no more than about 24 days
# Set for the binary, which then follows an error with a JSON report of it.
_ERRORS = "CKPTPLAN_ERRORS"

_NAME = "ckptplan.exe" if os.name == "nt" else "ckptplan"
_BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", _NAME)

_HOW_TO_GET_ONE = (
    "install a ckptplan wheel built for this platform (pip install ckptplan-*.whl; "
    "it carries the binary), or build it from a clone of the repository with "
    "'go build -o ckptplan ./cmd/ckptplan' and set " + ENV + " to its path"
)


class BinaryNotFoundError(RuntimeError):
    """No usable ckptplan executable: the message says where it looked and
    how to get one.

    >>> str(BinaryNotFoundError("x")).startswith("x")
    True
    """


class CkptplanError(RuntimeError):
    """The ckptplan binary exited with a non-zero status.

    ``str(err)`` (also ``err.message``) is the binary's standard error,
    verbatim but for surrounding white space; ``err.code`` is its exit
    status: 1 for a failure (an infeasible budget, a bad model file), 2 for a
    usage error (an unknown flag or flag value). What the binary reports of
    the error beside its text (``CKPTPLAN_ERRORS=json``): ``err.kind``,
    one of usage, infeasible, input or internal (None when it said
    nothing); for infeasible, ``err.min_budget_bytes``, the least budget
    that fits (None when none does: static memory alone passes it); for
    an input error, ``err.file``, ``err.line`` and ``err.column`` where
    it has a place.

    >>> err = CkptplanError("ckptplan: plan: need --budget or --device", 2, kind="usage")
    >>> err.code, err.kind, str(err)
    (2, 'usage', 'ckptplan: plan: need --budget or --device')
    """

    def __init__(self, message: str, code: int, *, kind: Optional[str] = None,
                 min_budget_bytes: Optional[int] = None, file: Optional[str] = None,
                 line: Optional[int] = None, column: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.kind = kind
        self.min_budget_bytes = min_budget_bytes
        self.file, self.line, self.column = file, line, column

    def replace(self, message: str) -> "CkptplanError":
        """The same error with another message."""
        return CkptplanError(message, self.code, kind=self.kind, min_budget_bytes=self.min_budget_bytes,
                             file=self.file, line=self.line, column=self.column)


class CkptplanUsageError(CkptplanError, ValueError):
    """A call the package refuses before it runs anything: an argument
    missing, of the wrong type or out of range, or a model in a state the
    call cannot work with. One line in Python terms; ``code`` 2 and
    ``kind`` "usage", as the binary's usage errors; a ValueError too.

    >>> err = CkptplanUsageError("ckptplan.plan: batch must be a positive int, not 0")
    >>> isinstance(err, ValueError), err.code, err.kind
    (True, 2, 'usage')
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, 2, kind="usage")


def binary() -> str:
    """The path of the ckptplan executable (see the module doc for the order
    in which it is looked for).

    Raises ``BinaryNotFoundError`` when ``CKPTPLAN_BINARY`` names a file that
    is missing or not executable, or when no binary is found at all.

    >>> import os
    >>> os.access(binary(), os.X_OK)
    True
    """
    named = os.environ.get(ENV)
    if named:
        return _check_named(named)
    if os.path.isfile(_BUNDLED):
        return _check_bundled(_BUNDLED)
    found = _on_path()
    if found is not None:
        return found
    raise BinaryNotFoundError(
        "ckptplan: cannot find the ckptplan binary: " + ENV + " is not set, "
        "this installation carries none (" + _BUNDLED + " is missing) and no "
        "ckptplan executable on PATH is the Go program; " + _HOW_TO_GET_ONE
    )


def run(args: Sequence[str], *, input: Optional[bytes] = None) -> subprocess.CompletedProcess:
    """Run the binary with args (no shell) and return the finished process,
    standard output and error captured as bytes; a non-zero exit status is
    returned, not raised.

    input, when given, is written to the binary's standard input; otherwise
    the binary reads an empty one. The binary follows an error with its
    report, as JSON, on the last line of its standard error.

    >>> p = run(["plan", "tiny-llama"])
    >>> p.returncode, p.stderr.decode().strip().splitlines()[-2:]
    (2, ['ckptplan: plan: need --budget or --device', '{"kind":"usage","message":"plan: need --budget or --device"}'])
    """
    argv = [binary(), *[os.fspath(a) for a in args]]
    limit = timeout()
    try:
        return subprocess.run(
            argv,
            env={**os.environ, _ERRORS: "json"},
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            check=False,
            timeout=limit,
        )
    except subprocess.TimeoutExpired:
        raise CkptplanError(
            f"ckptplan: {os.path.basename(argv[0])} {' '.join(argv[1:2])} did not finish in {limit:g} s and was "
            f"stopped; {TIMEOUT_ENV} sets the limit in seconds", 1, kind="timeout") from None


def timeout() -> float:
    """How long one run of the binary may take, in seconds: CKPTPLAN_TIMEOUT,
    else 600. Raises CkptplanUsageError when it is not a positive number.

    >>> timeout()
    600.0
    """
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return _TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= _MAX_TIMEOUT:
        raise CkptplanUsageError(f"{TIMEOUT_ENV}={text!r}: want a positive number of seconds, at most {_MAX_TIMEOUT:g}")
    return value


def call(args: Sequence[str], *, input: Optional[bytes] = None) -> str:
    """Run the binary with args and return its standard output as text.

    Raises ``CkptplanError`` carrying the binary's standard error and exit
    status when it exits non-zero, and ``BinaryNotFoundError`` when there is
    no binary to run.

    >>> "tiny-llama" in call(["models"])
    True
    >>> try:
    ...     call(["plan", "tiny-llama", "--budget", "lots"])
    ... except CkptplanError as err:
    ...     print(err.code, str(err).splitlines()[0])
    2 invalid value "lots" for flag -budget: invalid byte count "lots": want a number with an optional unit such as 512MiB or 24GiB
    """
    p = run(args, input=input)
    if p.returncode != 0:
        raise _error(p.stderr.decode("utf-8", errors="replace"), p.returncode)
    return p.stdout.decode("utf-8", errors="replace")


def _error(stderr: str, code: int) -> CkptplanError:
    """The error a failed run's standard error says: its text, and the
    report on its last line (``CKPTPLAN_ERRORS=json``), when there is one.

    >>> e = _error('ckptplan: m does not fit\\n{"kind":"infeasible","message":"m does not fit","min_budget_bytes":9}\\n', 1)
    >>> str(e), e.kind, e.min_budget_bytes
    ('ckptplan: m does not fit', 'infeasible', 9)
    """
    text = stderr.strip()
    report: dict = {}
    head, _, last = text.rpartition("\n")
    if last.startswith("{"):
        try:
            report = json.loads(last)
            text = head.strip()
        except ValueError:
            report = {}
    if not isinstance(report, dict):
        report = {}
    if not text:
        text = "ckptplan exited with status %d and no message" % code
    return CkptplanError(text, code, kind=report.get("kind"), min_budget_bytes=report.get("min_budget_bytes"),
                         file=report.get("file"), line=report.get("line"), column=report.get("column"))


def _check_named(path: str) -> str:
    """The file CKPTPLAN_BINARY names, if it can be run."""
    if not os.path.exists(path):
        raise BinaryNotFoundError(
            "ckptplan: %s=%s: no such file; set it to the path of a ckptplan "
            "binary (go build -o ckptplan ./cmd/ckptplan) or unset it" % (ENV, path)
        )
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        what = "a directory" if os.path.isdir(path) else "not executable"
        raise BinaryNotFoundError(
            "ckptplan: %s=%s: %s; set it to the path of a ckptplan binary "
            "(go build -o ckptplan ./cmd/ckptplan) or unset it" % (ENV, path, what)
        )
    return os.path.abspath(path)


def _check_bundled(path: str) -> str:
    """The wheel's binary. Some tools unpack wheels without the executable
    bit; restore it when the file is ours to change."""
    if not os.access(path, os.X_OK):
        try:
            os.chmod(path, os.stat(path).st_mode | 0o111)
        except OSError as err:
            raise BinaryNotFoundError(
                "ckptplan: %s is not executable and cannot be made so (%s); "
                "reinstall the package or set %s" % (path, err, ENV)
            ) from None
    return path


def _on_path() -> Optional[str]:
    """The first ckptplan on PATH that is the Go program, not a Python script."""
    names = [_NAME]
    if os.name == "nt":
        names = ["ckptplan" + ext.lower() for ext in os.environ.get("PATHEXT", ".EXE").split(os.pathsep) if ext]
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        for name in names:
            candidate = os.path.join(directory or os.curdir, name)
            if _is_program(candidate):
                return os.path.abspath(candidate)
    return None


def _is_program(path: str) -> bool:
    """Whether path is an executable file that is not a script (a console
    script starts with #!) or a Python launcher (a zip archive appended to a
    small executable, as pip writes on Windows)."""
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return False
    try:
        with open(path, "rb") as f:
            if f.read(2) == b"#!":
                return False
        return not zipfile.is_zipfile(path)
    except OSError:
        return False

