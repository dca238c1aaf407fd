"""DeepSpeed's ZeRO stage 3, run as the DeepSpeed export configures it,
gathers what the plan counts, block by block, to the byte.

The plan for DeepSpeed (``--sharding deepspeed``) replays DeepSpeed's
parameter coordinator over the model's modules (costmodel.DeepSpeedGathers):
each module's parameters all-gathered before it runs, the next ones in
its trace prefetched while fewer than max-live parameters are available
or in flight, each released after its module unless a prefetch already
took a later use of it, one gather's parameters in a buffer of their own,
several's in one flat buffer until each has been waited for. Each stage
of a plan says what it holds gathered at most in its forward and in its
backward (its recomputation included) under the plan's decisions
(``gathered_forward_bytes``, ``gathered_backward_bytes``), and the plan
holds DeepSpeed's gradient bucket all step (``bucket_bytes``).
DeepSpeed's defaults hold far more: on a model of under 10⁹ parameters it
keeps every parameter gathered from the second step on (a parameter used
again within ``stage3_max_reuse_distance`` parameters is not released),
and its gradient bucket is ``reduce_bucket_size`` = 5·10⁸ elements
whatever the model. The export sets both from the largest layer.

Each case trains a transformers Llama for three steps under DeepSpeed's
own engine (``deepspeed.initialize`` over ``deepspeed.zero.Init``) in a
two-rank gloo group on the CPU, and measures on rank 0, from the second
step on (when DeepSpeed prefetches by the trace it recorded in the first):
the parameters DeepSpeed holds gathered or in flight (each parameter's
``ds_status``), sampled after every fetch of a module and before every
release, at their 16-bit size; the bytes of the buffers holding them
(each available parameter's storage, each all-gather in flight's output)
after each fetch of a module with parameters, the most by block, forward
and backward; and the gradient bucket it allocated. Under the exported
config the buffers are the plan's, block by block, and the bucket is the
plan's; under DeepSpeed's defaults (``{"stage": 3}``) it gathers every
parameter and its bucket passes the plan's.
test_deepspeed_zero3_step measures the whole step.

DeepSpeed's CPU backend compiles a shared-memory all-reduce with ninja when
it starts; the cases run gloo's instead (``build_shm_op`` returns None, as
it does where DeepSpeed finds the op incompatible).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest

from test_engine_configs import run

pytestmark = [pytest.mark.engines,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None and not os.environ.get("CKPTPLAN_ENGINES"),
                                 reason="DeepSpeed is not installed (.ci/run installs it from python/requirements-engines.txt)")]

CONFIG = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=256)
# A Qwen2 with biases on q, k and v and its head tied to its embedding.
QWEN2 = dict(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=200, tie_word_embeddings=True)
SEQ = 16
FLAGS = ["--seq", str(SEQ), "--batch", "1", "--dtype", "bf16", "--dp", "2", "--zero", "3", "--sharding", "deepspeed"]


def deepspeed_llama(rank: int, port: int, zero: dict, checkpointing: bool, zero_init: bool, family: str = "llama"):
    """Joins rank to a two-rank gloo group on the CPU and makes the Llama
    (or with family "qwen2" the Qwen2 of QWEN2; in bf16, under
    ``deepspeed.zero.Init`` when zero_init) and DeepSpeed's engine over it
    with PyTorch's AdamW; returns the model, the engine and a batch of
    input ids."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    import contextlib
    import importlib

    import torch
    import transformers

    import deepspeed
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": zero}
    with deepspeed.zero.Init(config_dict_or_path=config) if zero_init else contextlib.nullcontext():
        torch.manual_seed(0)
        if family == "qwen2":
            model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**QWEN2))
        else:
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    if not zero_init:
        model = model.to(torch.bfloat16)
    if checkpointing:
        model.gradient_checkpointing_enable()
    engine, _, _, _ = deepspeed.initialize(model=model, config=config,
                                           optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randint(0, model.config.vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(1))
    return model, engine, x


def _worker(rank: int, port: int, zero: dict, checkpointing: bool, family: str, out: str) -> None:
    """One rank: three training steps of the Llama under DeepSpeed; rank 0
    writes what it held at most from the second step on: the parameters
    gathered or in flight, and the bytes of the buffers holding them
    while each block's modules run, forward and backward."""
    model, engine, x = deepspeed_llama(rank, port, zero, checkpointing, zero_init=True, family=family)
    from deepspeed.runtime.zero import partitioned_param_coordinator as coordinator
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    params = list(model.parameters())
    names = {m: n for n, m in model.named_modules()}
    peak = [0]
    blocks = {}  # (block, "forward" or "backward") -> the most bytes gathered while one of its modules ran
    coordinators = []
    backward = [False]

    def buffers() -> int:
        """The bytes of the storages DeepSpeed's gathers hold: each
        available parameter's, and each all-gather in flight's output
        (a flat buffer of several parameters' until every one of them has
        been waited for)."""
        held = {}
        for p in params:
            if p.ds_status == ZeroParamStatus.AVAILABLE:
                held[p.data.untyped_storage().data_ptr()] = p.data.untyped_storage().nbytes()
        for c in coordinators:
            registry = getattr(c, "_PartitionedParameterCoordinator__inflight_param_registry")
            for handle in set(registry.values()):
                for h in getattr(handle, "handles", [handle]):
                    for t in [*(getattr(h, "partitions", None) or [])[:1],
                              *([h._AllGatherHandle__param.data] if hasattr(h, "_AllGatherHandle__param") else [])]:
                        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(held.values())

    def sample(module=None) -> None:
        held = sum(p.ds_numel * p.ds_tensor.element_size() for p in params
                   if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)
        peak[0] = max(peak[0], held)
        if module is not None and any(True for _ in module.parameters(recurse=False)):
            key = (block_of(names[module]), "backward" if backward[0] else "forward")
            blocks[key] = max(blocks.get(key, 0), buffers())

    cls = coordinator.PartitionedParameterCoordinator
    fetch, release = cls.fetch_sub_module, cls.release_sub_module

    def fetched(self, module, forward, *args, **kwargs):
        if self not in coordinators:
            coordinators.append(self)
        out = fetch(self, module, forward, *args, **kwargs)
        sample(module)
        return out

    def releasing(self, *args, **kwargs):
        sample()
        return release(self, *args, **kwargs)

    cls.fetch_sub_module, cls.release_sub_module = fetched, releasing
    for step in range(3):
        if step == 1:
            peak[0] = 0  # the first step records the trace; DeepSpeed prefetches by it from the second
            blocks.clear()
        backward[0] = False
        loss = engine(input_ids=x, labels=x).loss
        backward[0] = True  # the backward, recomputations included
        engine.backward(loss)
        engine.step()
    bucket = getattr(engine.optimizer, "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer", None)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"gathered": peak[0],
                       "bucket": 0 if bucket is None else bucket.numel() * bucket.element_size(),
                       "parameters": sum(p.ds_numel for p in params),
                       "blocks": {f"{b} {part}": v for (b, part), v in blocks.items()}}, f)


def block_of(module: str) -> str:
    """The ckptplan block a transformers Llama or Qwen2 module's name is
    in."""
    parts = module.split(".")
    if parts[:2] == ["model", "layers"]:
        return f"layers.{parts[2]}"
    return "embed" if module == "model.embed_tokens" else "head"


def _rank(rank: int, module: str, *args) -> None:
    """Runs module's _worker on rank, then leaves the process group with
    the other ranks: a rank that exits with gloo's threads still running
    may abort at exit ("terminate called without an active exception")."""
    importlib.import_module(module)._worker(rank, *args)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def spawn(tmp_path, module: str, *args, ranks: int = 2) -> dict:
    """Runs module's _worker(rank, port, *args, out) on ranks ranks in
    processes of their own (args made of JSON) and returns what rank 0
    wrote to out."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "measured.json"
    code = ("import sys, json, torch.multiprocessing as mp; sys.path.insert(0, sys.argv[1]); "
            "import test_deepspeed_zero3 as t; "
            "mp.spawn(t._rank, args=(sys.argv[2], int(sys.argv[3]), *json.loads(sys.argv[4]), sys.argv[5]), nprocs=int(sys.argv[6]))")
    p = subprocess.run([sys.executable, "-c", code, os.path.dirname(__file__), module, str(port), json.dumps(args),
                        str(out), str(ranks)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(out.read_text())


def run_deepspeed(tmp_path, zero: dict, checkpointing: bool, family: str = "llama") -> dict:
    """Runs _worker on two ranks and returns rank 0's measurement."""
    return spawn(tmp_path, "test_deepspeed_zero3", zero, checkpointing, family)


@pytest.fixture(scope="module")
def model_config(tmp_path_factory):
    import transformers
    path = tmp_path_factory.mktemp("llama")
    transformers.LlamaConfig(**CONFIG).save_pretrained(path)
    return str(path / "config.json")


@pytest.mark.parametrize("solver", ["none", "every-k"])
def test_deepspeed_gathers_within_the_plan(ckptplan_binary, model_config, tmp_path, solver):
    """Under the exported config (every layer stored, or every layer
    checkpointed, which replays each layer's modules in backward), what
    DeepSpeed gathers is what the plan counts, block by block; under its
    defaults, with the same model and checkpointing, it passes it."""
    static = json.loads(run(ckptplan_binary, "cost", model_config, *FLAGS, "--format", "json"))["static"]
    gathered = static.get("gathered_bytes", 0) + static["layer_gathered_bytes"]
    exported = json.loads(run(ckptplan_binary, "export", model_config, *FLAGS, "--budget", "1GiB", "--solver", solver,
                              "--to", "deepspeed"))
    zero = exported["zero_optimization"]
    checkpointing = solver == "every-k"

    planned = run_deepspeed(tmp_path, zero, checkpointing)
    assert planned["bucket"] == 2 * zero["reduce_bucket_size"] == static["bucket_bytes"], (planned, static)
    assert planned["gathered"] <= gathered, planned
    # DeepSpeed gathered layers' parameters under it: a module's at least.
    assert planned["gathered"] >= 2 * CONFIG["hidden_size"] * CONFIG["intermediate_size"], planned

    # Block by block, DeepSpeed's buffers hold what the plan says they do
    # under its decisions (stored, or every layer recomputed).
    plan = json.loads(run(ckptplan_binary, "plan", model_config, *FLAGS, "--budget", "1GiB", "--solver", solver,
                          "--format", "json"))
    want = {}
    for st in plan["stages"]:
        want[f"{st['name']} forward"] = st["gathered_forward_bytes"]
        want[f"{st['name']} backward"] = st["gathered_backward_bytes"]
    assert planned["blocks"] == want, (planned["blocks"], want)

    defaults = run_deepspeed(tmp_path, {"stage": 3}, checkpointing)
    assert defaults["gathered"] == 2 * defaults["parameters"], defaults  # every parameter, all step long
    assert defaults["gathered"] + defaults["bucket"] > gathered + static["bucket_bytes"], defaults


@pytest.mark.parametrize("solver", ["none", "every-k"])
def test_deepspeed_gathers_a_tied_head_and_biases(ckptplan_binary, tmp_path, solver):
    """A Qwen2 whose head is its embedding (one parameter, gathered for
    two modules) and whose q, k and v have biases (two parameters a
    module): DeepSpeed's buffers hold what the plan counts, block by
    block."""
    import transformers
    transformers.Qwen2Config(**QWEN2).save_pretrained(tmp_path)
    config = str(tmp_path / "config.json")
    flags = [*FLAGS, "--budget", "1GiB", "--solver", solver]
    zero = json.loads(run(ckptplan_binary, "export", config, *flags, "--to", "deepspeed"))["zero_optimization"]
    plan = json.loads(run(ckptplan_binary, "plan", config, *flags, "--format", "json"))
    measured = run_deepspeed(tmp_path, zero, solver == "every-k", "qwen2")
    want = {}
    for st in plan["stages"]:
        want[f"{st['name']} forward"] = st["gathered_forward_bytes"]
        want[f"{st['name']} backward"] = st["gathered_backward_bytes"]
    assert measured["blocks"] == want, (measured["blocks"], want)
