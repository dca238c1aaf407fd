"""ckptplan runtime: each decoder layer of a model runs as its plan entry says.

One implementation for every way a plan is applied: ckptplan.apply (the
package's _runtime.py links here), and the modules ckptplan export writes
for PyTorch and for FSDP2, which carry this file's text after sac.py's. A
layer runs in one of three modes:

  store       unchanged: autograd keeps everything the layer saves.
  checkpoint  torch.utils.checkpoint (non-reentrant): keeps only the layer's
              inputs and the RNG state, and reruns the layer in backward.
  selective   selective activation checkpointing (PyTorch 2.4 and later):
              the layer runs in a non-reentrant checkpoint whose policy
              caches exactly the op outputs that make the plan's kept
              tensors and recomputes every other op in backward (sac.py;
              the policy is found on the layer's first call in training).
              Older PyTorch has no such policy. Where the caller allows it
              (the exported PyTorch module, for PyTorch 1.13 and later),
              the layer instead keeps exactly the plan's tensors through
              saved-tensor hooks and reruns its whole forward once in
              backward to get the others back; elsewhere it is refused.

A plan is for a batch and sequence length and runs any call up to them:
the last short batch of an epoch, a batch a data collator padded to its
longest sequence. Such a call runs the same ops, each making a tensor no
larger than at the planned shape, and a layer keeps what the plan keeps of
them, so it holds no more than the plan says. A selective layer's policy
is found again for each new shape of its arguments (a padded batch may
bring a mask the planned one had not), checking that the layer saves as
many activations as planned, none larger (else it runs checkpointed
whole, holding its input alone). A call beyond the planned batch or
sequence fails with a message saying so, unless the caller gives a plan
for its shape (ckptplan.apply's beyond="replan"). Gradients are those
without the plan.
"""
import contextlib
import functools
import inspect
import weakref

import torch
import torch.utils.checkpoint

if "SacPolicy" not in globals():  # in the package; an exported module carries sac.py above
    try:
        from ._sac import SacPolicy, layer_input_shape, sac_available, tree_leaves
    except ImportError:  # this file loaded alone (its activation helpers only)
        pass

MODES = ("store", "checkpoint", "selective")

# What a selective layer's checkpoint saves stays on the device, as the
# plan counts it, whatever saved-tensor hooks surround the layer (a
# measurement's, save_on_cpu): PyTorch's legacy behaviour, which releases
# that ask (2.15 on) are told explicitly rather than warn that it will
# change.
def _sac_kwargs() -> dict:
    try:
        params = inspect.signature(torch.utils.checkpoint.checkpoint).parameters
    except (TypeError, ValueError):
        return {}
    return {"respect_saved_tensors_hooks": False} if "respect_saved_tensors_hooks" in params else {}


_SAC_KWARGS = _sac_kwargs()


class LayerPlan:
    """One layer's plan entry: its name, mode, the activations a selective
    layer saves as (name, bytes, keep), and the keep set's policy name."""

    __slots__ = ("name", "mode", "saved", "policy")

    def __init__(self, name, mode, saved=None, policy=""):
        self.name, self.mode, self.policy = name, mode, policy or ""
        self.saved = None if saved is None else [(n, int(b), bool(k)) for n, b, k in saved]

    @classmethod
    def from_dict(cls, entry):
        """The entry of a plan's "layers" list, as JSON gives it."""
        saved = entry.get("saved")
        if saved is not None:
            saved = [(s.get("name", "?"), s["bytes"], s.get("keep", False)) for s in saved]
        return cls(entry.get("name", "?"), entry.get("mode"), saved, entry.get("policy", ""))


def check_modes(entries, rerun=False, hint=""):
    """How many of entries (LayerPlan) have each mode; raises ValueError for
    an unknown mode, a selective layer without its saved list, or one this
    PyTorch cannot run (no selective checkpointing, and rerun not allowed;
    hint ends that message)."""
    counts = dict.fromkeys(MODES, 0)
    for e in entries:
        if e.mode not in MODES:
            raise ValueError(f"{e.name}: unknown mode {e.mode!r} (valid: {', '.join(MODES)})")
        if e.mode == "selective":
            if e.saved is None:
                raise ValueError(f"{e.name}: a selective layer needs its 'saved' list")
            if not rerun and not sac_available():
                raise ValueError(
                    f"{e.name}: the plan keeps part of this layer, which needs selective activation "
                    f"checkpointing (PyTorch >= 2.4; this is {torch.__version__}){hint}")
        counts[e.mode] += 1
    return counts


class LayerRun:
    """How a layer runs in training as its plan entry says: called with the
    layer's forward (inner), the layer and a call's arguments. shape is the
    planned (batch, sequence), the most a call may have; retry says what
    to do beyond it, with {batch} and {seq} the call's; rerun allows the
    whole-forward rerun where PyTorch has no selective checkpointing;
    others, when given, is the layer's entry of a plan for a smaller
    (batch, sequence), which a call of that shape then runs; beyond, with
    others, lets a call beyond the planned shape run the entry others
    gives for it (a plan for that shape within the budget). Holds the
    selective policies, found on the first call in training of each shape
    of the layer's arguments."""

    def __init__(self, entry, shape=(None, None), rerun=False, retry="plan again for these shapes", others=None,
                 beyond=False):
        self.entry, self.shape, self.rerun, self.retry = entry, tuple(shape), rerun, retry
        self.others, self.beyond = others, beyond
        self.policies = {}  # (id of the entry, call_key of the arguments) -> SacPolicy, or None: whole

    def __call__(self, inner, layer, args, kwargs):
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        entry, exact = self._entry(args, kwargs)
        if entry.mode == "store":
            return inner(*args, **kwargs)
        if not _autocasting(args, kwargs):
            return self._run(entry, inner, layer, args, kwargs, exact)
        # torch.autocast caches its casts of the weights until it exits.
        # Cleared around the layer, its weights are cast inside it every
        # time (the forward, the policy's probe and the recomputation then
        # run the same ops) and the copies it does not save go with it.
        torch.clear_autocast_cache()
        try:
            return self._run(entry, inner, layer, args, kwargs, exact)
        finally:
            torch.clear_autocast_cache()

    def _run(self, e, inner, layer, args, kwargs, exact):
        # Keyword arguments are bound: checkpoint takes some of its own.
        fn = functools.partial(inner, **kwargs) if kwargs else inner
        if e.mode == "checkpoint":
            return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
        if not sac_available() and self.rerun:
            return _selective(e, inner, layer, args, kwargs, exact)
        # A policy is the entry's for the call's arguments; another shape
        # or padding may run another plan's entry with the same arguments.
        key = (id(e), call_key(args, kwargs))
        if key not in self.policies:
            try:
                self.policies[key] = SacPolicy.for_layer(inner, layer, args, kwargs, e.name, e.policy, e.saved, exact)
            except ValueError:
                if exact:
                    raise
                # Below the planned shape the layer saves other tensors
                # than planned (a copy that is a view for one sequence):
                # checkpointed whole it holds its input alone, no more
                # than the plan's selective layer.
                self.policies[key] = None
            if _autocasting(args, kwargs):
                torch.clear_autocast_cache()  # the probe's casts
        policy = self.policies[key]
        if policy is None:
            return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False,
                                                 context_fn=policy.contexts, **_SAC_KWARGS)

    def _entry(self, args, kwargs):
        """The plan entry a call runs and whether it was planned for the
        call: where others gives one for the call's shape, that; else the
        planned one, exact at the planned shape (or where either is
        unknown), not exact below it; beyond it, others' where beyond
        allows, else ValueError."""
        got = layer_input_shape(args, kwargs)
        want = self.shape
        if got is None or None in want:
            return self.entry, True
        if got[0] <= want[0] and got[1] <= want[1]:
            other = self.others(got) if self.others is not None else None
            if other is not None:
                return other, True
            return self.entry, got == want and self.others is None
        if self.beyond and self.others is not None:
            return self.others(got), True
        raise ValueError(
            f"ckptplan: {self.entry.name} was planned for batch {want[0]} and sequence {want[1]} "
            f"but is called with batch {got[0]} and sequence {got[1]}: the plan holds what it says for "
            f"batches and sequences up to the planned ones, not beyond; "
            f"{self.retry.format(batch=max(got[0], want[0]), seq=max(got[1], want[1]))}")


def call_key(args, kwargs):
    """What a layer call's policy depends on: the shape, dtype and device of
    each tensor it is called with, and the kind of every other argument."""
    def leaf(x):
        if isinstance(x, torch.Tensor):
            return (tuple(x.shape), x.dtype, x.device)
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        return type(x).__name__
    return tuple(leaf(x) for x in tree_leaves((args, kwargs)))


class Planned:
    """A layer's forward as its plan entry says (LayerRun). An object rather
    than a closure, so that a deep copy of the model runs its own layers."""

    def __init__(self, inner, layer, run):
        self.inner, self.layer, self.run = inner, layer, run
        self.ckptplan_mode = run.entry.mode

    def __call__(self, *args, **kwargs):
        return self.run(self.inner, self.layer, args, kwargs)


def set_forward(layer, run):
    """Make layer's forward run as run (a LayerRun) says, or as it did
    before any plan when run is None; an instance attribute, so applying a
    plan again starts from the forward the layer had before the first."""
    forward = layer.forward
    if isinstance(forward, Planned):
        forward = forward.inner
    if run is not None:
        layer.forward = Planned(forward, layer, run)
    elif isinstance(layer.forward, Planned):
        layer.forward = forward


def _autocasting(args, kwargs):
    """Whether torch.autocast is on for the device of the layer's input."""
    x = next(_tensors((args, kwargs)), None)
    device = x.device.type if x is not None else "cpu"
    try:
        return torch.is_autocast_enabled(device)
    except TypeError:  # PyTorch before 2.4 takes no device
        return torch.is_autocast_cpu_enabled() if device == "cpu" else torch.is_autocast_enabled()


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


# Selective recomputation without selective checkpointing ------------------

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


def _selective(entry, inner, layer, args, kwargs, exact=True):
    """Run inner, the forward of layer, keeping only the saved activations
    that entry (a selective LayerPlan) keeps: where PyTorch has no
    selective checkpointing.

    The k-th distinct activation storage the forward saves is saved entry
    k, of its size (no larger, when the call is not exact: smaller than
    the planned shape). The dropped ones are replaced by stand-ins and all
    recomputed when backward first needs one of them; autograd gets each
    recomputed tensor once and frees it with the node that used it (a
    stand-in never used is freed with the graph).
    """
    name = entry.name
    sizes = [b for _, b, _ in entry.saved]
    keep = [k for _, _, k in entry.saved]
    exempt = _not_activations(layer, args, kwargs)
    call = _Call(inner, name, args, kwargs) if not all(keep) else None
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
        if st.nbytes() > sizes[k] or (exact and st.nbytes() != sizes[k]):
            raise RuntimeError(
                f"{name}: saved activation {k} has {st.nbytes()} bytes but the plan says "
                f"{'' if exact else 'at most '}{sizes[k]}: the model does not match the plan")
        if keep[k]:
            return t
        held.append(t)
        return call.drop(n, t)

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        out = inner(*args, **kwargs)
    held.clear()
    if len(index) != len(sizes):
        raise RuntimeError(
            f"{name}: the layer saved {len(index)} activation storages but the plan "
            f"lists {len(sizes)}: the model does not match the plan")
    return out
