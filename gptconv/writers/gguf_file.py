"""Our model → a GGUF file llama.cpp runs, written with the ``gguf`` package's GGUFWriter.

Streaming: every tensor's info is declared first (``add_tensor_info``), then the header, metadata
and tensor table are written, then each tensor is converted and written in turn
(``write_tensor_data``), so only one converted tensor is held at a time.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGML_QUANT_VERSION, GGUFWriter, LlamaFileType, size_label
from gguf.quants import dequantize, quant_shape_to_byte_shape, quantize

from ..convert.gguf_tokenizer import GGUFVocab
from ..convert.hf_vocab import vocab_of_folder
from ..errors import GptconvError, where
from ..families import family_of
from ..layers.rope import rope_frequencies
from ..output import TailHash, WriteBehind
from .tensors import ExportedFile, Narrowing, Weights

FILE_TYPES = {"f32": LlamaFileType.ALL_F32, "f16": LlamaFileType.MOSTLY_F16, "bf16": LlamaFileType.MOSTLY_BF16,
              "q8_0": LlamaFileType.MOSTLY_Q8_0}
WEIGHT_TYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}


# (name, shape in GGUF order, type name) of each tensor a GGUF file holds
TensorTypes = list[tuple[str, tuple[int, ...], str]]


def write_gguf(weights: Weights, src, tokenizer, path: Path, dtype: str, narrow: Narrowing,
               name: str) -> tuple[ExportedFile, TensorTypes]:
    """The file, and the type each tensor was written in."""
    w = GGUFWriter(str(path), family_of(weights.config).gguf_arch)
    with TailHash(path) as sha:  # hashes the file as it grows
        try:
            infos = _write(w, weights, src, tokenizer, dtype, narrow, name)
        finally:
            w.close()
        types = [(n, tuple(reversed(shape)), qtype.name) for n, shape, qtype in infos]
        return ExportedFile(name, path.stat().st_size, sha.result()), types


def tensor_types(path: Path) -> TensorTypes:
    """What a GGUF file says of its tensors (read with gguf-py, whose reader also parses every metadata
    value: a second or more for a large vocabulary, so the types of a file we wrote come from the writer)."""
    from gguf import GGUFReader
    return [(t.name, tuple(int(n) for n in t.shape), t.tensor_type.name) for t in GGUFReader(path).tensors]


def _write(w: GGUFWriter, weights: Weights, src, tokenizer, dtype: str, narrow: Narrowing,
           name: str) -> list[tuple[str, tuple[int, ...], Q]]:
    cfg = weights.config
    family = family_of(cfg)
    keymap = family.gguf_keymap(cfg)
    w.add_name(Path(name).stem)
    w.add_file_type(FILE_TYPES[dtype])
    family.gguf_metadata(w, cfg)  # the hyperparameters llama.cpp's converter writes for it, no more
    _vocab(src, tokenizer, cfg).write(w)
    w.add_quantization_version(GGML_QUANT_VERSION)

    stored = weights.stored_as(keymap)
    mxfp4 = {t for t in weights.shapes if src.stored_types.get(weights.plan.source_of(t)) == "MXFP4"}
    # tensors the source holds in MXFP4 (gpt-oss's experts) stay MXFP4, as llama.cpp's converter keeps them
    qtypes = [Q.MXFP4 if set(s.ours) <= mxfp4 else _tensor_type(s.name, s.shape, dtype) for s in stored]
    infos = [(s.name, s.shape, qtype) for s, qtype in zip(stored, qtypes)]
    factors = _rope_factors(cfg) + family.gguf_tensors(cfg)
    infos += [(n, tuple(t.shape), Q.F32) for n, t in factors]

    for gguf_name, shape, qtype in infos:
        nbytes, np_dtype, info_shape = _layout(shape, qtype)
        w.add_tensor_info(gguf_name, info_shape, np_dtype, nbytes, raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    w.add_type("model")  # as llama.cpp's converter describes the file: a model, its size from its tensors
    w.add_size_label(size_label(*w.get_total_parameter_count()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    with WriteBehind() as write:
        for s, qtype, tensor in zip(stored, qtypes, weights.written(stored)):
            data = _encode(s.name, tensor, qtype, narrow)
            del tensor  # its pages are unmapped before the next tensor is read
            write(w.write_tensor_data, data)
        for _, t in factors:
            write(w.write_tensor_data, t.numpy())
    return infos


# Tensors llama.cpp's converter keeps in F32 at any output type, beside every 1-D tensor (norms, biases):
# The experts' stacked biases (gpt-oss: 2-D, a bias per expert), kept F32 as llama.cpp keeps every bias
EXPERT_BIASES = re.compile(r"blk\.\d+\.ffn_(gate|up|down)_exps\.bias")
# … and GPT-2's learned positions, the routers (and shared experts' gates), short convolutions' filters
KEEP_F32 = re.compile(r"position_embd\.weight|blk\.\d+\.(ffn_gate_inp|ffn_gate_inp_shexp|ssm_conv1d|shortconv\.conv)"
                      r"\.weight|" + EXPERT_BIASES.pattern)


def _tensor_type(name: str, shape: tuple[int, ...], dtype: str) -> Q:
    """F32 for 1-D tensors and those in KEEP_F32, as llama.cpp keeps them; Q8_0 needs rows of 32·k values."""
    if len(shape) < 2 or KEEP_F32.fullmatch(name):
        return Q.F32
    if dtype == "q8_0" and shape[-1] % 32:
        return Q.F16
    return WEIGHT_TYPES[dtype]


def type_choices(tensors: TensorTypes, dtype: str) -> list[tuple[str, str, str]]:
    """(tensor, type, why) for every tensor of a written GGUF file (``tensors``: what the writer wrote, or
    what the file says, ``tensor_types``): why it has the type it has, against the type ``dtype`` names
    (``Q4_K`` for q4_k_m). The rules that made it are ours for f32 … q8_0 (``_tensor_type``) and
    llama.cpp's quantizer's for the others."""
    from gguf import GGML_QUANT_SIZES
    main = re.sub(r"_[sml]$", "", dtype).upper()  # q4_k_m → Q4_K, q8_0 → Q8_0, bf16 → BF16
    main_block = GGML_QUANT_SIZES[Q[main]][0]

    def bits(t: str) -> float:
        block, size = GGML_QUANT_SIZES[Q[t]]
        return 8 * size / block

    out = []
    for name, shape, kind in tensors:
        row = shape[0]  # shape in GGUF order: rows first
        role = "output head" if name == "output.weight" else "token embedding"
        if kind == main:
            why = f"{dtype}'s type"
        elif len(shape) < 2 or math.prod(shape) == row:
            why = "1-D (a norm or bias): kept F32"
        elif EXPERT_BIASES.fullmatch(name):
            why = "the experts' biases (a bias per expert): kept F32, as llama.cpp keeps every bias"
        elif KEEP_F32.fullmatch(name):
            why = "llama.cpp keeps it unquantized (a router, learned positions or a convolution's filter)"
        elif row % main_block:
            why = f"rows of {row} values, not a multiple of {main}'s block of {main_block} (a fallback type)"
        elif name in ("output.weight", "token_embd.weight"):
            why = f"the {role}: llama.cpp gives it {'more' if bits(kind) > bits(main) else 'fewer'} bits"
        else:
            kind_of = re.sub(r"^blk\.\d+\.", "", name).removesuffix(".weight")
            why = f"llama.cpp's rule for {kind_of} in {dtype}: {'more' if bits(kind) > bits(main) else 'fewer'} bits"
        out.append((name, kind, why))
    return out


def _layout(shape: tuple[int, ...], qtype: Q) -> tuple[int, np.dtype, tuple[int, ...]]:
    """(bytes, numpy dtype, shape) to declare for a tensor of logical ``shape`` stored as ``qtype``."""
    n = int(np.prod(shape))
    if qtype == Q.F32:
        return 4 * n, np.dtype(np.float32), shape
    if qtype == Q.F16:
        return 2 * n, np.dtype(np.float16), shape
    byte_shape = quant_shape_to_byte_shape(shape, qtype)
    return int(np.prod(byte_shape)), np.dtype(np.uint8), byte_shape


def _encode(name: str, t: torch.Tensor, qtype: Q, narrow: Narrowing) -> np.ndarray:
    """The tensor's bytes as GGUF stores them; Q8_0 is quantized a block of rows at a time."""
    if qtype in (Q.F32, Q.F16):
        return narrow(name, t, torch.float16 if qtype == Q.F16 else torch.float32).numpy()
    rows = t.reshape(-1, t.shape[-1])
    out = np.empty(quant_shape_to_byte_shape(tuple(rows.shape), qtype), dtype=np.uint8)
    step = max(1, narrow.CHUNK // rows.shape[1])
    for i in range(0, rows.shape[0], step):
        values = narrow(name, rows[i:i + step], torch.float32).numpy()
        out[i:i + step] = quantize(values, qtype)
        if qtype == Q.MXFP4 and not np.array_equal(dequantize(out[i:i + step], qtype), values):
            raise GptconvError(f"{name}: a value MXFP4 does not hold exactly (kept MXFP4 as the source stores it)")
    return out.reshape(quant_shape_to_byte_shape(tuple(t.shape), qtype))


def _rope_factors(cfg) -> list[tuple[str, torch.Tensor]]:
    """RoPE scaling that GGUF stores as tensors of per-frequency factors: Llama 3.1's (llama.cpp's
    ``rope_freqs``), longrope's long and short factors (``rope_factors_long``, ``rope_factors_short``)."""
    rope = getattr(cfg, "rope", None)  # the decoder's Rotary; Gemma's configs say RoPE in fields of their own
    s = rope.scaling if rope is not None else getattr(cfg, "rope_scaling", None)
    if s is not None and s.kind == "longrope":
        return [("rope_factors_long.weight", torch.tensor(s.long_factors, dtype=torch.float32)),
                ("rope_factors_short.weight", torch.tensor(s.factors, dtype=torch.float32))]
    if s is None or s.kind not in ("llama3", "factors"):  # linear, yarn: keys
        return []
    base = rope_frequencies(cfg.head_dim, cfg.rope.theta)
    return [("rope_freqs.weight", (base / rope_frequencies(cfg.head_dim, cfg.rope.theta, s)).float())]


def _vocab(src, tokenizer, cfg) -> GGUFVocab:
    """The tokenizer metadata to write: a GGUF source's own, or what llama.cpp's converter writes for
    an HF folder's tokenizer (``hf_vocab.py``)."""
    if src.format == "gguf":
        return GGUFVocab.read(src.gguf.fields)
    vocab = vocab_of_folder(src.path, cfg, tokenizer.tk, tokenizer.chat_template, family_of(cfg).gguf_vocab)
    if len(vocab.tokens) != cfg.vocab_size:
        raise where(src.path, f"the tokenizer has {len(vocab.tokens)} tokens, the model {cfg.vocab_size}")
    return vocab
