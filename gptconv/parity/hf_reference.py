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
from ..streaming import Rows, Streamed, model_device, stop_here, table_names
from .hf_reading import GGUFReading, HFReading, Reading, missing

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


def transformers_model(src, dtype: torch.dtype = torch.float32, blockwise: bool = False,
                       reading: Reading | None = None, solo: bool = True, rows: bool = True) -> nn.Module:
    """transformers' own model for an opened source, eager attention, in ``dtype``: the reference.

    Its weights are transformers' own reading of the checkpoint (never through our key map), done
    part by part (``hf_reading.py``): its loader on an HF folder's tensors, its GGUF functions on a
    GGUF file's. ``blockwise``: each block's weights read just before it runs and given back after it
    (``solo``; when the caller says otherwise: ``model.streamed.empty``); otherwise all are read now.
    The tables (embedding, head) are read by rows either way (``gptconv.streaming.Rows``), so a
    streamed reference computes the same bits as a whole one; with ``rows`` false they are read whole
    (a model moved to a GPU). ``reading``: one shared by the models
    of a verify (the float64 truth and our dtype), which reads each part once for both.

    Read by ``from_pretrained`` instead, and whole: a multimodal checkpoint (transformers' whole model,
    run on text), and the GGUF architectures transformers reads through its own quantizer (Qwen3.5,
    LFM2). From an fp32 folder in fp32 the weights are the memory-mapped tensors, shared with ours.
    """
    if src.wrapper is not None:  # transformers' whole multimodal model, read by its own code, run on text
        if blockwise:
            raise where(src.path, f"the reference streams only text models; a '{src.wrapper}' checkpoint is read "
                                  "whole by transformers (verify with --no-stream)")
        return load_transformers_model(src.path, dtype, multimodal=True)
    if src.format == "gguf" and _read_by_quantizer(src):
        if blockwise:
            raise where(src.path, f"transformers reads a '{src.gguf.fields.arch}' GGUF file whole (through its GGUF "
                                  "quantizer), so its reference cannot stream; verify with --no-stream")
        return gguf_transformers_model(src, dtype)
    hf = empty_reference(src, dtype)
    reading = reading or reading_for(src, hf, rows)
    gaps = missing(hf, reading.covers)
    if gaps:
        raise where(src.path, (f"transformers cannot read this GGUF file (its GGUF reader leaves {len(gaps)} weights "
                               f"unread, such as {gaps[0]}); verify it with --against llama.cpp") if src.format == "gguf" else
                    f"holds no tensor that transformers reads as its '{gaps[0]}'" + (f" (+{len(gaps) - 1} more)"
                                                                                       if len(gaps) > 1 else ""))
    blocks = reference_blocks(src)
    streamed = blocks if blockwise else []

    def fill(block: str | None) -> None:
        for part in ([block] if block is not None else [b for b in reading.parts if b not in streamed]):
            reading.fill(hf, part, dtype)
        if block is None:
            _persistent_buffers(src, hf)
    tables = {name: reading.rows(name, dtype) for name in reading.tables}
    hf.streamed = Streamed(hf, streamed, fill, tables, dtype, solo)
    hf.reading = reading  # for the next model of the same verify: each part read once for both
    if not blockwise:
        reading.forget()
        unread = [n for n, p in hf.named_parameters() if p.is_meta and not isinstance(p, Rows)]
        if unread:
            raise where(src.path, f"transformers' reading leaves its '{unread[0]}' unread")
    return hf.eval()


def streams(src) -> bool:
    """Whether transformers' reference for ``src`` can be read a block at a time (not a multimodal
    checkpoint, nor a GGUF architecture its quantizer reads)."""
    return src.wrapper is None and not (src.format == "gguf" and _read_by_quantizer(src))


def reading_for(src, hf: nn.Module, rows: bool = True) -> Reading:
    """transformers' reading of ``src`` by parts, for a model like ``hf`` (on meta); ``rows``: its tables
    read by rows."""
    _transformers()
    blocks = reference_blocks(src)
    head = next((f"{n}.weight" for n, m in hf.named_modules() if m is hf.get_output_embeddings()), None)
    tables = table_names(hf, head) if rows else []
    if src.format == "gguf":
        family = family_of(src.config)
        model_type = family.transformers_reads_gguf_as[0] if family.transformers_reads_gguf_as else None
        try:
            return GGUFReading(src, hf, blocks, tables, model_type)
        except (ValueError, KeyError, NotImplementedError, TypeError, RuntimeError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise where(src.path, f"transformers cannot read this GGUF file ({first}); "
                                  "verify it with --against llama.cpp") from None
    return HFReading(src, hf, blocks, tables)


def reference_blocks(src) -> list[str]:
    """The module names of transformers' blocks for ``src``."""
    block = reference_taps(src)["block.{i}"]
    return [block.format(i=i) for i in range(src.config.n_layers)]


def _read_by_quantizer(src) -> bool:
    """Whether transformers reads this GGUF file's architecture through its GGUF quantizer (not tensor
    by tensor with ``load_gguf_checkpoint``'s functions)."""
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
    except ImportError:
        return False
    return is_gguf_arch_supported(src.gguf.fields.arch)


def _persistent_buffers(src, hf: nn.Module) -> None:
    """Buffers an HF folder holds too (Gemma 4's layer_scalar): read, as from_pretrained does."""
    if src.format != "hf":
        return
    persistent = set(hf.state_dict())
    with torch.no_grad():
        for name, buffer in hf.named_buffers():
            if name in persistent and name in src.tensors and not buffer.is_meta:
                buffer.copy_(src.tensors[name].load().to(buffer.dtype))


def install_stops(hf: nn.Module, taps: dict[str, str], n_layers: int) -> nn.Module:
    """Hooks that hand each step's output to the lane running the model (``gptconv.streaming.Lane``);
    they do nothing outside a lane."""
    if getattr(hf, "_stops", False):
        return hf
    hf._stops = True
    modules = dict(hf.named_modules())
    for step, module in taps.items():
        for i in range(n_layers) if "{i}" in step else [None]:
            def hook(_m, _inp, out, name=step.format(i=i)):
                stop_here(name, out[0] if isinstance(out, tuple) else out)
            modules[module.format(i=i)].register_forward_hook(hook)
    return hf


def empty_reference(src, dtype: torch.dtype) -> nn.Module:
    """transformers' model for ``src`` on the meta device (its buffers computed for real), tied as it
    ties at load time: from the folder's config.json, or for a GGUF file from the configuration the
    file encodes as we read it (``gguf_transformers_model`` says why)."""
    transformers = _transformers()
    from accelerate import init_empty_weights
    if src.format == "gguf":
        try:
            config = transformers.AutoConfig.for_model(**family_of(src.config).config_to_hf(src.config))
        except ValueError as e:
            raise where(src.path, f"transformers cannot represent this model ({e}); "
                                  "verify it with --against llama.cpp") from None
    else:
        config = transformers.AutoConfig.from_pretrained(src.path)
    with init_empty_weights():  # parameters on meta; buffers (RoPE frequencies, masks) computed for real
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, **EAGER)
    hf.tie_weights()  # a tied head shares the embedding's parameter (transformers ties at load time)
    return hf


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


def gguf_config_disagreements(src, read: dict | None = None) -> tuple[list[str], list[str]]:
    """The fields where transformers' own reading of a GGUF file's metadata differs from ours. The
    reference runs on our reading (see :func:`gguf_transformers_model`), so a field we misread would
    go unseen; transformers reads some of them independently (its GGUF_CONFIG_MAPPING: sizes, eps,
    RoPE theta; not RoPE scaling, not GPT-2's context), and those must agree. ``read``: what its
    ``load_gguf_checkpoint`` read of the file's metadata, where the reference's reading has it already.
    Returns (those disagreements, notes on what could not be cross-checked)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    transformers = _transformers()
    ours = family_of(src.config).config_to_hf(src.config)
    ours["rope_theta"] = ours.pop("rope_parameters", {}).get("rope_theta")
    try:
        if read is not None:  # the config class from_pretrained would make of it
            with contextlib.redirect_stderr(io.StringIO()):
                theirs = transformers.AutoConfig.for_model(**read).to_dict()
        else:
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
        steps["logits"] = keep(hf_model(ids.to(model_device(hf_model)), use_cache=False).logits)
    finally:
        for h in hooks:
            h.remove()
    return steps
