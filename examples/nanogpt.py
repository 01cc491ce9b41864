"""Pretrained GPT-2 weights in a nanoGPT-style module of your own, through a key table you write.

Your module names its tensors as it likes (here nanoGPT's: ``transformer.h.0.attn.c_attn.weight`` …, its
linear layers ``nn.Linear``, not HF's transposed Conv1D). A table maps each of your names onto gptconv's
(``Map(yours, ours, transform)``); ``gptconv.state_dict(source, layout=table)`` reads any checkpoint gptconv
reads (HF folder, GGUF, Hub name) through it. A row missing is an error naming the tensors it leaves out.

    python examples/nanogpt.py gpt2 "The capital of France is"
"""

from __future__ import annotations

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import gptconv
from gptconv.convert.keymap import KeyMap, Map, Tied

NANOGPT = KeyMap("nanoGPT", [
    Map("transformer.wte.weight", "tok_emb.weight"),
    Map("transformer.wpe.weight", "pos_emb.weight"),
    Map("transformer.h.{i}.ln_1.weight", "blocks.{i}.norm1.weight"),
    Map("transformer.h.{i}.ln_1.bias", "blocks.{i}.norm1.bias"),
    Map("transformer.h.{i}.attn.c_attn.weight", "blocks.{i}.attn.qkv.weight"),
    Map("transformer.h.{i}.attn.c_attn.bias", "blocks.{i}.attn.qkv.bias"),
    Map("transformer.h.{i}.attn.c_proj.weight", "blocks.{i}.attn.proj.weight"),
    Map("transformer.h.{i}.attn.c_proj.bias", "blocks.{i}.attn.proj.bias"),
    Map("transformer.h.{i}.ln_2.weight", "blocks.{i}.norm2.weight"),
    Map("transformer.h.{i}.ln_2.bias", "blocks.{i}.norm2.bias"),
    Map("transformer.h.{i}.mlp.c_fc.weight", "blocks.{i}.mlp.fc.weight"),
    Map("transformer.h.{i}.mlp.c_fc.bias", "blocks.{i}.mlp.fc.bias"),
    Map("transformer.h.{i}.mlp.c_proj.weight", "blocks.{i}.mlp.proj.weight"),
    Map("transformer.h.{i}.mlp.c_proj.bias", "blocks.{i}.mlp.proj.bias"),
    Map("transformer.ln_f.weight", "norm_f.weight"),
    Map("transformer.ln_f.bias", "norm_f.bias"),
    Tied("lm_head.weight", "tok_emb.weight"),  # nanoGPT ties its head to wte: both names in its state dict
])


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.Module()
        self.attn.c_attn, self.attn.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Module()
        self.mlp.c_fc, self.mlp.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        x = x + self.attn.c_proj(y)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, n_layers: int, n_heads: int) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(context, d),
            h=nn.ModuleList(Block(d, n_heads) for _ in range(n_layers)), ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = self.transformer
        x = t.wte(ids) + t.wpe(torch.arange(ids.size(1), device=ids.device))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


def load(source: str) -> GPT:
    c = gptconv.open_source(source).config  # sizes from the checkpoint
    model = GPT(c.vocab_size, c.context_length, c.d_model, c.n_layers, c.n_heads)
    model.load_state_dict(gptconv.state_dict(source, layout=NANOGPT))  # strict: every tensor, once
    return model.eval()


if __name__ == "__main__":
    source, text = sys.argv[1], sys.argv[2]
    tok = gptconv.load_tokenizer(source)
    with torch.no_grad():
        logits = load(source)(torch.tensor([tok.encode(text)]))
    print(repr(tok.decode([int(logits[0, -1].argmax())])))
