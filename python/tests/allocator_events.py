"""The CPU allocator's events in a profile, for the tests that measure a
whole step on several ranks (test_step_peak's DDP case,
test_deepspeed_zero12, test_fsdp2_step)."""
from __future__ import annotations

from typing import Callable, Optional


def allocations(prof, span_of: Callable[[str], Optional[str]]):
    """The allocator's events of a profiler run with ``profile_memory``,
    as (time, total allocated after it, its size) sorted by time, and the
    spans of the ops span_of names: their (start, end), by that name
    (span_of returns None for other ops). Each event's total is what the
    allocator holds over every thread, so a tensor another thread frees,
    of which the profiler records no event, still leaves it."""
    from torch._C._profiler import _EventType

    nodes = list(prof.profiler.kineto_results.experimental_event_tree())
    spans, events = {}, []
    while nodes:
        n = nodes.pop()
        nodes.extend(n.children)
        if n.tag == _EventType.Allocation:
            events.append((n.start_time_ns, n.extra_fields.total_allocated, n.extra_fields.alloc_size))
        elif n.tag == _EventType.TorchOp and (name := span_of(n.name)) is not None:
            spans[name] = (n.start_time_ns, n.end_time_ns)
    events.sort()
    return spans, events


def profiled_steps(setup: Callable[[], tuple], steps: int = 3, after_backward: Optional[Callable[[], None]] = None,
                   micro: int = 1):
    """Runs setup() — which makes the model, its optimizer and a batch, and
    returns them (and anything else) — and then steps training steps of
    it, all under the profiler with ``profile_memory``, each of micro
    micro-batches (the loss divided by micro, the gradients accumulated);
    each part of step k runs in a record_function named "forward k",
    "backward k" and "step k", the forward and backward of its last
    micro-batch (the earlier ones' "forward k.m", "backward k.m");
    after_backward, when given, runs between the last backward and the
    step, outside them. Returns the profile and what setup returned."""
    import gc

    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        made = setup()
        model, optimizer, batch = made[:3]
        for step in range(steps):
            for m in range(micro):
                name = f"{step}" if m == micro - 1 else f"{step}.{m}"
                gc.collect()
                with record_function(f"forward {name}"):
                    loss = model(**batch).loss
                    if micro > 1:
                        loss = loss / micro
                with record_function(f"backward {name}"):
                    loss.backward()
                    del loss
            if after_backward is not None:
                after_backward()
            with record_function(f"step {step}"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    return prof, made


def part_peaks(prof, step: int) -> dict[str, int]:
    """The most the allocator held in each part ("forward", "backward",
    "step") of step step of a profiled_steps run."""
    suffix = f" {step}"
    spans, events = allocations(prof, lambda name: name.split()[0] if name.endswith(suffix) else None)
    return {part: max(b for t, b, _ in events if start <= t <= end) for part, (start, end) in spans.items()}
