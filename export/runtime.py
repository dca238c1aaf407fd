"""ckptplan runtime: applies PLAN, a per-layer activation-memory plan, to a model.

Call apply_plan(layers) once, after building the model and before training,
with the model's transformer layers in order (model.model.layers for a
Hugging Face Llama, model.transformer.h for GPT-2). Each layer then runs as
the plan says:

  store       unchanged: autograd keeps everything the layer saves.
  checkpoint  torch.utils.checkpoint (non-reentrant): keeps only the layer's
              inputs and the RNG state, and reruns the layer in backward.
  selective   keeps only the saved activations the plan marks keep=true; the
              others are freed after the forward and recomputed in backward by
              rerunning the layer's forward (same arguments, same RNG state).

Gradients are the same as without the plan. Works with PyTorch 1.13 and 2.x.
"""
import contextlib
import functools
import weakref

import torch
import torch.utils.checkpoint

MODES = ("store", "checkpoint", "selective")


def apply_plan(layers, plan=None):
    """Make each of layers run as the matching entry of plan["layers"] says.

    plan defaults to this module's PLAN. Sets each layer's forward (an
    instance attribute; applying a plan again starts from the forward the
    layer had before the first). Returns how many layers got each mode.
    """
    if plan is None:
        plan = PLAN  # noqa: F821 (defined above this text in the exported module)
    layers, entries = list(layers), plan["layers"]
    if len(layers) != len(entries):
        raise ValueError(
            f"the plan for {plan.get('model', 'the model')} has {len(entries)} layers "
            f"but {len(layers)} were given: pass the model's transformer layers, in order")
    counts = dict.fromkeys(MODES, 0)
    for layer, entry in zip(layers, entries):
        name, mode = entry.get("name", "?"), entry.get("mode")
        if mode not in MODES:
            raise ValueError(f"{name}: unknown mode {mode!r} (valid: {', '.join(MODES)})")
        if mode == "selective" and "saved" not in entry:
            raise ValueError(f"{name}: a selective layer needs its 'saved' list")
        forward = layer.forward
        if isinstance(forward, _Planned):
            forward = forward.inner
        if mode == "store":
            if isinstance(layer.forward, _Planned):
                layer.forward = forward
        else:
            layer.forward = _Planned(forward, layer, name, mode, entry.get("saved"),
                                     (plan.get("batch"), plan.get("seq")))
        counts[mode] += 1
    return counts


class _Planned:
    """A layer's forward as its plan entry says. An object rather than a
    closure, so that a deep copy of the model runs its own layers."""

    def __init__(self, inner, layer, name, mode, saved, shape=(None, None)):
        self.inner, self.layer, self.name, self.ckptplan_mode = inner, layer, name, mode
        self.shape = shape  # the planned (batch, sequence), when the plan says
        if mode == "selective":
            self.keep = [bool(s.get("keep")) for s in saved]
            self.sizes = [int(s["bytes"]) for s in saved]

    def __call__(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.inner(*args, **kwargs)
        x = args[0] if args else kwargs.get("hidden_states")
        if None not in self.shape and isinstance(x, torch.Tensor) and x.dim() >= 2 and \
                tuple(x.shape[:2]) != tuple(self.shape):
            raise ValueError(
                f"ckptplan: {self.name} was planned for batch {self.shape[0]} and sequence "
                f"{self.shape[1]} but is called with batch {x.shape[0]} and sequence {x.shape[1]}: "
                "what it keeps and recomputes differs with the shape; export a plan for these "
                "shapes (ckptplan export ... --batch B --seq S)")
        if self.ckptplan_mode == "checkpoint":
            # Bind keyword arguments: checkpoint takes some of its own.
            fn = functools.partial(self.inner, **kwargs) if kwargs else self.inner
            return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
        return _selective(self, args, kwargs)


# Which saved tensors are activations ------------------------------------

def _storage(t):
    """The storage holding t's data (the untyped one where torch has it)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _tensors(obj):
    """The tensors in a (nested) argument: tensors, lists, tuples, dicts."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _not_activations(layer, args, kwargs):
    """Addresses of the storages a call of layer saves without allocating them:
    its parameters and buffers and the tensors it was called with."""
    tensors = [*layer.parameters(), *layer.buffers(), *_tensors((args, kwargs))]
    return {_storage(t).data_ptr() for t in tensors}


def _activation(t, exempt):
    """The storage of saved tensor t if it is an activation of the layer call
    (exempt: _not_activations of the call), else None. Scalars that own their
    own storage (a wrapped 1/sqrt(d)) are not planned, so not activations."""
    st = _storage(t)
    if st.nbytes() == 0 or st.data_ptr() in exempt:
        return None
    if t.dim() == 0 and st.nbytes() == t.element_size():
        return None
    return st


# Selective recomputation -------------------------------------------------

class _Dropped:
    """What autograd holds instead of a dropped saved tensor: the layer call it
    came from (which knows its position among the tensors the call saved).
    Only autograd owns it, so it dies when autograd no longer needs it."""
    __slots__ = ("call", "shape", "__weakref__")


class _Call:
    """One forward of a selective layer, as much as rerunning it needs."""

    def __init__(self, forward, name, args, kwargs):
        self.forward, self.name, self.args, self.kwargs = forward, name, args, kwargs
        self.holders = {}  # pack number -> weakref to its _Dropped
        self.recomputed = weakref.WeakKeyDictionary()  # _Dropped -> tensor
        # RNG and autocast state, as torch.utils.checkpoint keeps them.
        self.cpu_rng = torch.get_rng_state()
        self.devices = sorted({t.get_device() for t in _tensors((args, kwargs)) if t.is_cuda})
        self.cuda_rng = [torch.cuda.get_rng_state(d) for d in self.devices]
        self.autocast = _autocast_state()

    def drop(self, n, t):
        """Stand-in for the n-th tensor saved in the forward, t."""
        h = _Dropped()
        h.call, h.shape = self, t.shape
        self.holders[n] = weakref.ref(h)
        return h

    def recompute(self):
        """Rerun the forward and keep the tensors its still-needed stand-ins
        replaced: the n-th tensor saved is the same tensor, the same view."""
        count = 0

        def pack(t):
            nonlocal count
            n, count = count, count + 1
            ref = self.holders.get(n)
            h = ref() if ref is not None else None
            if h is not None:
                if t.shape != h.shape:
                    raise RuntimeError(
                        f"{self.name}: recomputing saved tensor {n} gave shape {tuple(t.shape)}, "
                        f"not {tuple(h.shape)}: the layer's forward is not deterministic")
                self.recomputed[h] = t.detach()
            # The recomputed graph itself is thrown away: it keeps nothing.

        def unpack(_):
            raise RuntimeError("ckptplan: a recomputed graph was used in backward")

        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu_rng)
            for d, state in zip(self.devices, self.cuda_rng):
                torch.cuda.set_rng_state(state, d)
            with contextlib.ExitStack() as stack:
                for device, enabled, dtype, cache in self.autocast:
                    stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled,
                                                       cache_enabled=cache))
                stack.enter_context(torch.enable_grad())
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, unpack))
                self.forward(*self.args, **self.kwargs)


def _autocast_state():
    """(device, enabled, dtype, cache) for each autocast device in use."""
    cache = torch.is_autocast_cache_enabled()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d), cache)
                for d in devices]
    state = {"cpu": (torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()),
             "cuda": (torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype())}
    return [(d, *state[d], cache) for d in devices]


def _unpack(x):
    """Saved-tensor unpack hook of selective layers. A recomputed tensor is
    handed over once: backward needs it no longer (a second backward through
    a retained graph recomputes it again)."""
    if not isinstance(x, _Dropped):
        return x
    if x not in x.call.recomputed:
        x.call.recompute()
    return x.call.recomputed.pop(x)


def _selective(p, args, kwargs):
    """Run p.inner keeping only the saved activations that p.keep marks.

    The k-th distinct activation storage the forward saves is plan entry k;
    its size must be p.sizes[k]. The dropped ones are replaced by stand-ins
    and all recomputed when backward first needs one of them; autograd gets
    each recomputed tensor once and frees it with the node that used it (a
    stand-in never used is freed with the graph).
    """
    name, keep, sizes = p.name, p.keep, p.sizes
    exempt = _not_activations(p.layer, args, kwargs)
    call = _Call(p.inner, name, args, kwargs) if not all(keep) else None
    index = {}  # storage address -> k
    # Dropped tensors are held until the forward ends, so that no later
    # activation reuses their address and passes for the same storage.
    held = []
    count = 0

    def pack(t):
        nonlocal count
        n, count = count, count + 1
        st = _activation(t, exempt)
        if st is None:
            return t
        k = index.setdefault(st.data_ptr(), len(index))
        if k >= len(sizes):
            raise RuntimeError(
                f"{name}: the layer saves more activation storages than the {len(sizes)} "
                f"the plan lists (activation {k} has {st.nbytes()} bytes): "
                "the model does not match the plan")
        if st.nbytes() != sizes[k]:
            raise RuntimeError(
                f"{name}: saved activation {k} has {st.nbytes()} bytes but the plan says "
                f"{sizes[k]}: the model does not match the plan")
        if keep[k]:
            return t
        held.append(t)
        return call.drop(n, t)

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        out = p.inner(*args, **kwargs)
    held.clear()
    if len(index) != len(sizes):
        raise RuntimeError(
            f"{name}: the layer saved {len(index)} activation storages but the plan "
            f"lists {len(sizes)}: the model does not match the plan")
    return out
