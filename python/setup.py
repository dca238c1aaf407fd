"""Builds the ckptplan wheel with the Go binary inside.

Everything declarative is in pyproject.toml; this file adds the two steps
setuptools cannot be told about there:

- build_py also puts the ckptplan executable at ckptplan/_bin/ckptplan in
  the build directory: the file CKPTPLAN_BINARY names, when set, or else
  ``go build -trimpath -o ... ./cmd/ckptplan`` run from the repository root
  (the directory above this one), with CGO_ENABLED=0 unless the environment
  says otherwise so the binary needs no particular C library. An editable
  install builds nothing: the package then finds a binary as an in-tree
  checkout does (CKPTPLAN_BINARY or PATH).
- bdist_wheel tags the wheel py3-none-<platform>: the binary runs on one
  operating system and processor, whatever the Python.
"""
import os
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 has its own; older ones use the wheel package's.
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover
    from wheel.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXE = "ckptplan.exe" if os.name == "nt" else "ckptplan"


class BuildPyWithBinary(build_py):
    """build_py, then the Go binary into the package's _bin directory."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = self._binary_path()
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        prebuilt = os.environ.get("CKPTPLAN_BINARY")
        if prebuilt:
            copy_binary(prebuilt, dest)
        else:
            go_build(dest)

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return [*outputs, self._binary_path()]

    def _binary_path(self):
        return os.path.join(self.build_lib, "ckptplan", "_bin", EXE)


class BinaryDistribution(Distribution):
    """A distribution that is not pure Python: installed into platlib and
    laid out at the root of the wheel rather than under .data/purelib."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """A wheel for one platform and any Python 3."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


def copy_binary(src, dest):
    if not (os.path.isfile(src) and os.access(src, os.X_OK)):
        raise SystemExit(
            "error: CKPTPLAN_BINARY=%s is not an executable file; unset it to "
            "build the binary with Go, or point it at a ckptplan binary" % src
        )
    print("ckptplan: copying the binary %s (from CKPTPLAN_BINARY) into the wheel" % src)
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o755)


def go_build(dest):
    if not os.path.isfile(os.path.join(REPO, "go.mod")) or not os.path.isdir(
        os.path.join(REPO, "cmd", "ckptplan")
    ):
        raise SystemExit(
            "error: the ckptplan wheel carries the Go binary, and the Go sources "
            "are not at %s (is this a copy of python/ without the rest of the "
            "repository?); build from a clone of the repository, or set "
            "CKPTPLAN_BINARY to a ckptplan binary built for this platform" % REPO
        )
    go = shutil.which("go")
    if go is None:
        raise SystemExit(
            "error: building the ckptplan wheel compiles the ckptplan binary with "
            "Go (go build ./cmd/ckptplan), and 'go' is not on PATH; install Go "
            "(see go.mod for the version, https://go.dev/dl/) or set "
            "CKPTPLAN_BINARY to a ckptplan binary built for this platform"
        )
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    cmd = [go, "build", "-trimpath", "-o", os.path.abspath(dest), "./cmd/ckptplan"]
    print("ckptplan: %s (in %s)" % (" ".join(cmd), REPO))
    try:
        subprocess.run(cmd, cwd=REPO, env=env, check=True)
    except subprocess.CalledProcessError as err:
        raise SystemExit("error: go build failed with status %d" % err.returncode) from None


setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPyWithBinary, "bdist_wheel": PlatformWheel},
)
