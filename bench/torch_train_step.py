#!/usr/bin/python3
"""The PyTorch peer of train_step_bench: the same GPT training step (forward, backward,
clipping, AdamW) with PyTorch on the CPU, same shapes, same thread count. Attention is the
explicit softmax of q k^T, or with --sdpa F.scaled_dot_product_attention (PyTorch's fused CPU
attention, causal; torch >= 2.0: /opt/tessera/tools-venv/bin/python).
usage: python3 bench/torch_train_step.py [gpt2-124m|gpt2-124m-t1024|small] [steps] [--sdpa]"""
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {
    # layers, hidden, heads, seq, padded vocab, micro-batch
    "gpt2-124m": (12, 768, 12, 64, 50304, 4, 1024),
    "gpt2-124m-t1024": (12, 768, 12, 1024, 50304, 1, 1024),
    "small": (6, 384, 6, 256, 8192, 4, 256),
}


class Block(nn.Module):
    def __init__(self, h, heads, sdpa):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x, mask):
        b, t, h = x.shape
        hd = h // self.heads
        qkv = self.qkv(self.ln1(x)).view(b, t, self.heads, 3, hd)
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
        if self.sdpa:
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            ctx = att.masked_fill(mask, -10000.0).softmax(-1) @ v
        ctx = ctx.transpose(1, 2).reshape(b, t, h)
        x = x + self.proj(ctx)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, h, heads, vocab, positions, sdpa):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(positions, h)
        self.blocks = nn.ModuleList(Block(h, heads, sdpa) for _ in range(layers))
        self.lnf = nn.LayerNorm(h)

    def forward(self, tokens, labels):
        t = tokens.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1))


def main():
    args = [a for a in sys.argv[1:] if a != "--sdpa"]
    sdpa = "--sdpa" in sys.argv
    shape = args[0] if args else "gpt2-124m"
    steps = int(args[1]) if len(args) > 1 else 5
    layers, h, heads, seq, vocab, mbs, positions = SHAPES[shape]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    torch.manual_seed(0)
    model = GPT(layers, h, heads, vocab, positions, sdpa)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    tokens = torch.randint(0, vocab - 100, (mbs, seq + 1))

    def step():
        opt.zero_grad(set_to_none=False)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()  # warm-up
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    seconds = time.perf_counter() - start
    cpu_ms = (time.process_time() - cpu_start) * 1000 / steps  # all threads: on a shared machine steadier than wall
    params = sum(p.numel() for p in model.parameters())
    n_tokens = steps * mbs * seq
    flops = 6.0 * params * n_tokens + 6.0 * layers * h * seq * n_tokens
    attention = "sdpa" if sdpa else "explicit"
    print(f"pytorch {torch.__version__} {attention} {shape:<10} params {params / 1e6:.1f}M threads {torch.get_num_threads()}: "
          f"{seconds * 1000 / steps:.1f} ms/step, {n_tokens / seconds:.0f} tokens/s, "
          f"{flops / seconds / 1e9:.1f} GFLOP/s (model), process CPU {cpu_ms:.1f} ms/step")


if __name__ == "__main__":
    main()
