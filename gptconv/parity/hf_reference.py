"""The reference side of parity: transformers' model built for a source, and its step outputs.

Three ways to build it, from the cheapest in memory: given the checkpoint's own tensors by
transformers' names (an HF folder), from its GGUF loader with our parsed config (a GGUF file), or
from_pretrained (anything else); ``recorded.py`` records its outputs for a later verify.

Step names are ours (see the model's taps); each family's ``hf_steps`` says which transformers module
computes the same step, so the two can be compared step by step, not only at the logits.
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import GptconvError, where
from ..families import BY_WRAPPER, family_of
from .streaming import fill_blockwise

# transformers' plain PyTorch code, in every dtype: eager attention, and experts run one by one (its
# default grouped_mm has no float64 kernel, and the truth must run the same algorithm as the reference)
EAGER = {"attn_implementation": "eager", "experts_implementation": "eager"}


def _transformers():
    try:
        import transformers
        from accelerate import init_empty_weights  # noqa: F401  (used by _empty_transformers_model)
    except ImportError:
        raise GptconvError("verify needs transformers and accelerate for the reference "
                           "(pip install 'gptconv[reference]'), or a recorded file: --reference ref.safetensors") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


def load_transformers_model(path: Path, dtype: torch.dtype = torch.float32, config: object = None,
                            multimodal: bool = False) -> nn.Module:
    """``from_pretrained`` of an HF folder or a GGUF file, eager attention, in ``dtype``; ``config``
    (a transformers config) replaces the one transformers would read from the checkpoint; ``multimodal``:
    the folder holds an image-text model."""
    transformers = _transformers()
    where_from = {"gguf_file": path.name} if path.suffix == ".gguf" else {}  # transformers dequantizes GGUF itself
    folder = path.parent if where_from else path
    with contextlib.redirect_stderr(io.StringIO()):  # its GGUF dequantizer draws a progress bar of its own
        auto = transformers.AutoModelForImageTextToText if multimodal else transformers.AutoModelForCausalLM
        model, info = auto.from_pretrained(
            folder, dtype=dtype, **EAGER, **where_from, **({"config": config} if config else {}),
            output_loading_info=True)
    if where_from and info.get("missing_keys"):  # its GGUF reader left weights at their random init
        missing = sorted(info["missing_keys"])
        raise ValueError(f"its GGUF reader leaves {len(missing)} weights unread, such as {missing[0]}")
    return model.eval()


def transformers_model(src, dtype: torch.dtype = torch.float32, blockwise: bool = False) -> nn.Module:
    """transformers' own model for an opened source, eager attention, in ``dtype``: the reference.

    From an HF folder its weights are read by transformers' own parameter names straight from the
    checkpoint (never through our key map) and shape-checked; in fp32 from an fp32 folder these
    are the very memory-mapped tensors our model holds, so the weights are in memory once for the
    two models. ``blockwise``: one block's weights in memory at a time (``gptconv.parity.streaming``).
    A folder under other names than transformers' (GPT-2's original keys) goes through
    ``from_pretrained``. A GGUF file: see :func:`gguf_transformers_model`.
    """
    if src.wrapper is not None:  # transformers' whole multimodal model, read by its own code, run on text
        if blockwise:
            raise where(src.path, f"the reference streams only text models; a '{src.wrapper}' checkpoint is read "
                                  "whole by transformers (verify with --no-stream)")
        return load_transformers_model(src.path, dtype, multimodal=True)
    if src.format == "gguf":
        if blockwise:
            raise where(src.path, "the reference streams only HF folders; transformers reads a GGUF file whole")
        return gguf_transformers_model(src, dtype)
    _transformers()
    hf = _empty_transformers_model(src, dtype)
    stored = _stored_names(src, hf)
    if stored is not None:
        return _fill(src, hf, stored, blockwise, dtype)
    if blockwise:
        raise where(src.path, "has tensors that are not under transformers' own names, so the reference cannot "
                              "stream it; verify with --no-stream")
    return load_transformers_model(src.path, dtype)


def gguf_transformers_model(src, dtype: torch.dtype = torch.float32) -> nn.Module:
    """transformers' model for a GGUF file: its weights read and dequantized by transformers' own GGUF
    loader, its configuration the one the file encodes as we parsed it. transformers' GGUF loader
    builds its config from a few metadata keys and ignores the rest (a ``rope_freqs`` tensor gives
    ``rope_type: default``), so a correct Llama 3.1 file would fail against it."""
    transformers = _transformers()
    family = family_of(src.config)
    try:
        data = family.config_to_hf(src.config)
    except ValueError as e:
        raise where(src.path, f"transformers cannot represent this model ({e}); "
                              "verify it with --against llama.cpp") from None
    config = transformers.AutoConfig.for_model(**data)
    try:
        if family.transformers_reads_gguf_as is not None:  # as another model_type, whose names are the family's
            model_type, hf_class = family.transformers_reads_gguf_as
            llama = load_transformers_model(src.path, dtype, transformers.AutoConfig.for_model(
                **{**data, "model_type": model_type, "architectures": [hf_class]}))
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, **EAGER)
            model.load_state_dict(llama.state_dict(), strict=True)
            return model.eval()
        return load_transformers_model(src.path, dtype, config)
    except (ValueError, KeyError, NotImplementedError, TypeError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise where(src.path, f"transformers cannot read this GGUF file ({first}); "
                              "verify it with --against llama.cpp") from None


def gguf_config_disagreements(src) -> tuple[list[str], list[str]]:
    """The fields where transformers' own reading of a GGUF file's metadata differs from ours. The
    reference runs on our reading (see :func:`gguf_transformers_model`), so a field we misread would
    go unseen; transformers reads some of them independently (its GGUF_CONFIG_MAPPING: sizes, eps,
    RoPE theta; not RoPE scaling, not GPT-2's context), and those must agree. Returns (those disagreements,
    notes on what could not be cross-checked)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    transformers = _transformers()
    ours = family_of(src.config).config_to_hf(src.config)
    ours["rope_theta"] = ours.pop("rope_parameters", {}).get("rope_theta")
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            theirs = transformers.AutoConfig.from_pretrained(src.path.parent, gguf_file=src.path.name).to_dict()
    except Exception as e:  # noqa: BLE001 - its config classes refuse what its GGUF mapping makes (Gemma 4's lists)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return [], [f"not cross-checked: transformers cannot read this file's metadata itself ({type(e).__name__}: "
                    f"{first[:120]}); its reference ran on our reading of it"]
    theirs["rope_theta"] = (theirs.get("rope_parameters") or {}).get("rope_theta", theirs.get("rope_theta"))
    read = set(GGUF_CONFIG_MAPPING.get(ours["model_type"], {}).values())
    out = []
    for key in sorted(read & set(ours) & set(theirs)):
        value, other = ours[key], theirs[key]
        same = math.isclose(value, other, rel_tol=1e-6) if isinstance(value, float) else value == other
        if value is not None and other is not None and not same:
            out.append(f"transformers reads {key} = {other!r} from the file, we read {value!r}")
    return out, []


def _fill(src, hf: nn.Module, stored: dict[str, str], blockwise: bool, dtype: torch.dtype) -> nn.Module:
    shapes = {name: tuple(p.shape) for name, p in hf.named_parameters(remove_duplicate=False)}

    def weight(name: str) -> torch.Tensor:
        tensor = src.tensors[stored[name]].load().to(dtype)  # no copy when the file holds this dtype
        if tuple(tensor.shape) != shapes[name]:
            raise where(src.path, f"tensor '{stored[name]}' has shape {tuple(tensor.shape)}; transformers' "
                                  f"'{name}' is {shapes[name]}")
        return tensor
    persistent = set(hf.state_dict())  # buffers the file holds too (Gemma 4's layer_scalar): read, as from_pretrained does
    with torch.no_grad():
        for name, buffer in hf.named_buffers():
            if name in persistent and name in src.tensors:
                buffer.copy_(src.tensors[name].load().to(buffer.dtype))
    blocks = family_of(src.config).hf_steps["block.{i}"]
    lazy_blocks = [blocks.format(i=i) for i in range(src.config.n_layers)] if blockwise else []
    return fill_blockwise(hf, lazy_blocks, weight).eval()  # with no blocks named, every weight is read now


def _empty_transformers_model(src, dtype: torch.dtype) -> nn.Module:
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    with init_empty_weights():  # parameters on meta; buffers (RoPE frequencies, masks) computed for real
        hf = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src.path), dtype=dtype, **EAGER)
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


def reference_taps(src) -> dict[str, str]:
    """Our step → the module of transformers' model for ``src`` that computes it (a multimodal model holds
    its text model under its wrapper's module prefix)."""
    taps = family_of(src.config).hf_steps
    if src.wrapper is None:
        return taps
    prefix = BY_WRAPPER[src.wrapper][1].module_prefix
    return {step: prefix + module.removeprefix("model.") for step, module in taps.items()}


@torch.no_grad()
def reference_steps(hf_model: nn.Module, taps: dict[str, str], n_layers: int,
                    ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run transformers on ids (B, T) and catch each mapped step's output (``taps``: our step → the module
    computing it, the family's ``hf_steps``), plus the logits: in float64 from a float64 model (the
    truth), else in float32."""
    keep = (lambda t: t.detach().cpu()) if hf_model.dtype == torch.float64 else (lambda t: t.detach().float().cpu())
    modules = dict(hf_model.named_modules())
    steps: dict[str, torch.Tensor] = {}
    hooks = []
    for step, module in taps.items():
        for i in range(n_layers) if "{i}" in step else [None]:
            name = step.format(i=i)

            def hook(_m, _inp, out, name=name):
                steps[name] = keep(out[0] if isinstance(out, tuple) else out)
            hooks.append(modules[module.format(i=i)].register_forward_hook(hook))
    try:
        steps["logits"] = keep(hf_model(ids.to(hf_model.device), use_cache=False).logits)
    finally:
        for h in hooks:
            h.remove()
    return steps
