"""Pretrained Llama weights in a module written the way Meta's reference code is, through a key table.

Meta's layout names (``layers.0.attention.wq.weight``, ``feed_forward.w1`` …) and its RoPE, which rotates
interleaved pairs of a head (complex numbers) where HF rotates halves: its wq and wk rows are permuted
relative to HF's. The table says so with gptconv's own transforms (``PERMUTE_Q``/``PERMUTE_K``, the ones
llama.cpp's layout needs too), so a Hub checkpoint, an HF folder or a GGUF loads into it alike.

    python examples/meta_llama.py smollm2-135m "The capital of France is"
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import gptconv
from gptconv.convert.keymap import KeyMap, Map, Tied
from gptconv.convert.gguf_decoder import PERMUTE_K, PERMUTE_Q

META = KeyMap("Meta Llama", [
    Map("tok_embeddings.weight", "tok_emb.weight"),
    Map("layers.{i}.attention_norm.weight", "blocks.{i}.norm1.weight"),
    Map("layers.{i}.attention.wq.weight", "blocks.{i}.attn.q.weight", PERMUTE_Q),
    Map("layers.{i}.attention.wk.weight", "blocks.{i}.attn.k.weight", PERMUTE_K),
    Map("layers.{i}.attention.wv.weight", "blocks.{i}.attn.v.weight"),
    Map("layers.{i}.attention.wo.weight", "blocks.{i}.attn.o.weight"),
    Map("layers.{i}.ffn_norm.weight", "blocks.{i}.norm2.weight"),
    Map("layers.{i}.feed_forward.w1.weight", "blocks.{i}.mlp.gate.weight"),
    Map("layers.{i}.feed_forward.w3.weight", "blocks.{i}.mlp.up.weight"),
    Map("layers.{i}.feed_forward.w2.weight", "blocks.{i}.mlp.down.weight"),
    Map("norm.weight", "norm_f.weight"),
    Map("output.weight", "lm_head.weight"),
    Tied("output.weight", "tok_emb.weight"),  # a tied checkpoint: the head is the embedding
])


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


def rotate(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Meta's RoPE: consecutive pairs of a head as complex numbers, times e^{i·p·θ}."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))   # (B, T, h, hd/2)
    return torch.view_as_real(pairs * freqs[:, None]).flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        self.c = c
        hd = c.head_dim
        self.attention_norm, self.ffn_norm = RMSNorm(c.d_model, c.norms.eps), RMSNorm(c.d_model, c.norms.eps)
        self.attention = nn.Module()
        a = self.attention
        a.wq, a.wk = nn.Linear(c.d_model, c.n_heads * hd, bias=False), nn.Linear(c.d_model, c.n_kv_heads * hd, bias=False)
        a.wv, a.wo = nn.Linear(c.d_model, c.n_kv_heads * hd, bias=False), nn.Linear(c.n_heads * hd, c.d_model, bias=False)
        self.feed_forward = nn.Module()
        f = self.feed_forward
        f.w1, f.w3 = nn.Linear(c.d_model, c.d_ff, bias=False), nn.Linear(c.d_model, c.d_ff, bias=False)
        f.w2 = nn.Linear(c.d_ff, c.d_model, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        c, a, f = self.c, self.attention, self.feed_forward
        h = self.attention_norm(x)
        q = rotate(a.wq(h).view(B, T, c.n_heads, c.head_dim), freqs).transpose(1, 2)
        k = rotate(a.wk(h).view(B, T, c.n_kv_heads, c.head_dim), freqs).transpose(1, 2)
        v = a.wv(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        k, v = (t.repeat_interleave(c.n_heads // c.n_kv_heads, dim=1) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        x = x + a.wo(y)
        h = self.ffn_norm(x)
        return x + f.w2(F.silu(f.w1(h)) * f.w3(h))


class Transformer(nn.Module):
    def __init__(self, c) -> None:
        super().__init__()
        self.c = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norms.eps)
        self.output = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        c = self.c
        theta = c.rope.theta ** -(torch.arange(0, c.head_dim, 2).float() / c.head_dim)  # no RoPE scaling here
        freqs = torch.polar(torch.ones(ids.size(1), c.head_dim // 2), torch.outer(torch.arange(ids.size(1)).float(), theta))
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x, freqs)
        return self.output(self.norm(x))


def load(source: str) -> Transformer:
    c = gptconv.open_source(source).config
    if c.rope.scaling is not None:
        raise SystemExit("this example computes RoPE without scaling")
    model = Transformer(c)
    model.load_state_dict(gptconv.state_dict(source, layout=META))
    return model.eval()


if __name__ == "__main__":
    source, text = sys.argv[1], sys.argv[2]
    tok = gptconv.load_tokenizer(source)
    with torch.no_grad():
        logits = load(source)(torch.tensor([tok.encode(text)]))
    print(repr(tok.decode([int(logits[0, -1].argmax())])))
