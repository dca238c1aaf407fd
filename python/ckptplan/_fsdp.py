"""FSDP2 as a plan counts it, read from a live model.

A model whose decoder layers, and then the model, PyTorch's
``fully_shard`` wraps trains under ZeRO stage 3 over the ranks of the
layers' mesh: ``fsdp2_flags`` returns the binary's flags for it (``--dp N
--zero 3 --sharding fsdp2 --reshard ...``), the reshard policy saying
whether the last layer keeps its weights gathered after its forward
(``reshard_after_forward=False`` on it alone: torchtitan 0.1's default
policy) or every layer reshards (fully_shard's default). What ckptplan
does not plan is refused, saying what: a decoder layer or the model not
wrapped, another layer kept gathered, resharding to a smaller mesh, the
model resharding after its forward, HSDP's replicated dimension,
``replicate``, CPU offload, and a ``MixedPrecisionPolicy`` that casts the
weights or the gradients.

FSDP2 keeps these settings in its modules' private state (each module's
``_get_fsdp_state()._fsdp_param_group``: its meshes, its parameters and
their mixed-precision policy, from PyTorch 2.4 to 2.15); where a release
keeps them elsewhere, the error says so and names the flags to pass
instead.

Example:
    >>> import torch.nn as nn
    >>> fsdp2_flags(nn.Linear(2, 2), [])
    []
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn as nn

from ._binary import CkptplanUsageError

_BY_HAND = "pass the flags for what FSDP2 runs by extra_args=('--dp', RANKS, '--zero', '3', '--reshard', ...)"


def _fsdp_module() -> Optional[type]:
    """FSDP2's module class where this PyTorch has one, else None."""
    try:
        from torch.distributed.fsdp import FSDPModule  # PyTorch 2.6 on
        return FSDPModule
    except ImportError:
        pass
    try:
        from torch.distributed._composable.fsdp import FSDPModule  # 2.4 and 2.5
        return FSDPModule
    except ImportError:
        return None


def _refuse(what: str) -> CkptplanUsageError:
    return CkptplanUsageError(f"ckptplan.plan: {what}")


def _group(module: nn.Module) -> Any:
    """The FSDP2 parameter group of a module fully_shard wraps, None where
    it has no parameters."""
    return module._get_fsdp_state()._fsdp_param_group


def fsdp2_flags(model: nn.Module, layers: Sequence[nn.Module], base: Optional[nn.Module] = None) -> list[str]:
    """The binary's flags for the FSDP2 that wraps model, whose decoder
    layers are layers; [] where FSDP2 wraps none of it. The model passed
    to fully_shard after its layers, whose group holds the embedding and
    the head, is model, or base (the transformers model inside a PEFT
    one). Raises CkptplanUsageError where ckptplan does not plan the
    wrapping."""
    cls = _fsdp_module()
    if cls is None or not any(isinstance(m, cls) for m in model.modules()):
        return []
    root = next((m for m in (model, base) if isinstance(m, cls)), base if base is not None else model)
    if not layers:
        raise _refuse("FSDP2 wraps this model, and ckptplan finds no decoder layers in it: pass the flags "
                      "by extra_args=('--dp', RANKS, '--zero', '3')")
    bare = [k for k, layer in enumerate(layers) if not isinstance(layer, cls)]
    if bare:
        raise _refuse(f"FSDP2 wraps this model, but decoder layers {bare} are not passed to fully_shard on their own: "
                      "ckptplan plans each decoder layer wrapped, then the model")
    if not isinstance(root, cls):
        raise _refuse("FSDP2 wraps the decoder layers, but the model is not passed to fully_shard after them: ckptplan "
                      "plans the model wrapped too, its embedding and head sharded as one group")
    try:
        groups = [_group(layer) for layer in layers]
        top, state = _group(root), root._get_fsdp_state()
        if any(g is None for g in groups):
            raise _refuse("a decoder layer fully_shard wraps has no parameters of its own")
        meshes = [g.mesh_info for g in groups]
        if any(not hasattr(m, "shard_mesh_size") for m in meshes):
            raise _refuse(f"the decoder layers are replicated, not sharded (replicate): {_BY_HAND}")
        ranks = {m.shard_mesh_size for m in meshes}
        replicated = any(getattr(m, "replicate_mesh_dim", None) is not None for m in meshes)
        posts = [g.post_forward_mesh_info for g in groups]
        # The model reshards after its forward only where it is told to
        # (True passed to fully_shard, from PyTorch 2.9); by default its
        # lazy initialization keeps it gathered.
        root_reshards = (top is not None and top.post_forward_mesh_info is not None
                         and not getattr(state, "_auto_reshard_after_forward", True))
        params = [(k, p) for k, g in enumerate(groups) for p in g.fsdp_params]
        offloaded = sorted({k for k, p in params if getattr(p, "offload_to_cpu", False)})
        # Each parameter's policy (PyTorch 2.7 on) or its group's.
        casts = [(k, p.sharded_param.dtype, getattr(p, "mp_policy", None) or groups[k].mp_policy) for k, p in params]
    except (AttributeError, AssertionError) as err:
        raise _refuse(f"PyTorch {torch.__version__} keeps FSDP2's settings where ckptplan does not read them ({err}); "
                      f"{_BY_HAND}") from None
    if len(ranks) != 1:
        raise _refuse(f"the decoder layers are sharded over meshes of {sorted(ranks)} ranks: ckptplan plans one mesh")
    n = ranks.pop()
    if replicated:
        raise _refuse(f"FSDP2 shards over a mesh with a replicated dimension (HSDP): ckptplan plans sharding over one "
                      f"dimension; {_BY_HAND}")
    smaller = [k for k, post in enumerate(posts) if post is not None and post.shard_mesh_size != n]
    if smaller:
        raise _refuse(f"decoder layers {smaller} reshard after their forward to fewer ranks than the {n} they shard "
                      "over: ckptplan plans resharding to all of them or none")
    kept = [k for k, post in enumerate(posts) if post is None]
    if kept and kept != [len(layers) - 1]:
        raise _refuse(f"decoder layers {kept} keep their weights gathered after their forward "
                      "(reshard_after_forward=False): ckptplan plans every layer resharded, or every one but the last "
                      "(torchtitan 0.1's default policy)")
    if root_reshards:
        raise _refuse("the model reshards its own weights (the embedding's, the head's) after its forward "
                      "(reshard_after_forward=True passed to fully_shard on it): ckptplan plans them kept gathered to "
                      "the backward, fully_shard's default for the model")
    if offloaded:
        raise _refuse(f"FSDP2 offloads the shards of decoder layers {offloaded} to the CPU (CPUOffloadPolicy): "
                      "ckptplan does not plan offloading")
    for k, dtype, mp in casts:
        if not dtype.is_floating_point:
            continue  # FSDP2 casts floating-point parameters only
        for field in ("param_dtype", "reduce_dtype"):
            cast = getattr(mp, field, None)
            if cast is not None and cast != dtype:
                raise _refuse(f"FSDP2's MixedPrecisionPolicy({field}={cast}) casts decoder layer {k}'s {dtype} "
                              "weights or gradients: ckptplan does not plan FSDP2's casts")
    return ["--dp", str(n), "--zero", "3", "--sharding", "fsdp2", "--reshard", "all-but-last" if kept else "all"]
