"""ckptplan's bundled tiny models (models/tiny-llama.yaml, models/tiny-gpt2.yaml)
in plain PyTorch, with the blocks shared/oracle/README.md describes: a Hugging
Face eager Llama (RMSNorm with the fp32 upcast, RoPE from cos/sin buffers,
repeat_kv, fp32 softmax, SwiGLU MLP, untied head) and a GPT-2 (LayerNorm,
fused qkv, causal softmax attention, tanh GELU MLP, tied head). fp32, no
dropout. Each model's transformer layers are model.layers.

build(name, seed) makes a model with weights drawn from seed; batch(model, seed)
makes its token ids and targets; model(ids, targets) returns the loss.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    "tiny-llama": dict(layers=4, hidden=64, heads=4, kv_heads=2, ffn=192, vocab=512,
                       eps=1e-5, rope_theta=10000.0, max_seq=128, batch=2, seq=32),
    "tiny-gpt2": dict(layers=2, hidden=64, heads=4, ffn=256, vocab=512,
                      eps=1e-5, max_seq=128, batch=2, seq=32),
}


def causal_mask(n):
    """Bool buffer, True above the diagonal: the positions masked_fill hides."""
    return torch.ones(n, n, dtype=torch.bool).triu(1)


# Llama -------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, h, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n):
    """(b, kv, s, d) -> (b, kv*n, s, d), as Hugging Face does."""
    b, kv, s, d = x.shape
    if n == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)


class LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.a, self.kv = c["hidden"], c["heads"], c["kv_heads"]
        self.d = self.h // self.a
        self.q_proj = nn.Linear(self.h, self.a * self.d, bias=False)
        self.k_proj = nn.Linear(self.h, self.kv * self.d, bias=False)
        self.v_proj = nn.Linear(self.h, self.kv * self.d, bias=False)
        self.o_proj = nn.Linear(self.a * self.d, self.h, bias=False)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.a, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.a // self.kv), repeat_kv(v, self.a // self.kv)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
        w = w.masked_fill(mask, float("-inf"))
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(b, s, self.h)
        return self.o_proj(o)


class LlamaMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["hidden"], c["ffn"], bias=False)
        self.up_proj = nn.Linear(c["hidden"], c["ffn"], bias=False)
        self.down_proj = nn.Linear(c["ffn"], c["hidden"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    """Called as Hugging Face calls its layers: hidden states, then keyword
    arguments (the mask and the (cos, sin) position embeddings)."""

    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden"], c["eps"])
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden"], c["eps"])
        self.mlp = LlamaMLP(c)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None):
        cos, sin = position_embeddings
        x = hidden_states + self.self_attn(self.input_layernorm(hidden_states), cos, sin,
                                           attention_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyLlama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(LlamaLayer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"], c["eps"])
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)
        d = c["hidden"] // c["heads"]
        inv = 1.0 / c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        f = torch.outer(torch.arange(c["max_seq"], dtype=torch.float32), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", causal_mask(c["max_seq"]))

    def forward(self, ids, targets):
        s = ids.shape[1]
        x = self.embed_tokens(ids)
        pos = (self.cos[:s], self.sin[:s])
        mask = self.mask[:s, :s]
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_embeddings=pos)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


# GPT-2 -------------------------------------------------------------------

class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, self.a = c["hidden"], c["heads"]
        self.ln_1, self.ln_2 = nn.LayerNorm(h, eps=c["eps"]), nn.LayerNorm(h, eps=c["eps"])
        self.qkv, self.out = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, c["ffn"]), nn.Linear(c["ffn"], h)
        self.register_buffer("mask", causal_mask(c["max_seq"]))

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.a
        q, k, v = self.qkv(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.a, d).transpose(1, 2) for t in (q, k, v))
        w = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        w = w.masked_fill(self.mask[:s, :s], float("-inf"))
        o = (w.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.out(o)
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


class TinyGPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte, self.wpe = nn.Embedding(c["vocab"], c["hidden"]), nn.Embedding(c["max_seq"], c["hidden"])
        self.layers = nn.ModuleList(GPT2Block(c) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["hidden"], eps=c["eps"])

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for layer in self.layers:
            x = layer(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def build(name, seed=0):
    """The model called name, its weights drawn from seed."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(CONFIGS)})")
    torch.manual_seed(seed)
    return (TinyLlama if name == "tiny-llama" else TinyGPT2)(CONFIGS[name])


def batch(model, seed=0):
    """Token ids and targets, (batch, seq) each, drawn from seed."""
    c, g = model.c, torch.Generator().manual_seed(seed)
    ids = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), generator=g)
    targets = torch.randint(0, c["vocab"], (c["batch"], c["seq"]), generator=g)
    return ids, targets
