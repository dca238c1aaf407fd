"""ckptplan.plan on a model FSDP2 wraps reads how it is sharded.

Each case wraps test_step_peak's Llama with fully_shard in a one-rank gloo
group on the CPU (each decoder layer, then the model), in a process of its
own, and plans it with no flags: the plan is the one made with the flags
FSDP2's settings mean (``--dp 1 --zero 3 --reshard ...``), which
test_fsdp2_step measures against FSDP2's own allocations, and a wrapping
ckptplan does not plan is refused, saying what.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ckptplan  # noqa: E402
from test_fsdp2_export import FSDP2  # noqa: E402
from test_step_peak import BATCH, SEQ, build  # noqa: E402

pytestmark = FSDP2


def _worker(rank: int, port: int, kept: list, bf16: bool, root: str, out: str) -> None:
    """Wraps the Llama with fully_shard, the layers kept lists with
    reshard_after_forward=False, under a MixedPrecisionPolicy computing
    in bf16 where bf16 says so, and then the model as root says: with
    fully_shard's default ("default"), reshard_after_forward=True
    ("reshard") or not at all ("none"); plans it and writes the plan's
    figures, or the error's message."""
    import json
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ckptplan._fsdp import fsdp2_flags
    from ckptplan.layers import decoder_layers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    model = build(0)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None)
    for k, layer in enumerate(decoder_layers(model)):
        fully_shard(layer, mesh=mesh, reshard_after_forward=k not in kept, mp_policy=mp)
    if root != "none":
        fully_shard(model, mesh=mesh, mp_policy=mp, **({"reshard_after_forward": True} if root == "reshard" else {}))
    try:
        plan = ckptplan.plan(model, "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer="adamw-fused")
        got = {"peak": plan.peak_bytes, "at": plan.peak_at, "static": plan.static_bytes,
               "flags": fsdp2_flags(model, decoder_layers(model))}
    except ckptplan.CkptplanUsageError as err:
        got = {"error": str(err)}
    with open(out, "w") as f:
        json.dump(got, f)


@pytest.mark.parametrize("kept,reshard", [([], "all"), ([3], "all-but-last")])
def test_plan_reads_fully_shard(ckptplan_binary, tmp_path, kept, reshard):
    """Every layer resharded after its forward, or every one but the
    last: the plan of the wrapped model is the plan with the flags, not
    the plan of the model unsharded."""
    from test_deepspeed_zero3 import spawn

    got = spawn(tmp_path, "test_fsdp2_plan", kept, False, "default", ranks=1)
    want = ckptplan.plan(build(0), "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer="adamw-fused",
                         extra_args=("--dp", "1", "--zero", "3", "--reshard", reshard))
    unsharded = ckptplan.plan(build(0), "1GiB", batch=BATCH, seq=SEQ, solver="none", optimizer="adamw-fused")
    flags = ["--dp", "1", "--zero", "3", "--sharding", "fsdp2", "--reshard", reshard]
    assert got == {"peak": want.peak_bytes, "at": want.peak_at, "static": want.static_bytes, "flags": flags}, got
    assert got["peak"] != unsharded.peak_bytes


def _root_reshards_when_told() -> bool:
    """Whether fully_shard(model, reshard_after_forward=True) keeps the
    model resharding after its forward: PyTorch 2.9 on (before, its lazy
    initialization keeps the root gathered whatever it is told)."""
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 9)


@pytest.mark.parametrize("kept,bf16,root,message", [
    ([0], False, "default", "decoder layers [0] keep their weights gathered"),
    ([], True, "default", "MixedPrecisionPolicy(param_dtype=torch.bfloat16) casts decoder layer 0's torch.float32"),
    ([], False, "none", "the model is not passed to fully_shard after them"),
    pytest.param([], False, "reshard", "the model reshards its own weights",
                 marks=pytest.mark.skipif(not _root_reshards_when_told(), reason="the root stays gathered before 2.9"))])
def test_plan_refuses_what_it_does_not_plan(ckptplan_binary, tmp_path, kept, bf16, root, message):
    """A layer but the last kept gathered, weights FSDP2 casts to
    compute, the model not wrapped, or the model told to reshard after
    its forward: refused, saying what."""
    from test_deepspeed_zero3 import spawn

    got = spawn(tmp_path, "test_fsdp2_plan", kept, bf16, root, ranks=1)
    assert message in got.get("error", ""), got
