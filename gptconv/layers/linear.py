"""``nn.Linear`` with a chosen product for the one-row case: decoding one token on the CPU.

With one input row, a linear layer is a matrix-vector product, bound by reading the weight from
memory. How fast the BLAS runs it depends on the machine: MKL's gemv uses one thread on an AMD
EPYC (10–16 GB/s there, against 42 GB/s for a plain sum), but all of them on an Intel Xeon. Split
into contiguous blocks, two per thread, and multiplied as a batch (``torch.bmm`` parallelises
over the batch), the weight is read at 20–30 GB/s on either. Measured: on the EPYC, decoding
GPT-2 124M in fp32 goes from ~22 to ~43 tokens/s with the blocks; on a Xeon (Sapphire Rapids)
gemv wins, SmolLM2-135M 31 tokens/s against 14 with blocks.

The two products add in different orders, so their logits differ in the last bits. Which one runs
is therefore a setting, never a measurement: the environment variable ``GPTCONV_ONE_ROW_PRODUCT``,
read once at the first one-row product (not at import), or :func:`set_one_row_product`;
:func:`one_row_product` says which is in force.

- ``blas`` (the default): the BLAS gemv. For a float32 or bfloat16 row it is called directly
  (``torch.mv``), which gives F.linear's result bit for bit (tested) without its matrix-product
  dispatch: measured on the Xeon above, bfloat16 weights are read at 18–22 GB/s against 11–15 GB/s
  through ``F.linear`` (which repacks them for a matrix product), float32 at 26–28 against 26.
  Wherever ``mv`` would round differently (float16, a transposed bfloat16 weight, a strided row, a
  single input or output: ``_gemv_equals_linear``) it is ``F.linear`` itself. The same input gives
  the same logits in every process, and it is the fastest on the Xeon.
- ``blocks``: the block product, for a machine whose gemv runs on one thread (the EPYC above).
  ``GPTCONV_ONE_ROW_PRODUCT=blocks``; it needs two threads or more (on one, it is ``F.linear``),
  and it is as reproducible as ``blas`` for a given thread count.

Any other input (a prompt, a batch, another device) takes ``F.linear`` whatever the setting.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import GptconvError

ENV_VAR = "GPTCONV_ONE_ROW_PRODUCT"
PRODUCTS = ("blas", "blocks")  # the first is the default

_product: str | None = None  # None: not read from the environment yet


def one_row_product() -> str:
    """The one-row product in force: ``"blas"`` or ``"blocks"`` (``GPTCONV_ONE_ROW_PRODUCT``, read once)."""
    global _product
    if _product is None:
        value = os.environ.get(ENV_VAR, "")
        _product = _checked(value, f"{ENV_VAR}={value!r}") if value else PRODUCTS[0]
    return _product


def set_one_row_product(name: str | None) -> None:
    """Use ``name`` (``"blas"`` or ``"blocks"``) from now on, in this process; ``None``: the
    environment's choice again, read at the next use."""
    global _product
    _product = None if name is None else _checked(name, f"one-row product {name!r}")


def _checked(name: str, what: str) -> str:
    if name not in PRODUCTS:
        raise GptconvError(f"{what}: expected {PRODUCTS[0]} (the default) or {PRODUCTS[1]}")
    return name


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weightᵀ + bias, for x (…, in) and weight (out, in)."""
    split = _blocks(weight, x) if one_row_product() == "blocks" else None
    return _blas(x, weight, bias) if split is None else split(x, bias)


def _gemv_equals_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Where torch.mv / addmv give F.linear's result bit for bit (tested): a plain single row on the CPU,
    a weight of two or more rows and columns, float32 in any layout, or bfloat16 with an (out, in)
    contiguous weight and no bias (with a bias, F.linear in bfloat16 rounds differently from addmv on
    some CPUs: an AMD EPYC, for 3072 × 768, where an Intel Sapphire Rapids gave the same bits)."""
    if x.dtype != weight.dtype or not _one_row_on_cpu(x) or not _plain_row(x):  # a strided row: F.linear
        return False
    if min(weight.shape) < 2:  # a single input or output: F.linear takes another path there
        return False
    return x.dtype == torch.float32 or x.dtype == torch.bfloat16 and weight.is_contiguous() and bias is None


def _plain_row(x: torch.Tensor) -> bool:
    """A single row laid out as a new tensor of its shape would be (F.linear takes other paths for
    other strides, even over size-1 dimensions, and rounds differently there)."""
    d = x.size(-1)
    return x.stride(-1) == 1 and all(s == d for s in x.stride()[:-1])


def _blas(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear; a single row on the CPU goes straight to the gemv where that gives the same result."""
    if not _gemv_equals_linear(x, weight, bias):
        return F.linear(x, weight, bias)
    row = x.reshape(-1)
    y = torch.mv(weight, row) if bias is None else torch.addmv(bias, weight, row)
    return y.view(*x.shape[:-1], weight.size(0))


def _one_row_on_cpu(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.numel() == x.size(-1)


def _blocks(weight: torch.Tensor, x: torch.Tensor) -> Callable | None:
    """The block product for a single row ``x`` on the CPU, or None where it does not apply."""
    if not _one_row_on_cpu(x):
        return None
    k = 2 * torch.get_num_threads()  # two blocks a thread measured ~10% faster than one
    if k < 4:
        return None
    out_features, in_features = weight.shape
    if weight.is_contiguous():  # (out, in): each block is a run of output rows
        n = out_features // k * k
        blocks, rest = weight[:n].view(k, n // k, in_features), weight[n:]

        def rows(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            row = x.reshape(1, in_features)
            y = torch.bmm(blocks, row.t().expand(k, in_features, 1)).view(n)
            if n < out_features:
                y = torch.cat([y, F.linear(row, rest)[0]])
            return (y if bias is None else y + bias).view(*x.shape[:-1], out_features)
        return rows
    if weight.t().is_contiguous() and in_features % k == 0:  # a transposed (in, out) view: runs of inputs
        blocks = weight.t().view(k, in_features // k, out_features)

        def inputs(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            y = torch.bmm(x.reshape(k, 1, in_features // k), blocks).sum(0)
            return (y if bias is None else y + bias).view(*x.shape[:-1], out_features)
        return inputs
    return None


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state-dict names) computed by :func:`linear`; with
    ``blocks`` in force, the block views of its weight are made once (per weight and thread count),
    not at every token."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        product = one_row_product()  # read (and checked) at the first forward, prompt or not
        wants_grad = torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad)
        if product == "blas" or not _one_row_on_cpu(x) or wants_grad:  # the block views carry no gradient
            return _blas(x, self.weight, self.bias)
        w = self.weight
        # the views hold the weight's memory: remade when that memory changes (``.data =``, ``.to()``)
        key = (w.data_ptr(), w.dtype, tuple(w.shape), w.stride(), torch.get_num_threads())
        made = self.__dict__.get("_made_for")
        if made is None or made[0] != key:
            self.__dict__["_made_for"] = (key, _blocks(w, x))
        split = self.__dict__["_made_for"][1]
        return F.linear(x, self.weight, self.bias) if split is None else split(x, self.bias)
