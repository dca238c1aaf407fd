"""The CPU allocator's events in a profile, for the tests that measure a
whole step on several ranks (test_step_peak's DDP case,
test_deepspeed_zero12)."""
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
