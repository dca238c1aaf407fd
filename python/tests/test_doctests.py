"""The examples in the package's docstrings run and print what they show.

Every module of ``ckptplan`` is searched for examples (``>>>``), and each
module's run through doctest: a failed example fails its module's case. The
examples that plan call the binary (the ``ckptplan_binary`` fixture sets
CKPTPLAN_BINARY for them).
"""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ckptplan


def _modules() -> list[str]:
    """The names of the package's modules that hold examples."""
    names = ["ckptplan"] + ["ckptplan." + m.name for m in pkgutil.iter_modules(ckptplan.__path__)
                            if not m.name.startswith("__")]  # importing __main__ runs the CLI
    finder = doctest.DocTestFinder()
    return [n for n in names if any(t.examples for t in finder.find(importlib.import_module(n)))]


MODULES = _modules()


def test_the_examples_are_found():
    """The search finds the modules whose docstrings show examples."""
    for name in ("ckptplan", "ckptplan.plan", "ckptplan.layers", "ckptplan._trace"):
        assert name in MODULES, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(ckptplan_binary, name):
    """Each of the module's examples prints what its docstring shows."""
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0, name
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (their output is above)"
