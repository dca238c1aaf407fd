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


def test_the_docs_python_runs(ckptplan_binary):
    """Every Python block of docs/*.md runs as written, given the model and
    batch it names: a tiny Llama with random weights and a batch of the
    shape it plans for."""
    import torch
    import transformers

    blocks = [b for doc in sorted((ROOT / "docs").glob("*.md"))
              for b in re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)]
    assert blocks, "no Python in docs/"
    for code in blocks:
        shape = re.search(r"batch=(\d+), seq=(\d+)", code)
        n, seq = (int(shape.group(1)), int(shape.group(2))) if shape else (2, 16)
        config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                          intermediate_size=64, vocab_size=64, max_position_embeddings=seq)
        scope = {"model": transformers.LlamaForCausalLM(config),
                 "batch": {"input_ids": torch.zeros(n, seq, dtype=torch.long)}}
        exec(compile(code, "docs", "exec"), scope)


def test_readme_trainer_example_runs(ckptplan_binary, tmp_path, monkeypatch):
    """The README's Trainer example is python/examples/trainer_example.py,
    and it trains."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    example = (ROOT / "python" / "examples" / "trainer_example.py").read_text(encoding="utf-8")
    assert example in blocks
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(example, "trainer_example.py", "exec"), scope)
    assert scope["trainer"].state.global_step == 4
