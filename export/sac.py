"""Selective activation checkpointing of one layer, as a plan keeps it.

A plan keeps some of the activation storages a layer's forward saves and
drops the others. PyTorch's selective checkpointing (2.4 and later) decides
per op call instead: a call whose output its policy caches is kept, every
other call is rerun in backward. SacPolicy.find bridges the two by running
the layer's forward once with every op call numbered and every saved
storage traced to the call that made it; the k-th distinct activation
storage the forward saves is the plan's k-th saved entry (sizes checked),
and the calls that made the kept ones are the policy's. SacPolicy.contexts
is then the checkpoint's context_fn: the forward and the recomputation
number their calls alike, so call i is cached in one and taken in the other.
A layer whose keep set is a runtime's own policy (torchtitan-op) numbers
its calls the same way and caches those that policy names
(SacPolicy.torchtitan_op).

This file is shared: the ckptplan Python package imports it, and the
PyTorch and FSDP2 exports carry it in the modules they write. It imports
on PyTorch 1.13, which has no selective checkpointing (sac_available).
"""
from typing import Optional, Sequence, Tuple

import torch
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# The ops selective checkpointing runs without asking its policy.
_SAC_IGNORED = getattr(torch.utils.checkpoint, "SAC_IGNORED_OPS", frozenset())

# The keep set that is torchtitan's op-level policy, and the ops it caches
# besides every other aten.mm.
TORCHTITAN_OP = "torchtitan-op"
_TORCHTITAN_CACHED = frozenset({
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten.max.default",
})


def tree_leaves(tree) -> list:
    """The leaves of a nested argument (torch.utils._pytree's, which
    PyTorch 1.13 lacks)."""
    return tree_flatten(tree)[0]


def sac_available() -> bool:
    """Whether this PyTorch has selective activation checkpointing (>= 2.4)."""
    return hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts")


def _probe():
    """The context a policy's probe of a layer runs in: without the
    dispatch modes around it (a FLOP counter, a memory tracker), to which
    the probe, ckptplan's own bookkeeping, is no part of the step; as it
    is under fake tensors, whose mode the probe needs."""
    import contextlib

    from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack

    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:
        FakeTensorMode = ()
    if any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack()):
        return contextlib.nullcontext()
    return _disable_current_modes()


class _SacRecorder(TorchDispatchMode):
    """Records each op call: its number, and for every storage, the last op
    that made it (an address freed and allocated again is a new storage,
    made by the later op)."""

    def __init__(self):
        super().__init__()
        self.made = {}  # storage address -> op number that last made it
        self.mutated = {}  # storage address -> op number that last wrote it in place
        self.count = 0
        self.funcs = []  # the op of each number

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _SAC_IGNORED:
            return out  # the checkpoint's policy is not asked about these
        n, self.count = self.count, self.count + 1
        self.funcs.append(func)
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.layout == torch.strided}
        mutable = func._schema.is_mutable
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                p = t.untyped_storage().data_ptr()
                if p not in inputs:
                    self.made[p] = n
                elif mutable:
                    self.mutated[p] = n
        return out


class SacPolicy:
    """Which op calls of a layer's forward the checkpoint caches."""

    def __init__(self, save, name):
        self.save, self.name = frozenset(save), name

    @classmethod
    def for_layer(cls, forward, layer, args, kwargs, name: str, policy: str,
                  saved: Sequence[Tuple[str, int, bool]], exact: bool = True) -> "SacPolicy":
        """The policy of a selective layer whose keep set is policy: a
        runtime's own (torchtitan-op), or else the one that keeps the plan's
        saved entries (find; exact as find takes it)."""
        if policy == TORCHTITAN_OP:
            return cls.torchtitan_op(forward, args, kwargs, name)
        return cls.find(forward, layer, args, kwargs, name, saved, exact)

    @classmethod
    def torchtitan_op(cls, forward, args, kwargs, name: str) -> "SacPolicy":
        """torchtitan's op-level policy (selective_ac_option = "op"), the
        plan's keep set torchtitan-op: of the ops forward(*args, **kwargs)
        runs, every aten.mm but every second (the first, third, ...), the
        fused attention kernels and maxima. The CPU's flash kernel counts as
        CUDA's, which torchtitan caches, so that a layer holds on the CPU
        what the plan says it holds on a GPU."""
        rec = _SacRecorder()
        # Nothing saved: a tensor packed as itself would keep the probe's
        # graph alive (see find).
        with _probe(), torch.random.fork_rng(devices=_cuda_devices((args, kwargs))), \
                torch.autograd.graph.saved_tensors_hooks(lambda t: None, lambda t: t), rec:
            out = forward(*args, **kwargs)
        del out
        save, products = set(), 0
        for n, func in enumerate(rec.funcs):
            if func is torch.ops.aten.mm.default:
                products += 1
                if products % 2 == 1:
                    save.add(n)
            elif str(func) in _TORCHTITAN_CACHED:
                save.add(n)
        return cls(save, name)

    @classmethod
    def find(cls, forward, layer, args, kwargs, name: str,
             saved: Sequence[Tuple[str, int, bool]], exact: bool = True) -> "SacPolicy":
        """Run forward(*args, **kwargs) once, recording which op makes each
        activation storage it saves, and match them to saved: the plan's
        (tensor name, bytes, keep) entries of layer name, in first-saved
        order, each of its size; or, not exact (a call smaller than the
        planned shape), as many, none larger. Raises ValueError when they
        do not match."""
        fixed = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), *layer.buffers())}
        fixed |= {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        rec = _SacRecorder()
        # (bytes, the op that made the storage, address) in first-saved
        # order. A saved storage is alive from the op that made it to its
        # packing, and held from then on, so the last op to make its
        # address before the packing made it.
        order = []
        seen = set()
        held = []

        # On a GPU, what the forward saves in host memory (the philox seed
        # and offset of CUDA's memory-efficient attention) is no activation
        # of the plan, whose budget is the GPU's.
        host_apart = any(p.is_cuda for p in layer.parameters())

        def pack(t):
            st = t.untyped_storage()
            p = st.data_ptr()
            if host_apart and t.device.type == "cpu":
                pass
            elif st.nbytes() > 0 and p not in fixed and p not in seen:
                seen.add(p)
                order.append((st.nbytes(), rec.made.get(p), p, tuple(t.shape), t.dtype))
            # Held here, so that no address is reused while recording; the
            # graph gets a placeholder, for a tensor packed as itself by its
            # own node would make a cycle through autograd that Python's
            # collector cannot see, and the probe's graph would never be
            # freed. Its backward never runs.
            held.append(t)
            return None

        with _probe(), torch.random.fork_rng(devices=_cuda_devices((args, kwargs))), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), rec:
            out = forward(*args, **kwargs)
        del out, held
        if not _matches([o[0] for o in order], [b for _, b, _ in saved], exact):
            raise ValueError(_mismatch(name, order, saved, rec.funcs, exact))
        save = set()
        for (_, op, p, _, _), (tensor, _, keep) in zip(order, saved):
            if not keep or op is None:
                continue
            if rec.mutated.get(p, -1) > op:
                # Selective checkpointing caches an op's output as it is
                # returned; one changed in place afterwards cannot be.
                raise ValueError(
                    f"ckptplan: {name}: the plan keeps {tensor}, which the layer changes in place "
                    "after making it, so selective checkpointing cannot keep it: plan again with this "
                    "version of ckptplan, or with --solver optimal")
            save.add(op)
        return cls(save, name)

    def contexts(self):
        """The checkpoint's context_fn: the forward and the recomputation
        number the ops alike, so op i is cached in one and taken in the
        other."""
        cp = torch.utils.checkpoint
        save, count = self.save, {False: 0, True: 0}

        def policy(ctx, func, *args, **kwargs):
            r = bool(ctx.is_recompute)
            i = count[r]
            count[r] = i + 1
            return cp.CheckpointPolicy.MUST_SAVE if i in save else cp.CheckpointPolicy.PREFER_RECOMPUTE

        return cp.create_selective_checkpoint_contexts(policy)


def _matches(sizes: Sequence[int], planned: Sequence[int], exact: bool) -> bool:
    """Whether a layer call's saved activation sizes are the plan's: equal,
    or, not exact, as many and none larger."""
    if exact:
        return list(sizes) == list(planned)
    return len(sizes) == len(planned) and all(s <= p for s, p in zip(sizes, planned))


def _mismatch(name: str, order: list, saved: Sequence[Tuple[str, int, bool]], funcs: list,
              exact: bool = True) -> str:
    """Why layer name's saved activations are not the plan's: the first
    that differs (is larger, not exact), what made it, and the versions the
    plan was made for."""
    try:
        import transformers
        stack = f"transformers {transformers.__version__} and torch {torch.__version__}"
    except ImportError:
        stack = f"torch {torch.__version__}"
    i = next((i for i, (o, s) in enumerate(zip(order, saved)) if not _matches([o[0]], [s[1]], exact)),
             min(len(order), len(saved)))
    if i < len(order):
        nbytes, op, _, shape, dtype = order[i]
        made = funcs[op] if op is not None and op < len(funcs) else "the layer's input"
        live = f"{nbytes} B made by {made} ({str(dtype).replace('torch.', '')} {list(shape)})"
    else:
        live = "nothing"
    planned = f"{saved[i][0]}, {'' if exact else 'at most '}{saved[i][1]} B" if i < len(saved) else "nothing"
    return (f"ckptplan: {name} does not save what its plan says: its saved activation {i + 1} is {live}, "
            f"where the plan has {planned} (the layer saves {len(order)}, the plan {len(saved)}). This runs "
            f"{stack}: if the model is the one "
            "planned, ckptplan models these versions otherwise than they run, planning again gives the same "
            "plan, and whole layers (solver='optimal') are what applies; report the difference with these versions")


def _cuda_devices(obj) -> list:
    return sorted({t.get_device() for t in tree_leaves(obj)
                   if isinstance(t, torch.Tensor) and t.is_cuda})


def layer_input_shape(args, kwargs) -> Optional[Tuple[int, int]]:
    """(batch, sequence) of a layer call's hidden states, when it has them."""
    x = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return None
    return int(x.shape[0]), int(x.shape[1])
