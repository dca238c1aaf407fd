"""Predicted step times against measured ones, on the CPU.

The CPU is the device: its figures are measured here, on the shapes of
the model at hand, single-threaded — the fp32 product throughput of its
linears, what sdpa's fused kernel reaches, the bandwidth of an elementwise
op over an activation, and the host's time a kernel in a step of the
same architecture too small for its work to count (``figures``) — and
given to the binary as ``--roofline ...,sync`` with ``--objective time``.
Its predicted time of a whole step (forward, loss, backward and
PyTorch's AdamW step, which on the CPU is the for-loop one) is compared
with the fastest of several measured steps, storing everything and
checkpointing every layer, for several sizes and sequence lengths.

Times are the CPU time of the thread that runs the step
(``time.thread_time``): single-threaded, PyTorch runs every CPU kernel of
the forward, the backward and the step on the calling thread, and what
else the machine runs then does not count. Caches and memory bandwidth
are still shared, so the test stays a benchmark, run where
CKPTPLAN_TIMING=1 (``.ci/run`` does not); what it prints is recorded in
docs/validation.md.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from ckptplan.introspect import describe  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("CKPTPLAN_TIMING") != "1",
                                reason="a benchmark: CKPTPLAN_TIMING=1 runs it")

VOCAB = 1000
TOLERANCE = 0.15


def fastest(f, n: int = 9) -> float:
    """The least of n timed calls of f, after one untimed: the calling
    thread's CPU time, seconds."""
    f()
    best = float("inf")
    for _ in range(n):
        t = time.thread_time()
        f()
        best = min(best, time.thread_time() - t)
    return best


def figures(model, batch: int, seq: int, hidden: int, layers: int) -> str:
    """The CPU's roofline, measured on the model's shapes, as --roofline
    says it.

    The product throughput is that of the model's own linears, forward
    and backward, at its rows. The host's time a kernel is that of a step
    of the same architecture at a size where the work is negligible
    (hidden 64, one sequence of 8 tokens): its measured time over the
    kernels ckptplan counts in it. In eager PyTorch on the CPU that time
    is mostly the Python of transformers' modules and of the for-loop
    optimizer around each kernel — tens of microseconds, several times a
    bare op's dispatch — and it does not grow with the shapes.
    """
    rows = batch * seq
    flops, seconds = 0, 0.0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            x = torch.randn(rows, m.in_features, requires_grad=True)
            w = torch.randn(m.out_features, m.in_features, requires_grad=True)
            seconds += fastest(lambda: torch.nn.functional.linear(x, w).sum().backward(), 5)
            flops += 6 * rows * m.in_features * m.out_features
    matrix = flops / seconds
    x, y = torch.randn(rows * hidden * 4), torch.randn(rows * hidden * 4)
    z = torch.empty_like(x)
    bandwidth = 3 * x.numel() * 4 / fastest(lambda: torch.add(x, y, out=z), 15)
    heads = hidden // 64
    q, k, v = (torch.randn(batch, heads, seq, 64, requires_grad=True) for _ in range(3))

    def attention():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    # fwd + bwd: three times the forward's 4·b·h·s²·d, as ckptplan counts
    att = 3 * 4 * batch * heads * seq * seq * 64 / fastest(attention)
    tiny = build(64, layers)
    # every kernel at 1 µs and no work: the predicted time in µs is the
    # kernels ckptplan counts in a step
    count = predicted(describe(tiny, batch=1, seq=8), "none",
                      ["--roofline", "matrix=1e30,attention=1e30,bandwidth=1e30,launch=1e-6,sync"]) * 1e6
    launch = fastest(stepper(tiny, 1, 8, "none"), 5) / count
    return f"matrix={matrix},attention={att},bandwidth={bandwidth},launch={launch},sync"


def build(hidden: int, layers: int):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                                   num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128),
                                   vocab_size=VOCAB, max_position_embeddings=4096, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(cfg)
    model.config.use_cache = False
    return model


def predicted(setup, solver: str, figures: list[str], optimizer: str = "adamw-forloop") -> float:
    """The binary's step time of a described model on the device figures
    names (--roofline, or --device), seconds: forward, backward and the
    optimizer step."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(setup.config, f)
        out = subprocess.run([ckptplan.binary(), "plan", "--format", "json", "--budget", "120GiB", "--solver", solver,
                              "--objective", "time", "--optimizer", optimizer, *figures, *setup.flags(), path],
                             capture_output=True, text=True, check=True).stdout
    plan = json.loads(out)
    assert plan["unit"] == "ps"
    return (plan["cost"] + plan["update_cost"]) * 1e-12


def stepper(model, batch: int, seq: int, solver: str):
    """The model, planned with solver and applied, as a function that runs
    one training step on the device the model is on: PyTorch's AdamW as
    --optimizer prices it there, for-loop on the CPU, fused on a GPU."""
    device = next(model.parameters()).device
    ids = torch.randint(0, VOCAB, (batch, seq), device=device)
    ckptplan.apply(model, ckptplan.plan(model, "120GiB", batch=batch, seq=seq, solver=solver))
    # lr 0: the weights, and so every step's work, stay as they are
    kind = {"fused": True} if device.type == "cuda" else {"foreach": False}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, **kind)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


SOLVERS = ("none", "every-k")
ROUNDS = 5


@pytest.mark.parametrize("hidden,layers,batch,seq", [(256, 4, 2, 256), (256, 4, 2, 512), (512, 4, 2, 256), (512, 2, 1, 1024)])
def test_step_time(ckptplan_binary, hidden, layers, batch, seq):
    """Each round measures the CPU's figures, predicts every plan's step
    on them and times it; a plan's ratio is its median over the rounds,
    so that a round the machine ran slower slows figures and steps
    alike."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        setup = describe(build(hidden, layers), batch=batch, seq=seq)
        models = {solver: build(hidden, layers) for solver in SOLVERS}
        steps = {solver: stepper(models[solver], batch, seq, solver) for solver in SOLVERS}
        rounds = []
        for _ in range(ROUNDS):
            roofline = figures(models["none"], batch, seq, hidden, layers)
            rounds.append({solver: (predicted(setup, solver, ["--roofline", roofline]),
                                    fastest(steps[solver], 3)) for solver in SOLVERS})
    finally:
        torch.set_num_threads(threads)
    ratio = {solver: statistics.median(r[solver][0] / r[solver][1] for r in rounds) for solver in SOLVERS}
    for solver in SOLVERS:
        print(f"h{hidden} x{layers} b{batch} s{seq} {solver}: median predicted/measured {ratio[solver]:.3f} over "
              + ", ".join(f"{r[solver][0] * 1e3:.1f}/{r[solver][1] * 1e3:.1f} ms" for r in rounds))
    for solver in SOLVERS:
        assert abs(ratio[solver] - 1) <= TOLERANCE, (solver, ratio[solver], rounds)
    # The ranking: recomputing every layer costs more, predicted and
    # measured, in most rounds.
    for i in (0, 1):
        assert sum(r["none"][i] < r["every-k"][i] for r in rounds) > ROUNDS // 2, rounds
