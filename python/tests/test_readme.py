"""The README's Python example is python/examples/readme_example.py, which
CI runs against the installed wheel: the two must not drift apart."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_shows_the_example_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    example = (ROOT / "python" / "examples" / "readme_example.py").read_text(encoding="utf-8")
    assert blocks, "the README has no Python example"
    assert blocks[0] == example
