"""Fixtures shared by the Python package's tests.

``ckptplan_binary`` is the path of the Go binary the package runs: the file
CKPTPLAN_BINARY names (CI builds it once and sets it), or else one built
here with ``go build`` once per session, in which case CKPTPLAN_BINARY is set
to it for the rest of the session so that ``ckptplan._binary`` finds it.
Without either, the tests that ask for it are skipped, saying why.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

#: The repository root: python/tests/conftest.py is two levels below it.
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ckptplan_binary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The path of an executable ckptplan binary (see the module doc)."""
    named = os.environ.get("CKPTPLAN_BINARY")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            pytest.fail("CKPTPLAN_BINARY=%s is not an executable file" % named)
        yield os.path.abspath(named)
        return
    go = shutil.which("go")
    if go is None:
        pytest.skip("no ckptplan binary: CKPTPLAN_BINARY is not set and Go is not on PATH to build one")
    if not (REPO / "go.mod").is_file():
        pytest.skip("no ckptplan binary: CKPTPLAN_BINARY is not set and %s holds no Go sources" % REPO)
    out = tmp_path_factory.mktemp("bin") / "ckptplan"
    env = dict(os.environ)
    env.setdefault("CGO_ENABLED", "0")
    p = subprocess.run(
        [go, "build", "-trimpath", "-o", str(out), "./cmd/ckptplan"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    if p.returncode != 0:
        pytest.fail("go build ./cmd/ckptplan failed:\n" + p.stdout)
    os.environ["CKPTPLAN_BINARY"] = str(out)
    try:
        yield str(out)
    finally:
        if os.environ.get("CKPTPLAN_BINARY") == str(out):
            del os.environ["CKPTPLAN_BINARY"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "newer: needs a newer transformers than the pinned one (python/requirements-newer.txt); "
        ".ci/run runs these with it")
    config.addinivalue_line(
        "markers", "fsdp2: runs FSDP2 on the CPU, which needs PyTorch 2.7 or later (python/requirements-fsdp.txt); "
        ".ci/run runs these with it")
    config.addinivalue_line(
        "markers", "engines: reads an export with an engine's own configuration parser, or runs Megatron Core's layer or DeepSpeed's ZeRO 1, 2 and 3 on the CPU (DeepSpeed, Megatron Core: "
        "python/requirements-engines.txt); .ci/run runs these with it")
    config.addinivalue_line(
        "markers", "quant: measures bitsandbytes' 4- and 8-bit weights and optimizers on the CPU "
        "(python/requirements-quant.txt); .ci/run runs these with it")
    config.addinivalue_line(
        "markers", "trl: trains with TRL's SFTTrainer on the CPU (python/requirements-trl.txt, over the newest "
        "stack); .ci/run runs these with it")
