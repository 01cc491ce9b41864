"""The reference side of parity: transformers' outputs on fixed inputs, live or recorded to a file.

Step names are ours (see the model's taps); ``REFERENCE_TAPS`` says which transformers module
computes the same step, so the two can be compared step by step, not only at the logits.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .errors import GptconvError, where
from .streaming import stream_blocks

# our step name → transformers module whose output is that step ({i}: the layer)
REFERENCE_TAPS: dict[str, dict[str, str]] = {
    "gpt2": {"embedding_dropout": "transformer.drop", "block.{i}": "transformer.h.{i}",
             "final_norm": "transformer.ln_f"},
    "llama": {"token_embedding": "model.embed_tokens", "block.{i}": "model.layers.{i}", "final_norm": "model.norm"},
}

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Ünïcödé, emoji 🙂 and digits 1234567890 — all in one line.",
)


def parity_inputs(tokenizer: object | None, vocab_size: int, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The fixed inputs: each prompt tokenized (when there is a tokenizer) and seeded random ids (1, length)."""
    inputs = {}
    if tokenizer is not None:
        for n, text in enumerate(PROMPTS):
            ids = [i for i in tokenizer.encode(text) if i < vocab_size][:length]
            if ids:
                inputs[f"prompt{n}"] = torch.tensor([ids])
    g = torch.Generator().manual_seed(seed)
    inputs["random"] = torch.randint(0, vocab_size, (1, length), generator=g)
    return inputs


def load_transformers_model(path: Path) -> nn.Module:
    """transformers' own model for the checkpoint, fp32 and eager attention: the reference."""
    try:
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise GptconvError("verify needs transformers for the reference (pip install 'gptconv[reference]'), "
                           "or a recorded file: --reference ref.safetensors") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    where_from = {"gguf_file": path.name} if path.suffix == ".gguf" else {}  # transformers dequantizes GGUF itself
    folder = path.parent if where_from else path
    with contextlib.redirect_stderr(io.StringIO()):  # its GGUF dequantizer draws a progress bar of its own
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                     **where_from)
    return model.eval()


def shared_transformers_model(src) -> nn.Module:
    """transformers' model, fp32 and eager, whole, its weights read by transformers' own parameter
    names straight from the checkpoint (never through our key map) and shape-checked. From an fp32
    HF folder these are the very memory-mapped tensors our model holds, so the weights are in
    memory once for the two models, not twice. A GGUF file, or an HF folder under other names than
    transformers' (GPT-2's original keys), goes through ``from_pretrained``."""
    if src.format == "hf":
        hf = _empty_transformers_model(src)
        stored = _stored_names(src, hf)
        if stored is not None:
            return _fill(src, hf, stored, streamed=False)
    return load_transformers_model(src.path)


def streamed_transformers_model(src) -> nn.Module:
    """transformers' model for an HF folder, fp32 and eager, with one block's weights in memory at a
    time (``gptconv.streaming``), read as in :func:`shared_transformers_model`."""
    if src.format != "hf":
        raise where(src.path, "the reference streams only HF folders; transformers reads a GGUF file whole")
    hf = _empty_transformers_model(src)
    stored = _stored_names(src, hf)
    if stored is None:
        raise where(src.path, "has tensors that are not under transformers' own names, so the reference cannot "
                              "stream it; verify with --no-stream")
    return _fill(src, hf, stored, streamed=True)


def _fill(src, hf: nn.Module, stored: dict[str, str], streamed: bool) -> nn.Module:
    shapes = {name: tuple(p.shape) for name, p in hf.named_parameters(remove_duplicate=False)}

    def weight(name: str) -> torch.Tensor:
        tensor = src.tensors[stored[name]].load().float()  # no copy when the file holds float32
        if tuple(tensor.shape) != shapes[name]:
            raise where(src.path, f"tensor '{stored[name]}' has shape {tuple(tensor.shape)}; transformers' "
                                  f"'{name}' is {shapes[name]}")
        return tensor
    blocks = REFERENCE_TAPS[src.arch]["block.{i}"]
    streamed_blocks = [blocks.format(i=i) for i in range(src.config.n_layers)] if streamed else []
    return stream_blocks(hf, streamed_blocks, weight).eval()  # with no blocks named, every weight is read now


def _empty_transformers_model(src) -> nn.Module:
    try:
        import transformers
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise GptconvError("verify needs transformers and accelerate for the reference "
                           "(pip install 'gptconv[reference]'), or a recorded file: --reference ref.safetensors") from None
    transformers.logging.set_verbosity_error()
    with init_empty_weights():  # parameters on meta; buffers (RoPE frequencies, masks) computed for real
        hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src.path), dtype=torch.float32,
                                              attn_implementation="eager")
    hf.tie_weights()  # a tied head shares the embedding's parameter (transformers ties at load time)
    return hf


def _stored_names(src, hf: nn.Module) -> dict[str, str] | None:
    """transformers' parameter name → the name the file stores it under (a tied head: the
    embedding's), or None when some parameter is under no name transformers uses."""
    stored: dict[str, str] = {}
    groups: dict[int, list[str]] = {}
    for name, p in hf.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    for group in groups.values():
        present = [n for n in group if n in src.tensors]
        if not present:
            return None
        stored.update({n: present[0] for n in group})
    return stored


@torch.no_grad()
def reference_steps(hf_model: nn.Module, arch: str, n_layers: int, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run transformers on ids (B, T) and catch each mapped step's output, plus the logits."""
    modules = dict(hf_model.named_modules())
    steps: dict[str, torch.Tensor] = {}
    hooks = []
    for step, module in REFERENCE_TAPS[arch].items():
        for i in range(n_layers) if "{i}" in step else [None]:
            name = step.format(i=i)

            def hook(_m, _inp, out, name=name):
                steps[name] = (out[0] if isinstance(out, tuple) else out).detach().float()
            hooks.append(modules[module.format(i=i)].register_forward_hook(hook))
    try:
        steps["logits"] = hf_model(ids, use_cache=False).logits.float()
    finally:
        for h in hooks:
            h.remove()
    return steps


def save_reference(path: Path, records: dict[str, dict[str, torch.Tensor]], inputs: dict[str, torch.Tensor],
                   meta: dict[str, str]) -> None:
    tensors = {f"{name}/ids": ids.contiguous() for name, ids in inputs.items()}
    for name, steps in records.items():
        tensors.update({f"{name}/{step}": t.contiguous() for step, t in steps.items()})
    meta = {**meta, "gptconv_reference": "1", "inputs": json.dumps(list(inputs))}
    tmp = path.with_name(path.name + ".partial")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)


def read_reference(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], dict[str, str]]:
    """(inputs, steps per input, metadata) from a file ``save_reference`` wrote."""
    try:
        f = safe_open(str(path), framework="pt")
        meta = f.metadata() or {}
        if meta.get("gptconv_reference") != "1":
            raise where(path, "not a gptconv reference file (write one with `gptconv reference`)")
        names = json.loads(meta["inputs"])
        inputs, records = {}, {}
        for key in f.keys():
            name, _, step = key.partition("/")
            if name not in names:
                raise where(path, f"tensor '{key}' belongs to no listed input")
            if step == "ids":
                inputs[name] = f.get_tensor(key)
            else:
                records.setdefault(name, {})[step] = f.get_tensor(key)
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as e:
        raise where(path, f"not a readable reference file ({e})") from None
    missing = [n for n in names if n not in inputs or "logits" not in records.get(n, {})]
    if missing:
        raise where(path, f"input '{missing[0]}' has no ids or no logits")
    return inputs, records, meta
