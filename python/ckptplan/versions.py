"""The torch, transformers and peft releases ckptplan plans for.

What a layer keeps depends on the transformers (and torch) release that
runs it: ``ckptplan.plan`` tells the binary the live transformers release
(``--transformers``), whose table of rules says what that release's
attention keeps. ``SUPPORTED`` is the range of releases those rules cover,
``VERIFIED`` the stacks on which the tests measure every family, byte for
byte. ``check()`` (called by ``plan`` and ``apply``) warns, once per place
it is called from, when the live stack is outside the range.

Example:
    >>> from ckptplan import versions
    >>> versions.release("4.57.6")
    (4, 57)
    >>> versions.release("5.0.0.dev0")
    (5, 0)
    >>> versions.outside("transformers", "6.1.0")
    'transformers 6.1.0 is newer than the newest release ckptplan was verified on (5.24)'
    >>> versions.outside("torch", "2.7.1+cpu") is None
    True
"""
from __future__ import annotations

import re
import warnings
from importlib import metadata
from typing import Optional

#: The oldest and newest release of each package ckptplan plans for.
SUPPORTED: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "torch": ((2, 5), (2, 15)),
    "transformers": ((4, 46), (5, 24)),
    "peft": ((0, 13), (0, 21)),
}

#: The stacks the tests measure every family on (python/requirements-*.txt).
VERIFIED: tuple[dict[str, str], ...] = (
    {"torch": "2.5.1", "transformers": "4.46.3", "peft": "0.13.2"},
    {"torch": "2.5.1", "transformers": "4.57.6", "peft": "0.13.2"},
    {"torch": "2.15.0", "transformers": "5.24.0", "peft": "0.21.2"},
)


class VersionWarning(UserWarning):
    """The live torch, transformers or peft is outside the supported range."""


def release(version: str) -> tuple[int, int]:
    """major.minor of a version string ("2.7.1+cu126" → (2, 7))."""
    m = re.match(r"\s*(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"{version!r} is not a version")
    return int(m.group(1)), int(m.group(2))


def _name(r: tuple[int, int]) -> str:
    return f"{r[0]}.{r[1]}"


def outside(package: str, version: str) -> Optional[str]:
    """Why version of package is outside the supported range, or None."""
    oldest, newest = SUPPORTED[package]
    r = release(version)
    if r < oldest:
        return f"{package} {version} is older than the oldest release ckptplan plans for ({_name(oldest)})"
    if r > newest:
        return f"{package} {version} is newer than the newest release ckptplan was verified on ({_name(newest)})"
    return None


def installed(package: str) -> Optional[str]:
    """The installed version of package, or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def transformers_release() -> str:
    """The release the binary plans for: the installed transformers', as
    major.minor, no older than the oldest supported (an older one is
    planned as that, after check() has warned)."""
    import transformers

    return _name(max(release(transformers.__version__), SUPPORTED["transformers"][0]))


def check(stacklevel: int = 3) -> None:
    """Warn (VersionWarning) when the live torch, transformers or peft is
    outside SUPPORTED, naming the versions and what was verified."""
    import sys

    problems = []
    for package in SUPPORTED:
        module = sys.modules.get(package)
        version = getattr(module, "__version__", None) if module is not None else installed(package)
        if version is None:
            continue
        try:
            why = outside(package, str(version))
        except ValueError:
            why = f"{package} {version} is not a version ckptplan can read"
        if why:
            problems.append(why)
    if problems:
        stacks = "; ".join(", ".join(f"{p} {v}" for p, v in s.items()) for s in VERIFIED)
        warnings.warn(f"ckptplan: {'; '.join(problems)}: its plans follow the nearest supported release's "
                      f"rules and may keep other bytes than planned (verified: {stacks})",
                      VersionWarning, stacklevel=stacklevel)
