from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch


def hf_model(folder: Path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptconv", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def random_ids(vocab: int, length: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
