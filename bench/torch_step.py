"""One training step of tiny-gpt2 in plain PyTorch, one thread, for comparison
with ckptplan's executor (exec BenchmarkStepTinyGPT2): the same blocks as
shared/oracle describes (LayerNorm, fused qkv, causal softmax attention,
tanh GELU MLP, tied LM head), hidden 64, 4 heads, 2 layers, ffn 256,
vocab 512, batch 2, sequence 32, fp32, no dropout, storing everything."""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(1)
H, A, L, FF, V, B, S = 64, 4, 2, 256, 512, 2, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.out = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc1, self.fc2 = nn.Linear(H, FF), nn.Linear(FF, H)
        self.register_buffer("mask", torch.tril(torch.ones(S, S, dtype=torch.bool)))

    def forward(self, x):
        h = self.ln_1(x)
        q, k, v = self.qkv(h).split(H, dim=2)
        q, k, v = (t.view(B, S, A, H // A).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(H // A)
        s = s.masked_fill(~self.mask, float("-inf"))
        o = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, S, H)
        x = x + self.out(o)
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x)), approximate="tanh"))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, H), nn.Embedding(128, H)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(H)

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(S))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V), targets.view(-1))


def main():
    m = Model()
    ids, targets = torch.randint(0, V, (B, S)), torch.randint(0, V, (B, S))
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    for _ in range(20):
        m(ids, targets).backward()
    t = time.perf_counter()
    for _ in range(steps):
        m(ids, targets).backward()
    dt = (time.perf_counter() - t) / steps
    print(f"pytorch {torch.__version__} tiny-gpt2 step: {dt * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
