"""The PyTorch peer of ``attnjax bench torch``: a nanoGPT-shaped GPT trained with PyTorch's fused
``scaled_dot_product_attention``, and that attention's forward and backward alone. It imports
nothing from attnjax (nor JAX): it runs in a Python that has torch, as a worker the benchmark
starts (``python torch_gpt.py``), one JSON request per line on stdin, one JSON reply per line
on stdout:

- ``{"train": {...}}``: build the model and optimizer (``d_model``, ``num_layers``,
  ``num_heads``, ``length``, ``batch_size``, ``corpus`` (a file of bytes), ``steps``,
  ``warmup``, ``learning_rate``, ``steps_per_call``), run one call to warm up; reply
  ``{"parameters": n}``;
- ``{"advance": calls}``: train ``calls x steps_per_call`` steps; reply ``{"seconds", "loss"}``;
- ``{"attention": {"batch", "heads", "length", "head_dim", "repeats"}}``: causal attention,
  forward and backward over float32 ``[B, N, T, H]``; reply the median ``{"seconds"}``;
- ``{"versions": null}``: reply torch's version and threads.

The model is attnjax's bench decoder written the usual PyTorch way: token embedding plus a
learned position table, pre-norm blocks (LayerNorm, fused q/k/v projection, SDPA with
``is_causal``, output projection, both without biases; LayerNorm, 4x tanh-GELU MLP with
biases), a final LayerNorm, logits
through the tied embedding; next-byte cross-entropy; AdamW (b2 0.95, weight decay 0.1 on
matrices) after global-norm clipping at 1.0, linear warmup then cosine to 0.1x. Batches are
random windows of the corpus, drawn on the CPU every step.
"""

from __future__ import annotations

import json
import math
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(B, T, d))
        return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, length: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.positions = nn.Parameter(torch.randn(length, d) * 0.02)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)

    def forward(self, tokens):
        x = self.embed(tokens) + self.positions[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.T


class Trainer:
    def __init__(self, d_model, num_layers, num_heads, length, batch_size, corpus, steps,
                 warmup, learning_rate, steps_per_call, seed=0):
        torch.manual_seed(seed)
        self.data = torch.from_numpy(np.fromfile(corpus, np.uint8).astype(np.int64))
        self.length, self.batch, self.per_call = length, batch_size, steps_per_call
        self.model = GPT(256, d_model, num_layers, num_heads, length)
        matrices = [p for p in self.model.parameters() if p.dim() >= 2]
        others = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}],
            lr=learning_rate, betas=(0.9, 0.95))
        self.schedule = lambda step: (step + 1) / max(warmup, 1) if step < warmup else (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup)
                                                           / max(steps - warmup, 1)))))
        self.base_lr, self.step = learning_rate, 0

    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def advance(self, calls: int) -> dict:
        began, loss = time.perf_counter(), None
        for _ in range(calls * self.per_call):
            starts = torch.randint(0, len(self.data) - self.length - 1, (self.batch,))
            window = torch.stack([self.data[s:s + self.length + 1] for s in starts])
            logits = self.model(window[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            for group in self.optimizer.param_groups:
                group["lr"] = self.base_lr * self.schedule(self.step)
            self.optimizer.step()
            self.step += 1
        value = float(loss.detach())
        return {"seconds": time.perf_counter() - began, "loss": value}


def attention_seconds(batch: int, heads: int, length: int, head_dim: int, repeats: int) -> dict:
    """Median seconds of causal SDPA forward and backward over float32 ``[B, N, T, H]``."""
    q, k, v = (torch.randn(batch, heads, length, head_dim, requires_grad=True) for _ in range(3))
    times = []
    for _ in range(repeats + 1):
        began = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.sum().backward()
        times.append(time.perf_counter() - began)
        q.grad = k.grad = v.grad = None
    return {"seconds": float(np.median(times[1:]))}


def serve() -> None:
    trainer = None
    for line in sys.stdin:
        request = json.loads(line)
        if "train" in request:
            trainer = Trainer(**request["train"])
            trainer.advance(1)
            reply = {"parameters": trainer.parameters()}
        elif "advance" in request:
            reply = trainer.advance(int(request["advance"]))
        elif "attention" in request:
            reply = attention_seconds(**request["attention"])
        else:
            reply = {"torch": torch.__version__, "threads": torch.get_num_threads()}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve()
