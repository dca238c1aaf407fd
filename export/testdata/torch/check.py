"""Measures what a model keeps for backward under an exported ckptplan plan.

    check.py EXPORTED.py --model tiny-llama|tiny-gpt2
        Builds the model (models.py, fixed seed) and a copy with the same
        weights, applies the exported module's apply_plan to the first one's
        layers, runs a forward and backward of both and prints one JSON object:
          torch              the PyTorch version
          kept_bytes         CPU allocator bytes live after the forward (loss
                             computed) less those live before it (inputs made)
          layer_kept_bytes   the same across each layer's forward: what the
                             layer keeps plus its output
          grads_match        every parameter gradient equal to the copy's
          max_abs_grad_diff  the largest difference between them
          checkpoint_calls   torch.utils.checkpoint calls in the forward
          selective_calls    selective layer forwards
        and, for comparison: ref_kept_bytes and ref_layer_kept_bytes (the copy,
        without the plan), layer_backward_bytes and ref_layer_backward_bytes
        (live bytes across each layer's backward: equal when recomputed tensors
        are freed with the layer's backward), loss_match, plan_model.

    check.py --probe --model M [EXPORTED.py]
        For layer 0 of the model without a plan, prints one JSON line per
        distinct activation storage it saves, in the order autograd first saves
        them (the order of a selective plan's "saved" list): index, bytes,
        shape and dtype of the tensor first saved, the autograd node that saved
        it and its attribute. Activations are told apart as the runtime does
        (the exported module's, else export/runtime.py).

Bytes are the CPU allocator's allocation and free events as the autograd
profiler logs them (torch.autograd.profiler.profile(profile_memory=True)),
each counted once; one thread.
Exits 1 with a message on any error.
"""
import argparse
import copy
import importlib.util
import json
import os
import sys

import torch
import torch.utils.checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # leave no __pycache__ in testdata
import models  # noqa: E402

RUNTIME = os.path.join(HERE, "..", "..", "runtime.py")


def load(path):
    """Import the Python file at path as a module."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location("ckptplan_exported", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Meter:
    """Net CPU allocator bytes (allocated less freed) while it is entered, cut
    into segments by mark(): segments[i] is what happened between the i-th
    mark and the next. One profiler session; a mark is a throwaway allocation
    of a size nothing else makes, found again in the event stream."""

    MARK = 997

    def __enter__(self):
        self.prof = torch.autograd.profiler.profile(profile_memory=True)
        self.prof.__enter__()
        return self

    def mark(self):
        torch.empty(self.MARK, dtype=torch.uint8)

    def __exit__(self, *exc):
        self.prof.__exit__(*exc)
        # The allocator's own events, each once (the profiler's per-op
        # totals match events to ops by microsecond and can count one twice).
        events = [e for e in self.prof.kineto_results.events()
                  if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
        events.sort(key=lambda e: e.start_ns() if hasattr(e, "start_ns") else e.start_us())
        self.segments = [0]
        for e in events:
            if e.nbytes() == self.MARK:
                self.segments.append(0)
            elif e.nbytes() != -self.MARK:
                self.segments[-1] += e.nbytes()
        return False


def run(model, ids, targets, counts):
    """Forward and backward of model, measured; returns the measurements and
    the loss."""
    fwd, bwd, hooks = Meter(), Meter(), []

    def pre(layer, args):
        counts[getattr(layer.forward, "ckptplan_mode", "store")] += 1
        fwd.mark()
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.requires_grad:
            x.register_hook(lambda g: bwd.mark())

    def post(layer, args, out):
        fwd.mark()
        if layer is model.layers[-1]:
            out.register_hook(lambda g: bwd.mark())

    for layer in model.layers:
        hooks.append(layer.register_forward_pre_hook(pre))
        hooks.append(layer.register_forward_hook(post))
    with fwd:
        loss = model(ids, targets)
    with bwd:
        loss.backward()
    for h in hooks:
        h.remove()
    n = len(model.layers)
    # fwd: before layer 0, layer 0, between, layer 1, ..., after the last.
    # bwd: the head, then layer n-1, ..., layer 0, then the rest.
    layers_bwd = bwd.segments[1:n + 1][::-1] if len(bwd.segments) == n + 2 else None
    return dict(kept=sum(fwd.segments), layers=fwd.segments[1:2 * n:2],
                layers_bwd=layers_bwd), loss


def check(args):
    mod = load(args.module)
    if not hasattr(mod, "apply_plan") or not hasattr(mod, "PLAN"):
        raise ValueError(f"{args.module} has no apply_plan or PLAN: not an exported ckptplan module")
    model = models.build(args.model, seed=args.seed)
    ref = copy.deepcopy(model)
    ids, targets = models.batch(model, seed=args.seed)
    mod.apply_plan(model.layers)

    counts = {"store": 0, "checkpoint": 0, "selective": 0, "torch_checkpoint": 0}
    real = torch.utils.checkpoint.checkpoint

    def counting(*a, **kw):
        counts["torch_checkpoint"] += 1
        return real(*a, **kw)

    torch.utils.checkpoint.checkpoint = counting
    try:
        got, loss = run(model, ids, targets, counts)
    finally:
        torch.utils.checkpoint.checkpoint = real
    want, ref_loss = run(ref, ids, targets, {"store": 0, "checkpoint": 0, "selective": 0})

    match, diff = True, 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        if (p.grad is None) != (q.grad is None):
            match = False
            continue
        if p.grad is not None:
            match = match and torch.equal(p.grad, q.grad)
            diff = max(diff, (p.grad - q.grad).abs().max().item())
    return {
        "torch": torch.__version__,
        "kept_bytes": got["kept"],
        "layer_kept_bytes": got["layers"],
        "grads_match": match,
        "max_abs_grad_diff": diff,
        "checkpoint_calls": counts["torch_checkpoint"],
        "selective_calls": counts["selective"],
        "ref_kept_bytes": want["kept"],
        "ref_layer_kept_bytes": want["layers"],
        "layer_backward_bytes": got["layers_bwd"],
        "ref_layer_backward_bytes": want["layers_bwd"],
        "loss_match": torch.equal(loss, ref_loss),
        "plan_model": mod.PLAN.get("model"),
    }


class Saved:
    """What the probe's pack hook keeps: the tensor and its pack number."""

    def __init__(self, n, t):
        self.n, self.t = n, t


def probe(args):
    rt = load(args.module or RUNTIME)
    model = models.build(args.model, seed=args.seed)
    ids, targets = models.batch(model, seed=args.seed)
    layer, packs, seen, io = model.layers[0], [], [], {}

    def pack(t):
        packs.append(t)
        return Saved(len(packs) - 1, t)

    def unpack(s):
        seen.append(s.n)
        return s.t

    forward = layer.forward

    def probed(*a, **kw):
        io["exempt"] = rt._not_activations(layer, a, kw)
        io["inputs"] = [t.grad_fn for t in rt._tensors((a, kw)) if t.grad_fn is not None]
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = forward(*a, **kw)
        io["out"] = out
        return out

    layer.forward = probed
    model(ids, targets)

    # Which node saved each pack: walk the layer's graph back from its output
    # to its inputs, reading every saved attribute (reading one unpacks it).
    saver, stack, visited = {}, [io["out"].grad_fn], set(io["inputs"])
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if attr.startswith("_saved_"):
                seen.clear()
                getattr(node, attr)
                for n in seen:
                    saver.setdefault(n, (node.name(), attr))
        stack.extend(f for f, _ in node.next_functions)

    index = {}
    for n, t in enumerate(packs):
        st = rt._activation(t, io["exempt"])
        if st is None or st.data_ptr() in index:
            continue
        index[st.data_ptr()] = len(index)
        node, attr = saver.get(n, (t.grad_fn.name() if t.grad_fn else None, None))
        print(json.dumps({"index": len(index) - 1, "bytes": st.nbytes(), "shape": list(t.shape),
                          "dtype": str(t.dtype).replace("torch.", ""), "grad_fn": node,
                          "attr": attr, "pack": n}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("module", nargs="?", help="the exported Python module")
    p.add_argument("--model", required=True, choices=sorted(models.CONFIGS))
    p.add_argument("--probe", action="store_true", help="list layer 0's saved activations")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    try:
        if args.probe:
            probe(args)
        else:
            if not args.module:
                p.error("the exported module is required (or --probe)")
            print(json.dumps(check(args)))
    except Exception as e:  # report any failure as one line
        # Errors raised in autograd hooks come back with a C++ trace: drop it.
        msg = str(e).split("\n\nAt:")[0]
        print(f"check.py: {type(e).__name__}: {msg}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
