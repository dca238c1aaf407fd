"""The GPU PyTorch runs on, as ckptplan's ``--device`` names it.

A GPU ckptplan knows by name carries its compute figures (product
throughput, memory bandwidth, links), on which plans are priced in time;
one known by its memory alone is planned in FLOPs. ``cuda_device`` reads
the name CUDA (or ROCm) reports — "NVIDIA H100 80GB HBM3", "NVIDIA
A100-SXM4-40GB", "NVIDIA GeForce RTX 4090", "AMD Instinct MI300X" — and
names the GPU where its words say which one it is; a variant ckptplan has
no figures for (a PCIe A100, an A10G, an H200 NVL) or a MIG slice, which
has a share of the GPU's compute, is known by its memory. The budget is
always the memory the GPU reports.
"""
from __future__ import annotations

import re
from typing import Any, Optional

# (the words the name holds, ckptplan's device), the more specific first;
# a name with a word of _VARIANTS matches only a row that names it.
_KNOWN: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h100", "pcie"), "h100-pcie"),
    (("h100", "nvl"), "h100-nvl"),
    (("h100",), "h100-80gb"),
    (("h200",), "h200"),
    (("b200",), "b200"),
    (("a100", "40gb"), "a100-40gb"),
    (("a100", "80gb"), "a100-80gb"),
    (("l40s",), "l40s"),
    (("l4",), "l4"),
    (("a40",), "a40"),
    (("a10",), "a10"),
    (("t4",), "t4"),
    (("rtx", "a6000"), "rtx-a6000"),
    (("rtx", "6000", "ada"), "rtx-6000-ada"),
    (("rtx", "5090"), "rtx-5090"),
    (("rtx", "4090"), "rtx-4090"),
    (("rtx", "4080"), "rtx-4080"),
    (("rtx", "3090"), "rtx-3090"),
    (("mi300x",), "mi300x"),
)
_VARIANTS = ("pcie", "nvl")


def known_device(name: str) -> Optional[str]:
    """ckptplan's name for a GPU as torch.cuda names it, or None.

    >>> known_device("NVIDIA H100 80GB HBM3")
    'h100-80gb'
    >>> known_device("NVIDIA A100-SXM4-40GB")
    'a100-40gb'
    >>> known_device("NVIDIA A100 80GB PCIe") is None  # no figures for the PCIe card
    True
    >>> known_device("NVIDIA H100 80GB HBM3 MIG 3g.40gb") is None
    True
    """
    words = set(re.findall(r"[a-z0-9]+", name.lower()))
    if "mig" in words:
        return None
    for need, device in _KNOWN:
        if words.issuperset(need) and not any(v in words and v not in need for v in _VARIANTS):
            return device
    return None


def cuda_device(props: Any) -> tuple[str, int]:
    """The ``--device`` for a GPU torch.cuda describes (its
    ``get_device_properties``), and the memory it reports, in bytes: the
    budget. The device is ckptplan's name for the GPU where it knows it,
    else its memory.

    >>> import types
    >>> cuda_device(types.SimpleNamespace(name="NVIDIA GeForce RTX 4090", total_memory=25386352640))
    ('rtx-4090', 25386352640)
    >>> cuda_device(types.SimpleNamespace(name="NVIDIA A10G", total_memory=23836229632))
    ('23836229632B', 23836229632)
    """
    total = int(props.total_memory)
    return known_device(str(props.name)) or f"{total}B", total
