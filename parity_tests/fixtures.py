"""Checkpoints made in the test session with transformers (random init, no downloads).

``initializer_range`` is raised to 0.2 so that a wrong transpose or a swapped tensor moves the
logits by far more than any tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import ByteLevelBPETokenizer

TOKENIZER_TEXT = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Ünïcödé, accents: café, naïve, Ærø; emoji 🙂🚀; digits 1234567890; CJK 你好世界",
    "hello   world\t\ttabs\n\nnewlines    and runs of     spaces",
]

GPT2_SHAPES = {
    # name: (config overrides, description)
    "tiny": dict(vocab_size=512, n_positions=128, n_embd=64, n_layer=2, n_head=4),
    "odd": dict(vocab_size=403, n_positions=37, n_embd=60, n_layer=3, n_head=5, n_inner=100),
    "gpt2-124m": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
}


def write_bpe_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE (GPT-2's kind) trained on a few lines: vocab.json, merges.txt, tokenizer.json."""
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(TOKENIZER_TEXT * 20, vocab_size=min(vocab_size, 400), min_frequency=1,
                            special_tokens=["<|endoftext|>"])
    tok.save_model(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "add_prefix_space": False, "model_max_length": 1024}))


def make_gpt2(folder: Path, shape: str, seed: int = 0, init: float = 0.2) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(**GPT2_SHAPES[shape], initializer_range=init, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    _scramble_norms(model)
    model.save_pretrained(folder)
    write_bpe_tokenizer(folder, cfg.vocab_size)
    return folder


def _scramble_norms(model: torch.nn.Module) -> None:
    """Random-init norms are all ones and biases zeros: make them random too, so mixing them up shows."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if name.endswith("weight") and "ln" in name else 0.0))


def resave_as_bin(src: Path, dst: Path, legacy: bool = False) -> Path:
    """The same weights as ``pytorch_model.bin``; ``legacy``: GPT-2's original file layout, without
    the ``transformer.`` prefix and with the ``attn.bias`` / ``attn.masked_bias`` buffers."""
    from safetensors.torch import load_file
    dst.mkdir(parents=True, exist_ok=True)
    state = load_file(src / "model.safetensors")
    if legacy:
        state = {k.removeprefix("transformer."): v for k, v in state.items()}
        n_pos = json.loads((src / "config.json").read_text())["n_positions"]
        for i in range(json.loads((src / "config.json").read_text())["n_layer"]):
            state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))[None, None]
            state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, dst / "pytorch_model.bin")
    copy_side_files(src, dst)
    return dst


def resave_sharded(src: Path, dst: Path, n_shards: int = 3) -> Path:
    from safetensors.torch import load_file
    dst.mkdir(parents=True, exist_ok=True)
    state = load_file(src / "model.safetensors")
    names = sorted(state)
    weight_map = {}
    for s in range(n_shards):
        shard = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: state[n] for n in names[s::n_shards]}
        save_file(part, str(dst / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    copy_side_files(src, dst)
    return dst


def copy_side_files(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.suffix in (".json", ".txt") and not f.name.endswith("index.json"):
            (dst / f.name).write_bytes(f.read_bytes())
