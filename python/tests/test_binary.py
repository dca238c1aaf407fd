"""The binary lookup (ckptplan._binary) and the command-line entry point
(ckptplan.cli, python -m ckptplan)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ckptplan import _binary, cli

PYTHON_DIR = Path(__file__).resolve().parents[1]

BAD_BUDGET = ["plan", "tiny-llama", "--budget", "lots"]
BAD_BUDGET_MESSAGE = 'invalid value "lots" for flag -budget'


def _executable(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def no_bundled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Make the lookup behave as in a checkout, even when the package under
    test is an installed wheel that carries a binary."""
    monkeypatch.setattr(_binary, "_BUNDLED", str(tmp_path / "absent" / "ckptplan"))


def _python_m(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """python -m ckptplan ARGS with the package from this checkout."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(PYTHON_DIR), env.get("PYTHONPATH", "")] if p)
    return subprocess.run(
        [sys.executable, "-m", "ckptplan", *args],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


class TestEnvironmentVariable:
    def test_missing_file(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        missing = tmp_path / "nowhere" / "ckptplan"
        monkeypatch.setenv("CKPTPLAN_BINARY", str(missing))
        with pytest.raises(_binary.BinaryNotFoundError) as err:
            _binary.binary()
        msg = str(err.value)
        assert "CKPTPLAN_BINARY=%s" % missing in msg
        assert "no such file" in msg

    def test_not_executable(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        if os.name != "posix":
            pytest.skip("the executable bit is a POSIX notion")
        plain = tmp_path / "ckptplan"
        plain.write_bytes(b"\x7fELF not really")
        plain.chmod(0o644)
        monkeypatch.setenv("CKPTPLAN_BINARY", str(plain))
        with pytest.raises(_binary.BinaryNotFoundError) as err:
            _binary.binary()
        assert "CKPTPLAN_BINARY=%s: not executable" % plain in str(err.value)

    def test_directory(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        monkeypatch.setenv("CKPTPLAN_BINARY", str(tmp_path))
        with pytest.raises(_binary.BinaryNotFoundError, match="CKPTPLAN_BINARY=.*: a directory"):
            _binary.binary()

    def test_wins(self, monkeypatch: pytest.MonkeyPatch, ckptplan_binary: str) -> None:
        monkeypatch.setenv("CKPTPLAN_BINARY", ckptplan_binary)
        assert _binary.binary() == os.path.abspath(ckptplan_binary)


class TestPath:
    def test_skips_scripts(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ckptplan_binary: str, no_bundled: None
    ) -> None:
        # pip's console script comes first on PATH and has the same name.
        scripts = tmp_path / "venv-bin"
        scripts.mkdir()
        _executable(scripts / "ckptplan", b"#!/usr/bin/python3\nfrom ckptplan.cli import main\nmain()\n")
        gobin = tmp_path / "go-bin"
        gobin.mkdir()
        (gobin / "ckptplan").symlink_to(ckptplan_binary)
        monkeypatch.delenv("CKPTPLAN_BINARY", raising=False)
        monkeypatch.setenv("PATH", os.pathsep.join([str(scripts), str(gobin)]))
        assert _binary.binary() == str(gobin / "ckptplan")

    def test_skips_zip_launchers(self, tmp_path: Path) -> None:
        launcher = tmp_path / "ckptplan"
        with zipfile.ZipFile(launcher, "w") as z:
            z.writestr("__main__.py", "import ckptplan.cli\n")
        launcher.chmod(0o755)
        assert not _binary._is_program(str(launcher))

    def test_none_found(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_bundled: None) -> None:
        _executable(tmp_path / "ckptplan", b"#!/bin/sh\nexit 0\n")
        monkeypatch.delenv("CKPTPLAN_BINARY", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path))
        with pytest.raises(_binary.BinaryNotFoundError) as err:
            _binary.binary()
        msg = str(err.value)
        for want in ["CKPTPLAN_BINARY", "pip install", "go build -o ckptplan ./cmd/ckptplan"]:
            assert want in msg


class TestCall:
    def test_output(self, ckptplan_binary: str) -> None:
        assert "tiny-llama" in _binary.call(["models"]).split()

    def test_error(self, ckptplan_binary: str) -> None:
        with pytest.raises(_binary.CkptplanError) as err:
            _binary.call(BAD_BUDGET)
        assert err.value.code == 2
        assert str(err.value).startswith(BAD_BUDGET_MESSAGE)
        assert str(err.value) == str(err.value).strip()
        assert isinstance(err.value, RuntimeError)

    def test_failure_status(self, ckptplan_binary: str) -> None:
        with pytest.raises(_binary.CkptplanError) as err:
            _binary.call(["plan", "tiny-llama", "--budget", "1KiB"])
        assert err.value.code == 1
        assert err.value.message.startswith("ckptplan: ")

    def test_input(self, ckptplan_binary: str) -> None:
        p = _binary.run(["models"], input=b"ignored")
        assert p.returncode == 0 and b"tiny-llama" in p.stdout


class TestCLI:
    def test_exit_status_and_message(self, capfd: pytest.CaptureFixture, ckptplan_binary: str) -> None:
        assert cli.main(BAD_BUDGET) == 2
        out, err = capfd.readouterr()
        assert out == ""
        assert err.startswith(BAD_BUDGET_MESSAGE)

    def test_success(self, capfd: pytest.CaptureFixture, ckptplan_binary: str) -> None:
        assert cli.main(["models"]) == 0
        assert "tiny-llama" in capfd.readouterr().out.split()

    def test_no_binary(
        self, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_bundled: None
    ) -> None:
        monkeypatch.delenv("CKPTPLAN_BINARY", raising=False)
        monkeypatch.setenv("PATH", str(tmp_path))
        assert cli.main(["models"]) == 1
        out, err = capfd.readouterr()
        assert out == ""
        assert "cannot find the ckptplan binary" in err
        assert "Traceback" not in err


class TestPythonM:
    def test_models(self, ckptplan_binary: str) -> None:
        p = _python_m(["models"], os.environ)
        assert p.returncode == 0, p.stderr
        assert "tiny-llama" in p.stdout.split()

    def test_usage_error(self, ckptplan_binary: str) -> None:
        p = _python_m(BAD_BUDGET, os.environ)
        assert p.returncode == 2
        assert p.stdout == ""
        assert p.stderr.startswith(BAD_BUDGET_MESSAGE)

    def test_bad_environment_variable(self, tmp_path: Path) -> None:
        env = dict(os.environ, CKPTPLAN_BINARY=str(tmp_path / "missing"))
        p = _python_m(["models"], env)
        assert p.returncode == 1
        assert p.stderr.startswith("ckptplan: CKPTPLAN_BINARY=")
        assert "Traceback" not in p.stderr

    def test_without_torch(self, ckptplan_binary: str) -> None:
        # The package requires nothing: the command must run where torch,
        # transformers and peft cannot be imported.
        blocked = "import sys\nfor m in ('torch', 'transformers', 'peft', 'numpy'):\n    sys.modules[m] = None\n"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(PYTHON_DIR), env.get("PYTHONPATH", "")] if p)
        code = blocked + "import runpy\nsys.argv = ['ckptplan', 'models']\nrunpy.run_module('ckptplan', run_name='__main__', alter_sys=True)\n"
        p = subprocess.run(
            [sys.executable, "-c", code],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert p.returncode == 0, "python -m ckptplan needs a module it should not:\n" + p.stderr
        assert "tiny-llama" in p.stdout.split()


def test_errors_say_their_kind(ckptplan_binary, tmp_path):
    """A failed call's error carries what the binary reports of it: its
    kind, an infeasible plan's least budget (which then fits, and a byte
    less does not), an input error's place; its text is the binary's."""
    with pytest.raises(_binary.CkptplanError) as e:
        _binary.call(["plan", "tiny-llama", "--budget", "1MiB"])
    err = e.value
    assert (err.code, err.kind) == (1, "infeasible")
    assert str(err).startswith("ckptplan: tiny-llama does not fit in 1 MiB") and "{" not in str(err)
    assert isinstance(err.min_budget_bytes, int) and f"({err.min_budget_bytes} bytes)" in str(err)
    _binary.call(["plan", "tiny-llama", "--budget", f"{err.min_budget_bytes}B"])
    with pytest.raises(_binary.CkptplanError) as e:
        _binary.call(["plan", "tiny-llama", "--budget", f"{err.min_budget_bytes - 1}B"])
    assert e.value.kind == "infeasible"

    with pytest.raises(_binary.CkptplanError) as e:
        _binary.call(["plan", "tiny-llama", "--budget", "lots"])
    assert (e.value.code, e.value.kind, e.value.min_budget_bytes) == (2, "usage", None)

    bad = tmp_path / "m.yaml"
    bad.write_text("name: m\nfamily: llama\nlayers: 2\nhidden: 64\nheds: 4\n")
    with pytest.raises(_binary.CkptplanError) as e:
        _binary.call(["inspect", str(bad)])
    assert (e.value.kind, e.value.file, e.value.line) == ("input", str(bad), 5), vars(e.value)
    assert str(e.value).startswith(f"ckptplan: {bad}:5:")


def test_the_command_line_shows_text_only(ckptplan_binary):
    """Run as a command (not through the package's calls), the binary
    prints its error as text alone."""
    p = subprocess.run([ckptplan_binary, "plan", "tiny-llama", "--budget", "1MiB"], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "CKPTPLAN_ERRORS"})
    assert p.returncode == 1 and "{" not in p.stderr and p.stderr.startswith("ckptplan: tiny-llama does not fit")
