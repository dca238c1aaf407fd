"""Predicted step times against measured ones, on a CUDA GPU.

test_step_time does this on the CPU; here the device is the GPU PyTorch
runs on, and each bf16 Llama step (sdpa's flash kernel, fused AdamW,
storing everything and recomputing with the every-k solver) is predicted
twice:

- with the figures ckptplan knows for the GPU by name (``--device``, the
  datasheet's peaks at the efficiencies costmodel/roofline.go documents),
  which is what a user who names their GPU gets;
- with the GPU's figures measured here on the model's own shapes
  (``figures``): the bf16 throughput of its linears forward and backward,
  what sdpa's flash kernel reaches, the bandwidth of an elementwise op
  over buffers far larger than the caches, and the host's time a kernel,
  given as
  ``--roofline``.

A step is timed with CUDA events around it, the median of several after
warm-up steps. A benchmark: CKPTPLAN_TIMING=1 runs it where PyTorch sees
a GPU (CI has none; docs/validation.md records the runs). Set
CKPTPLAN_RECORD to a file to append each case's figures as JSON lines.
"""
from __future__ import annotations

import json
import os
import statistics
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ckptplan._gpus import known_device  # noqa: E402
from ckptplan.introspect import describe  # noqa: E402
from test_step_time import predicted, stepper  # noqa: E402

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no CUDA GPU"),
              pytest.mark.skipif(os.environ.get("CKPTPLAN_TIMING") != "1",
                                 reason="a benchmark: CKPTPLAN_TIMING=1 runs it")]

VOCAB = 32000
FUSED = "adamw-fused"  # what stepper runs on a GPU
TOLERANCE = 0.15


def timed(f, n: int = 10, warm: int = 3) -> float:
    """The median of n calls of f, seconds on the GPU's clock (CUDA
    events), after warm untimed calls."""
    for _ in range(warm):
        f()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        f()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def build(hidden: int, layers: int):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                                   num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 128),
                                   vocab_size=VOCAB, max_position_embeddings=8192, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.config.use_cache = False
    return model


def _each(f, n: int = 20) -> float:
    """The GPU's time of one of n back-to-back calls of f, seconds: the
    host queues them ahead, so that a kernel longer than its launch is
    timed alone."""
    return timed(lambda: [f() for _ in range(n)], 5, 2) / n


def figures(model, batch: int, seq: int, hidden: int, layers: int) -> str:
    """The GPU's roofline, measured as --roofline says it: the bf16
    throughput of the model's linears' products at its rows (forward, and
    the backward's two), what sdpa's flash kernel reaches forward and
    backward at its shapes, the bandwidth of an elementwise op over a
    buffer far larger than the caches, and the host's time a kernel in a
    step of the same architecture too small for its work to count."""
    rows = batch * seq
    flops, seconds = 0, 0.0
    shapes: dict[tuple[int, int], int] = {}
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            shapes[(m.in_features, m.out_features)] = shapes.get((m.in_features, m.out_features), 0) + 1
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    for (fin, fout), count in shapes.items():
        x, w, g = torch.randn(rows, fin, **bf16), torch.randn(fout, fin, **bf16), torch.randn(rows, fout, **bf16)
        seconds += count * (_each(lambda: x @ w.t()) + _each(lambda: g @ w) + _each(lambda: g.t() @ x))
        flops += count * 6 * rows * fin * fout
    matrix = flops / seconds
    x, y = torch.randn(1 << 27, **bf16), torch.randn(1 << 27, **bf16)
    z = torch.empty_like(x)
    bandwidth = 3 * x.numel() * 2 / _each(lambda: torch.add(x, y, out=z), 10)
    heads = hidden // 64
    q, k, v = (torch.randn(batch, heads, seq, 64, **bf16, requires_grad=True) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)

    def attention():
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), grad)

    att = 3 * 4 * batch * heads * seq * seq * 64 / _each(attention, 5)
    tiny = build(64, layers)
    launch = timed(stepper(tiny, 1, 8, "none"), 10, 3) / kernels(describe(tiny, batch=1, seq=8), "none")
    return f"matrix={matrix},attention={att},bandwidth={bandwidth},launch={launch}"


def kernels(setup, solver: str) -> float:
    """The kernels ckptplan counts in a step: its time with every kernel
    at 1 µs and no work."""
    flags = ["--roofline", "matrix=1e30,attention=1e30,bandwidth=1e30,launch=1e-6"]
    return predicted(setup, solver, flags, FUSED) * 1e6


def profiled(step) -> tuple[int, float]:
    """The kernels (and copies and fills) one step runs on the GPU, as
    PyTorch's profiler counts them, and the seconds they take together:
    the time the GPU is busy."""
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    ran = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(ran), sum(e.time_range.elapsed_us() for e in ran) * 1e-6


def host(step, n: int = 5) -> float:
    """The median host time of a step, seconds: from its call to its
    return, the GPU left to finish after."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(times)


CASES = [(512, 4, 1, 512), (1024, 8, 4, 2048), (2048, 8, 2, 2048), (4096, 4, 1, 4096), (4096, 4, 4, 4096)]


@pytest.mark.parametrize("hidden,layers,batch,seq", CASES)
def test_cuda_step_time(ckptplan_binary, hidden, layers, batch, seq):
    """Where the GPU bounds the step (its kernels run at least 90% of
    it), the step time predicted on the figures ckptplan knows for the
    GPU is within 15% of measured, storing everything and recomputing;
    everywhere, recomputing is predicted and measured to cost more. The
    prediction on the figures measured here, the host's time and the
    kernels counted are printed and recorded: where the host bounds the
    step, torch.utils.checkpoint's own Python is not priced
    (docs/validation.md)."""
    name = torch.cuda.get_device_name()
    device = known_device(name)
    if device is None:
        pytest.skip(f"ckptplan knows no figures for {name!r}")
    solvers = ("none", "every-k")
    steps, setup = {}, None
    for solver in solvers:
        model = build(hidden, layers)
        setup = setup or describe(model, batch=batch, seq=seq)
        steps[solver] = (model, stepper(model, batch, seq, solver))
    roofline = figures(steps["none"][0], batch, seq, hidden, layers)
    rows = {}
    for solver in solvers:
        measured = timed(steps[solver][1])
        ours = predicted(setup, solver, ["--roofline", roofline], FUSED)
        sheet = predicted(setup, solver, ["--device", device], FUSED)
        count, busy = profiled(steps[solver][1])
        extra = {"host_s": host(steps[solver][1]), "busy_s": busy, "profiled_kernels": count,
                 "counted_kernels": kernels(setup, solver), "config": setup.config, "flags": setup.flags()}
        rows[solver] = (measured, sheet, busy)
        print(f"h{hidden} x{layers} b{batch} s{seq} {solver}: measured {measured * 1e3:.2f} ms, predicted "
              f"{sheet * 1e3:.2f} ({sheet / measured:.3f}) on {name}'s figures, {ours * 1e3:.2f} "
              f"({ours / measured:.3f}) on those measured here; host {extra['host_s'] * 1e3:.2f} ms, "
              f"GPU busy {busy * 1e3:.2f} ms, "
              f"kernels {extra['profiled_kernels']} profiled, {extra['counted_kernels']:.0f} counted; {roofline}")
        path = os.environ.get("CKPTPLAN_RECORD")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({"case": f"time h{hidden} x{layers} b{batch} s{seq} {solver}", "device": name,
                                    "torch": torch.__version__, "transformers": transformers.__version__,
                                    "measured_s": measured, "predicted_s": ours, "datasheet_s": sheet,
                                    "roofline": roofline, **extra}) + "\n")
    for solver in solvers:
        measured, sheet, busy = rows[solver]
        if busy >= 0.9 * measured:
            assert abs(sheet / measured - 1) <= TOLERANCE, (solver, rows)
    assert rows["none"][0] < rows["every-k"][0] and rows["none"][1] < rows["every-k"][1], rows
