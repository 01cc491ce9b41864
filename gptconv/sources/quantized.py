"""Hugging Face checkpoints that ship quantized (``quantization_config`` in config.json): each quantized
tensor is stored as a pair, and read as the one tensor it stands for, dequantized exactly when it is read.

MXFP4 (``quant_method: mxfp4``, gpt-oss's experts; the OCP microscaling format): ``X_blocks`` (…, R, G, 16)
uint8 holds R rows of G blocks of 32 four-bit E2M1 values, two to a byte (value 2j in the low nibble, 2j + 1
in the high one); ``X_scales`` (…, R, G) uint8 holds each block's E8M0 exponent, biased by 127. Value =
E2M1 × 2^(scale − 127); the tensor ``X`` is (…, G·32, R), the rows last, as gpt-oss's modules hold it.
Every such value is a bfloat16 (two significant bits, an 8-bit exponent): read as bfloat16, exactly.

FP8 with block scales (``quant_method: fp8``, DeepSeek-V3/R1, Kimi K2, the ``-FP8`` releases): ``X`` in
float8 E4M3 and ``X_scale_inv`` (float32), one scale per block of ``weight_block_size`` (128 × 128; the last
blocks of a dimension that is no multiple of it cut short), or one for the tensor. Value = float32(x) × scale,
rounded to float32 once, as transformers and llama.cpp's converter compute it: read as float32.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from ..convert.keymap import TensorInfo
from ..errors import where

MXFP4 = "MXFP4"
# E2M1: sign, two exponent bits, one mantissa bit (the low nibble of each byte is the even value)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantized(tensors: dict[str, TensorInfo], config: dict[str, Any], origin: Path) -> dict[str, TensorInfo]:
    """The checkpoint's tensors with each quantized pair read as its one tensor; unquantized checkpoints as
    they are. A quantization method we do not read is refused (its tensors would be read as something else)."""
    q = config.get("quantization_config")
    if q is None:
        return tensors
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method == "fp8":
        return _fp8(tensors, q, origin)
    if method != "mxfp4":
        raise where(origin, f"quantization_config's quant_method {method!r} is not supported (mxfp4, fp8)")
    out = {k: v for k, v in tensors.items() if not k.endswith(("_blocks", "_scales"))}
    for name in sorted(k.removesuffix("_blocks") for k in tensors if k.endswith("_blocks")):
        blocks, scales = tensors[name + "_blocks"], tensors.get(name + "_scales")
        if scales is None:
            raise where(origin, f"'{name}_blocks' has no '{name}_scales'")
        if name in out:
            raise where(origin, f"'{name}' is stored both whole and as MXFP4 blocks")
        out[name] = mxfp4_tensor(name, blocks, scales, origin)
    if unpaired := sorted(k for k in tensors if k.endswith("_scales") and k.removesuffix("_scales") not in out):
        raise where(origin, f"'{unpaired[0]}' has no '{unpaired[0].removesuffix('_scales')}_blocks'")
    return out


def mxfp4_tensor(name: str, blocks: TensorInfo, scales: TensorInfo, origin: Path) -> TensorInfo:
    """The tensor an MXFP4 pair stands for, checked before anything is read."""
    b, s = blocks.shape, scales.shape
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise where(origin, f"MXFP4 '{name}': blocks and scales must be uint8, not {blocks.dtype} / {scales.dtype}")
    if len(b) < 3 or b[-1] != 16 or b[:-1] != s:
        raise where(origin, f"MXFP4 '{name}': blocks {list(b)} and scales {list(s)} do not pair as (…, R, G, 16) "
                            "and (…, R, G)")
    shape = (*b[:-3], b[-2] * 32, b[-3])

    def load() -> torch.Tensor:
        return dequantize_mxfp4(blocks.load(), scales.load())
    return TensorInfo(shape, torch.bfloat16, load, stored=MXFP4)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(…, R, G, 16) and (…, R, G) uint8 → (…, G·32, R) bfloat16: each value E2M1 × 2^(scale − 127), exact.
    A matrix at a time (an expert's), so that the float32 values in between stay small."""
    *lead, rows, groups, _ = blocks.shape
    table = torch.tensor(E2M1, dtype=torch.float32)
    out = torch.empty(*lead, groups * 32, rows, dtype=torch.bfloat16)
    flat_out, flat_b, flat_s = (out.view(-1, groups * 32, rows), blocks.reshape(-1, rows, groups, 16),
                                scales.reshape(-1, rows, groups))
    for m in range(flat_b.shape[0]):
        b = flat_b[m]
        values = torch.stack((table[(b & 0x0F).long()], table[(b >> 4).long()]), -1)      # (R, G, 16, 2)
        values = torch.ldexp(values.flatten(-2), flat_s[m].to(torch.int32)[..., None] - 127)  # (R, G, 32)
        flat_out[m] = values.reshape(rows, groups * 32).t()                                   # (G·32, R)
    return out


FP8 = "FP8"


def _fp8(tensors: dict[str, TensorInfo], q: dict[str, Any], origin: Path) -> dict[str, TensorInfo]:
    """Each ``X`` + ``X_scale_inv`` pair as the tensor X, dequantized when read (the module docstring)."""
    block = q.get("weight_block_size")
    if block is not None and not (isinstance(block, list) and len(block) == 2
                                  and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise where(origin, f"quantization_config's weight_block_size {block!r} is not two positive integers")
    out = {k: v for k, v in tensors.items() if not k.endswith("_scale_inv")}
    for name in sorted(k.removesuffix("_scale_inv") for k in tensors if k.endswith("_scale_inv")):
        if name not in tensors:
            raise where(origin, f"'{name}_scale_inv' has no '{name}'")
        out[name] = fp8_tensor(name, tensors[name], tensors[name + "_scale_inv"], block, origin)
    return out


def fp8_tensor(name: str, weight: TensorInfo, scale: TensorInfo, block: list[int] | None, origin: Path) -> TensorInfo:
    """The tensor an FP8 weight and its scales stand for, checked before anything is read."""
    if weight.dtype != torch.float8_e4m3fn or not scale.dtype.is_floating_point:
        raise where(origin, f"FP8 '{name}': the weight must be float8 E4M3 and its scale a float, not "
                            f"{weight.dtype} / {scale.dtype}")
    w, s = weight.shape, scale.shape
    grid = tuple(-(-n // b) for n, b in zip(w[-2:], block)) if block is not None and len(w) >= 2 else None
    if not (grid is not None and tuple(s[-2:]) == grid and tuple(s[:-2]) == tuple(w[:-2])
            or math.prod(s) == 1 and block is None):
        raise where(origin, f"FP8 '{name}': scales {list(s)} do not fit a weight {list(w)} in blocks of {block}")

    def load() -> torch.Tensor:
        return dequantize_fp8(weight.load(), scale.load(), block)
    return TensorInfo(tuple(w), torch.float32, load, stored=FP8)


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: list[int] | None) -> torch.Tensor:
    """float32(w) × its block's scale, in float32: (…, R, C) with scales (…, ⌈R/b₀⌉, ⌈C/b₁⌉), or one scale."""
    s = scale.float()
    if block is not None:  # a block past its dimension is one block of it: expanded by no more than the weight
        rows, cols = weight.shape[-2:]
        s = s.repeat_interleave(min(block[0], rows), -2)[..., :rows, :].repeat_interleave(min(block[1], cols), -1)
        s = s[..., :cols]
    return weight.float() * s
