"""GGUF (llama.cpp) as a source: metadata → our config, tensors dequantized by ``gguf.quants``.

The format is read by the ``gguf`` package (``GGUFReader``, memory-mapped); this module holds
only the mapping: which metadata key is which config field, which llama.cpp tensor name is which
parameter, and llama.cpp's Q/K row permutation for its interleaved RoPE layout.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUF_MAGIC, GGMLQuantizationType, GGUFReader, GGUFValueType, Keys
from gguf.quants import dequantize

from ..errors import where
from ..files import UNLIMITED, regular_file
from ..models.gpt2 import GPT2Config
from ..models.llama import LlamaConfig
from ..models.rope import RopeScaling
from .keymap import Drop, KeyMap, Map, TensorInfo, Tied, Transform

_REQUIRED = object()


class GGUFFields:
    """Typed access to a GGUF file's metadata, naming the file and key in every error."""

    def __init__(self, reader: GGUFReader, path: Path) -> None:
        self.reader, self.path = reader, path
        self.arch = self.get(Keys.General.ARCHITECTURE, str)

    def get(self, key: str, kind: type, default: Any = _REQUIRED) -> Any:
        key = key.format(arch=getattr(self, "arch", ""))
        field = self.reader.fields.get(key)
        if field is None:
            if default is _REQUIRED:
                raise where(self.path, f"missing metadata key '{key}'")
            return default
        try:
            value = field.contents()
        except Exception as e:  # a field whose bytes do not decode
            raise where(self.path, f"metadata key '{key}' cannot be read ({e})") from None
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise where(self.path, f"metadata key '{key}' is {type(value).__name__}, expected {kind.__name__}")
        return value


@dataclass
class GGUFCheckpoint:
    path: Path
    fields: GGUFFields
    config: Any
    tensors: dict[str, TensorInfo]
    stored_types: dict[str, str]  # tensor name → GGML type (Q4_1, F32, …)


def check_header(path: Path) -> None:
    """Refuse, before GGUFReader walks the file, counts that the file's size cannot hold.

    The fixed header is magic, version (u32), tensor count and metadata count (u64 each). Every
    tensor entry takes at least 24 bytes and every metadata entry at least 12, so larger counts
    are lies that would only make a reader loop or allocate.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as e:
        raise where(path, e.strerror or str(e)) from None
    if len(head) < 24:
        raise where(path, f"not a GGUF file: {size} bytes, shorter than a GGUF header")
    magic, version, n_tensors, n_kv = struct.unpack("<IIQQ", head)
    if magic != GGUF_MAGIC:
        raise where(path, f"not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
    if version not in (2, 3):
        raise where(path, f"GGUF version {version} is not supported (2 or 3)")
    if n_tensors * 24 > size or n_kv * 12 > size:
        raise where(path, f"header claims {n_tensors:,} tensors and {n_kv:,} metadata entries, "
                          f"more than a {size:,}-byte file can hold")


class CheckedReader(GGUFReader):
    """GGUFReader, refusing to read past the end of the file. Its reads past the end return empty
    arrays, so an array whose count is 2^40 made it append empty parts for ever (3.5 GB in 30 s):
    every read must fit in the file, and every array's count times its least item size in the bytes
    left (a string takes at least its 8-byte length, a nested array its 12-byte header)."""

    LEAST_ITEM = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}
    # No key llama.cpp defines holds arrays of arrays, and the reader builds Python objects for each
    # item (a 12 MB file of a million empty arrays took 42 s and 1.5 GB): a few are allowed, not more.
    MOST_NESTED = 1024

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + int(np.dtype(dtype).itemsize) * int(count)
        if end > len(self.data):
            raise ValueError(f"a read at byte {int(offset):,} runs past the end of the file ({len(self.data):,} bytes)")
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type == GGUFValueType.ARRAY:
            item = GGUFValueType(int(self._get(orig_offs, np.uint32)[0]))
            count = int(self._get(orig_offs + 4, np.uint64)[0])
            least = self.LEAST_ITEM.get(item) or np.dtype(self.gguf_scalar_to_np[item]).itemsize
            left = len(self.data) - orig_offs - 12
            if count * least > left:
                raise ValueError(f"an array of {count:,} {item.name} items at byte {orig_offs:,}, more than the "
                                 f"{left:,} bytes left can hold")
            if item == GGUFValueType.ARRAY and count > self.MOST_NESTED:
                raise ValueError(f"an array of {count:,} arrays at byte {orig_offs:,}; no GGUF key holds more "
                                 f"than {self.MOST_NESTED:,}")
        return super()._get_field_parts(orig_offs, raw_type)


def read_fields(path: Path) -> GGUFFields:
    """A GGUF file's metadata (its tensors listed, none read), whatever its architecture."""
    path = regular_file(Path(path), UNLIMITED)  # a FIFO would block GGUFReader for ever
    check_header(path)
    try:
        reader = CheckedReader(path, "r")
    except FileNotFoundError:
        raise where(path, "no such file") from None
    except Exception as e:  # GGUFReader raises ValueError, struct.error, IndexError… on a corrupt file
        raise where(path, f"not a readable GGUF file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return GGUFFields(reader, path)


def open_gguf(path: Path) -> GGUFCheckpoint:
    fields = read_fields(path)
    reader = fields.reader
    if fields.arch not in GGUF_ARCHS:
        raise where(path, f"GGUF architecture '{fields.arch}' is not supported (supported: {', '.join(GGUF_ARCHS)})")
    tensors, types = {}, {}
    size = path.stat().st_size
    for t in reader.tensors:
        if t.name in tensors:
            raise where(path, f"tensor '{t.name}' appears twice")
        if (t.data_offset - reader.data_offset) % reader.alignment:
            raise where(path, f"tensor '{t.name}' starts at a data offset not aligned to {reader.alignment} bytes")
        if t.data_offset + t.n_bytes > size:
            raise where(path, f"tensor '{t.name}' runs past the end of the file")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml lists dims innermost first
        tensors[t.name] = TensorInfo(shape, torch.float32, _loader(path, t, shape))
        types[t.name] = t.tensor_type.name
    config = GGUF_ARCHS[fields.arch][0](fields, tensors)
    return GGUFCheckpoint(path, fields, config, tensors, types)


def _loader(path: Path, t: Any, shape: tuple[int, ...]):
    def load() -> torch.Tensor:
        try:
            if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                array = np.asarray(t.data, dtype=np.float32)
            else:
                array = dequantize(t.data, t.tensor_type)
            return torch.from_numpy(np.array(array, dtype=np.float32, copy=True)).reshape(shape)
        except (NotImplementedError, ValueError, TypeError) as e:
            raise where(path, f"tensor '{t.name}' of type {t.tensor_type.name} cannot be dequantized ({e})") from None
    return load


def llama_config_from_gguf(f: GGUFFields, tensors: dict[str, TensorInfo]) -> LlamaConfig:
    if f.get(Keys.LLM.EXPERT_COUNT, int, 0):
        raise where(f.path, "mixture-of-experts models are not supported")
    if f.get(Keys.Attention.SLIDING_WINDOW, int, 0):
        raise where(f.path, "sliding-window attention is not supported")
    heads = f.get(Keys.Attention.HEAD_COUNT, int)
    d = f.get(Keys.LLM.EMBEDDING_LENGTH, int)
    head_dim = f.get(Keys.Attention.KEY_LENGTH, int, 0) or d // max(heads, 1)
    rope_dim = f.get(Keys.Rope.DIMENSION_COUNT, int, head_dim)
    if rope_dim != head_dim:
        raise where(f.path, f"RoPE on {rope_dim} of {head_dim} head dimensions is not supported")
    try:
        scaling = _rope_scaling(f, tensors, head_dim)
    except ValueError as e:
        raise where(f.path, str(e)) from None
    vocab = f.get(Keys.LLM.VOCAB_SIZE, int, 0) or len(f.get(Keys.Tokenizer.LIST, list, []))
    try:
        return LlamaConfig(
            vocab_size=vocab or tensors["token_embd.weight"].shape[0],
            context_length=f.get(Keys.LLM.CONTEXT_LENGTH, int),
            d_model=d,
            n_layers=f.get(Keys.LLM.BLOCK_COUNT, int),
            n_heads=heads,
            n_kv_heads=f.get(Keys.Attention.HEAD_COUNT_KV, int, heads),
            d_ff=f.get(Keys.LLM.FEED_FORWARD_LENGTH, int),
            head_dim=head_dim,
            norm_eps=f.get(Keys.Attention.LAYERNORM_RMS_EPS, float),
            rope_theta=f.get(Keys.Rope.FREQ_BASE, float, 10000.0),
            rope_scaling=scaling,
            tie_embeddings="output.weight" not in tensors,
            qkv_bias="blk.0.attn_q.bias" in tensors,
            o_bias="blk.0.attn_output.bias" in tensors,
            mlp_bias="blk.0.ffn_up.bias" in tensors,
            bos_token_id=f.get(Keys.Tokenizer.BOS_ID, int, None),
            eos_token_id=f.get(Keys.Tokenizer.EOS_ID, int, None),
        )
    except (ValueError, KeyError) as e:
        raise where(f.path, str(e)) from None


def _rope_scaling(f: GGUFFields, tensors: dict[str, TensorInfo], head_dim: int) -> RopeScaling | None:
    scaling = None
    kind = f.get(Keys.Rope.SCALING_TYPE, str, "none")
    if kind == "linear":
        scaling = RopeScaling("linear", factor=f.get(Keys.Rope.SCALING_FACTOR, float))
    elif kind not in ("none", ""):
        raise ValueError(f"RoPE scaling '{kind}' is not supported")
    if "rope_freqs.weight" in tensors:  # Llama 3.1 scaling, stored as one factor per frequency
        factors = tensors["rope_freqs.weight"].load().flatten().tolist()
        if len(factors) != head_dim // 2 or not all(0 < x < 1e6 for x in factors):
            raise ValueError(f"rope_freqs has {len(factors)} factors, expected {head_dim // 2} positive ones")
        scaling = RopeScaling("factors", factors=tuple(factors))
    return scaling


def gpt2_config_from_gguf(f: GGUFFields, tensors: dict[str, TensorInfo]) -> GPT2Config:
    d = f.get(Keys.LLM.EMBEDDING_LENGTH, int)
    vocab = f.get(Keys.LLM.VOCAB_SIZE, int, 0) or len(f.get(Keys.Tokenizer.LIST, list, []))
    try:
        return GPT2Config(
            vocab_size=vocab or tensors["token_embd.weight"].shape[0],
            context_length=f.get(Keys.LLM.CONTEXT_LENGTH, int),
            d_model=d,
            n_layers=f.get(Keys.LLM.BLOCK_COUNT, int),
            n_heads=f.get(Keys.Attention.HEAD_COUNT, int),
            d_ff=f.get(Keys.LLM.FEED_FORWARD_LENGTH, int, 4 * d),
            norm_eps=f.get(Keys.Attention.LAYERNORM_EPS, float),
            bos_token_id=f.get(Keys.Tokenizer.BOS_ID, int, None),
            eos_token_id=f.get(Keys.Tokenizer.EOS_ID, int, None),
        )
    except (ValueError, KeyError) as e:
        raise where(f.path, str(e)) from None


def _permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """HF rotate-half rows → llama.cpp's interleaved pairs (per head: [x₀, x_{hd/2}, x₁, …])."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# llama.cpp applies the permutation to Q with n_heads rows groups and to K with n_kv_heads.
PERMUTE_Q = Transform("permute_q", lambda t, c: _unpermute(t, c.n_heads), lambda t, c: _permute(t, c.n_heads))
PERMUTE_K = Transform("permute_k", lambda t, c: _unpermute(t, c.n_kv_heads), lambda t, c: _permute(t, c.n_kv_heads))

_LLAMA_LAYER = [
    ("attn_norm.weight", "norm1.weight", None), ("ffn_norm.weight", "norm2.weight", None),
    ("attn_q.weight", "attn.q.weight", PERMUTE_Q), ("attn_q.bias", "attn.q.bias", PERMUTE_Q),
    ("attn_k.weight", "attn.k.weight", PERMUTE_K), ("attn_k.bias", "attn.k.bias", PERMUTE_K),
    ("attn_v.weight", "attn.v.weight", None), ("attn_v.bias", "attn.v.bias", None),
    ("attn_output.weight", "attn.o.weight", None), ("attn_output.bias", "attn.o.bias", None),
    ("ffn_gate.weight", "mlp.gate.weight", None), ("ffn_gate.bias", "mlp.gate.bias", None),
    ("ffn_up.weight", "mlp.up.weight", None), ("ffn_up.bias", "mlp.up.bias", None),
    ("ffn_down.weight", "mlp.down.weight", None), ("ffn_down.bias", "mlp.down.bias", None),
]


def llama_gguf_keymap(config: LlamaConfig) -> KeyMap:
    head = Tied("output.weight", "tok_emb.weight") if config.tie_embeddings else Map("output.weight", "lm_head.weight")
    return KeyMap("llama (GGUF)", [
        Map("token_embd.weight", "tok_emb.weight"),
        *(Map(f"blk.{{i}}.{src}", f"blocks.{{i}}.{dst}", *([t] if t else [])) for src, dst, t in _LLAMA_LAYER),
        Map("output_norm.weight", "norm_f.weight"),
        head,
        Drop("rope_freqs.weight"),  # read into the config (RopeScaling "factors"), not a parameter
    ])


_GPT2_LAYER = [("attn_norm", "norm1"), ("attn_qkv", "attn.qkv"), ("attn_output", "attn.proj"),
               ("ffn_norm", "norm2"), ("ffn_up", "mlp.fc"), ("ffn_down", "mlp.proj")]

# llama.cpp stores GPT-2's weights (out, in) already, so nothing is transposed.
GPT2_GGUF = KeyMap("gpt2 (GGUF)", [
    Map("token_embd.weight", "tok_emb.weight"),
    Map("position_embd.weight", "pos_emb.weight"),
    *(Map(f"blk.{{i}}.{src}.{p}", f"blocks.{{i}}.{dst}.{p}") for src, dst in _GPT2_LAYER for p in ("weight", "bias")),
    Map("output_norm.weight", "norm_f.weight"),
    Map("output_norm.bias", "norm_f.bias"),
    Tied("output.weight", "tok_emb.weight"),
])

# GGUF general.architecture → (config from metadata, key map for that config)
GGUF_ARCHS = {
    "llama": (llama_config_from_gguf, llama_gguf_keymap),
    "gpt2": (gpt2_config_from_gguf, lambda config: GPT2_GGUF),
}
