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


def apart_from_collectives(prof, span_of: Callable[[str], Optional[str]], workspaces: bool = False):
    """allocations(prof, span_of), each event's total counted from the
    profile's own allocations and frees (the allocator's total also counts
    what gloo's threads allocate outside any op, which the profile does
    not record), less what the process group's collectives hold: the
    bytes gloo's collectives allocate inside a ``c10d::`` op (a
    reduce-scatter's copy of its input, an all-gather's flat output) or on
    a thread of their own (any thread but the one that runs the most ops),
    counted from their allocation to their free wherever it happens, as
    their work objects may keep them past the op. NCCL works in the
    tensors DeepSpeed 0.16 and FSDP2 hand it (the collectives' tensor
    forms). With workspaces, less also what a CPU matrix product allocates
    and frees within itself (a 16-bit product's operands converted to
    fp32, packed copies). For CPU runs only: under CUDA the backward runs
    on threads of its own."""
    from torch._C._profiler import _EventType

    spans, allocs, threads = {}, [], {}
    stack = [(n, False, None) for n in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        n, inside, product = stack.pop()
        if n.tag == _EventType.Allocation:
            allocs.append((n.start_time_ns, n.extra_fields.total_allocated, n.extra_fields.alloc_size,
                           n.extra_fields.ptr, inside, product, n.start_tid))
            continue
        if n.tag == _EventType.TorchOp:
            threads[n.start_tid] = threads.get(n.start_tid, 0) + 1
        if n.tag == _EventType.TorchOp:
            if (name := span_of(n.name)) is not None:
                spans[name] = (n.start_time_ns, n.end_time_ns)
            inside = inside or n.name.startswith("c10d::")
            if workspaces and product is None and n.name in ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"):
                product = (n.start_time_ns, n.end_time_ns)
        stack.extend((c, inside, product) for c in n.children)
    allocs.sort(key=lambda a: a[0])
    main = max(threads, key=threads.get)  # the thread that runs the model
    frees = {}
    for t, _, size, ptr, *_ in allocs:
        if size < 0:
            frees.setdefault(ptr, []).append(t)

    def free_after(ptr, t):
        return min((f for f in frees.get(ptr, []) if f > t), default=None)

    # What is counted apart, from when: (time, change).
    changes = []
    for t, _, size, ptr, inside, product, tid in allocs:
        if size <= 0:
            continue
        freed = free_after(ptr, t)
        if inside or tid != main or product is not None and freed is not None and freed <= product[1]:
            changes.append((t, size))  # a collective's buffer, a product's workspace
            if freed is not None:
                changes.append((freed, -size))
    changes.sort()
    events, held, apart, k = [], 0, 0, 0
    for t, _, size, *_ in allocs:
        held += size
        while k < len(changes) and changes[k][0] <= t:
            apart += changes[k][1]
            k += 1
        events.append((t, held - apart, size))
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
