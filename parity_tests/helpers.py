from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch


def hf_model(folder: Path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptconv", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def assert_fp32_parity(ours: torch.Tensor, reference: torch.Tensor, label: str) -> None:
    """Our float32 logits against a reference's: within parity.FP32, the same argmax everywhere."""
    from gptconv.parity import FP32
    diff = (ours - reference).abs().max().item()
    print(f"\n{label}: fp32 max|Δ| = {diff:.3e}")
    assert diff <= FP32.atol
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def random_ids(vocab: int, length: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def edited_copy(src: Path, dst: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of a single-file safetensors checkpoint folder whose tensors ``edit`` changed in place."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    edit(state)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def swap(a: str, b: str) -> Callable[[dict], None]:
    def edit(state: dict) -> None:
        state[a], state[b] = state[b], state[a]
    return edit


# Text that tokenizers get wrong first: whitespace runs and a leading space, accents and a word in
# combining-heavy Vietnamese, CJK, emoji with joiners, digits, byte fallback (a character outside the
# vocabulary, a NUL), newlines, and special tokens of several families written in the text.
TORTURE = ["Hello world", " Hello", "  two  spaces  ", "\tTab\t\t", "café naïve Ærø", "Cửa Việt",
           "你好世界, こんにちは", "🙂🚀👩‍👩‍👧", "digits 1234567890 3.14", "𝔘nicode \u0000 nul", "\n\nnewlines\n",
           "<s>Hello</s> world", "Hello <s> world", "<|endoftext|>a", "<|im_start|>user\nhi<|im_end|>",
           "<|user|>\nhi<|end|>\n<|assistant|>", "   ", "", "a"]
