"""FSDP2 as a plan counts it, read from a live model.

A model whose decoder layers, and then the model, PyTorch's
``fully_shard`` wraps trains under ZeRO stage 3 over the ranks of the
layers' mesh: ``fsdp2_flags`` returns the binary's flags for it (``--dp N
--zero 3 --sharding fsdp2 --reshard ...``), the reshard policy saying
whether the last layer keeps its weights gathered after its forward
(``reshard_after_forward=False`` on it alone: torchtitan's default
policy) or every layer reshards (fully_shard's default). What ckptplan
does not plan is refused, saying what: a decoder layer not wrapped on its
own, another layer kept gathered, resharding to a smaller mesh, HSDP's
replicated dimension, and a ``MixedPrecisionPolicy`` that casts the
weights or the gradients.

FSDP2 keeps these settings in its modules' private state (each layer's
``_get_fsdp_state()._fsdp_param_group``: its meshes, its parameters and
their mixed-precision policy, from PyTorch 2.4 to 2.15); where a release keeps them elsewhere, the error says so and names
the flags to pass instead.

Example:
    >>> import torch.nn as nn
    >>> fsdp2_flags(nn.Linear(2, 2), [])
    []
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn as nn

from ._binary import CkptplanUsageError

_BY_HAND = ("pass extra_args=('--dp', RANKS, '--zero', '3', '--reshard', 'all' or 'all-but-last') "
            "for the model as fully_shard wraps it")


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


def fsdp2_flags(model: nn.Module, layers: Sequence[nn.Module]) -> list[str]:
    """The binary's flags for the FSDP2 that wraps model, whose decoder
    layers are layers; [] where FSDP2 wraps none of it. Raises
    CkptplanUsageError where ckptplan does not plan the wrapping."""
    cls = _fsdp_module()
    if cls is None or not any(isinstance(m, cls) for m in model.modules()):
        return []
    bare = [k for k, layer in enumerate(layers) if not isinstance(layer, cls)]
    if not layers or bare:
        which = f"decoder layers {bare} are not" if layers else "no decoder layer is found"
        raise CkptplanUsageError(f"ckptplan.plan: FSDP2 wraps this model, but {which} passed to fully_shard on their "
                                 "own: ckptplan plans each decoder layer wrapped, then the model")
    try:
        groups = [layer._get_fsdp_state()._fsdp_param_group for layer in layers]
        # Each parameter's policy (2.7 on) or its group's.
        settings = [(g.mesh_info, g.post_forward_mesh_info,
                     [(p.sharded_param.dtype, getattr(p, "mp_policy", None) or g.mp_policy) for p in g.fsdp_params])
                    for g in groups]
    except AttributeError as err:
        raise CkptplanUsageError(f"ckptplan.plan: PyTorch {torch.__version__} keeps FSDP2's settings where ckptplan "
                                 f"does not read them ({err}): {_BY_HAND}") from None
    ranks = {mesh.shard_mesh_size for mesh, _, _ in settings}
    if len(ranks) != 1:
        raise CkptplanUsageError(f"ckptplan.plan: the decoder layers are sharded over meshes of {sorted(ranks)} ranks: "
                                 "ckptplan plans one mesh")
    n = ranks.pop()
    if any(mesh.replicate_mesh_dim is not None for mesh, _, _ in settings):
        raise CkptplanUsageError("ckptplan.plan: FSDP2 shards over a mesh with a replicated dimension (HSDP): "
                                 f"ckptplan plans sharding over one dimension; {_BY_HAND}")
    smaller = [k for k, (_, post, _) in enumerate(settings) if post is not None and post.shard_mesh_size != n]
    if smaller:
        raise CkptplanUsageError(f"ckptplan.plan: decoder layers {smaller} reshard after their forward to fewer ranks "
                                 f"than the {n} they shard over: ckptplan plans resharding to all of them or none")
    kept = [k for k, (_, post, _) in enumerate(settings) if post is None]
    if kept and kept != [len(layers) - 1]:
        raise CkptplanUsageError(f"ckptplan.plan: decoder layers {kept} keep their weights gathered after their "
                                 "forward (reshard_after_forward=False): ckptplan plans every layer resharded, "
                                 "or every one but the last (torchtitan's default policy)")
    for k, (_, _, params) in enumerate(settings):
        for orig, mp in params:
            param, reduce = mp.param_dtype, mp.reduce_dtype
            if param not in (None, orig) or reduce not in (None, orig):
                field, cast = ("param_dtype", param) if param not in (None, orig) else ("reduce_dtype", reduce)
                raise CkptplanUsageError(f"ckptplan.plan: FSDP2's MixedPrecisionPolicy({field}={cast}) casts "
                                         f"decoder layer {k}'s {orig} weights or gradients: ckptplan does not plan "
                                         "FSDP2's casts")
    return ["--dp", str(n), "--zero", "3", "--sharding", "fsdp2", "--reshard", "all-but-last" if kept else "all"]
