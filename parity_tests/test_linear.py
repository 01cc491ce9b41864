"""The one-row (decode) path of our Linear: the same products as F.linear, whatever the weight's layout."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gptconv.parity.compare import SAME_MODEL
import torch.nn.functional as F

from gptconv.errors import GptconvError
from gptconv.layers import linear as linear_module
from gptconv.layers.linear import Linear, linear


@pytest.fixture
def one_row():
    """Set the one-row product for one test; the environment's choice again afterwards."""
    yield linear_module.set_one_row_product
    linear_module.set_one_row_product(None)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("out_features,in_features", [(64, 48), (67, 48), (5, 48), (48, 50)])
@pytest.mark.parametrize("layout", ["out-in", "in-out view"])
@pytest.mark.parametrize("product", ["blocks", "blas"])
def test_single_row_equals_f_linear(threads, out_features, in_features, layout, product, one_row):
    one_row(product)
    g = torch.Generator().manual_seed(out_features * in_features)
    w = torch.randn(out_features, in_features, generator=g)
    if layout == "in-out view":  # GPT-2's Conv1D weights, kept as a transposed view of the file's (in, out)
        w = w.t().contiguous().t()
    b = torch.randn(out_features, generator=g)
    x = torch.randn(1, 1, in_features, generator=g)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for bias in (None, b):
            want = F.linear(x, w, bias)
            got = linear(x, w, bias)
            assert got.shape == want.shape == (1, 1, out_features)
            torch.testing.assert_close(got, want, rtol=SAME_MODEL.rtol, atol=SAME_MODEL.atol)
            module = Linear(in_features, out_features, bias=bias is not None)
            with torch.no_grad():
                module.weight = torch.nn.Parameter(w, requires_grad=False)
                if bias is not None:
                    module.bias.copy_(bias)
                torch.testing.assert_close(module(x), want, rtol=SAME_MODEL.rtol, atol=SAME_MODEL.atol)
                torch.testing.assert_close(module(x[0, 0]), want[0, 0], rtol=SAME_MODEL.rtol, atol=SAME_MODEL.atol)
                torch.testing.assert_close(module(x.expand(1, 3, in_features)), F.linear(x.expand(1, 3, in_features), w, bias))
    finally:
        torch.set_num_threads(old)


def test_a_new_weight_is_noticed():
    m = Linear(8, 8, bias=False)
    x = torch.randn(1, 8)
    with torch.no_grad():
        m(x)
        m.weight = torch.nn.Parameter(torch.eye(8), requires_grad=False)
        torch.testing.assert_close(m(x), x)


def test_empty_build_initialises_nothing():
    """Initialising on meta is not free (normal_ imports torch._dynamo, ~1.3 s): a load must not do it."""
    code = ("import sys, gptconv; from gptconv.models import build_empty, PRESETS; "
            "m = build_empty(PRESETS['gpt2']); assert next(m.parameters()).is_meta; "
            "print('torch._dynamo' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_blas_is_the_default_and_f_linear_itself(monkeypatch, one_row):
    monkeypatch.delenv("GPTCONV_ONE_ROW_PRODUCT", raising=False)
    one_row(None)
    assert linear_module.one_row_product() == "blas"
    w, x = torch.randn(64, 48), torch.randn(1, 48)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(linear(x, w), F.linear(x, w))
        m = Linear(48, 64, bias=False)
        with torch.no_grad():
            m.weight.copy_(w)
            assert torch.equal(m(x), F.linear(x, w))
        assert "_made_for" not in m.__dict__  # no block views are made for blas
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("value", ["blas", "blocks"])
def test_the_environment_variable_is_read_once(value, monkeypatch, one_row):
    monkeypatch.setenv("GPTCONV_ONE_ROW_PRODUCT", value)
    one_row(None)
    assert linear_module.one_row_product() == value
    monkeypatch.setenv("GPTCONV_ONE_ROW_PRODUCT", "blocks" if value == "blas" else "blas")
    assert linear_module.one_row_product() == value  # kept: not read again
    one_row("blas")
    assert linear_module.one_row_product() == "blas"


def test_a_bad_value_is_an_error_when_read_not_at_import(monkeypatch, one_row):
    monkeypatch.setenv("GPTCONV_ONE_ROW_PRODUCT", "fastest")
    r = subprocess.run([sys.executable, "-c", "import gptconv.layers.linear, gptconv; print('imported')"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "imported", r.stderr
    one_row(None)
    with pytest.raises(GptconvError, match=r"^GPTCONV_ONE_ROW_PRODUCT='fastest': expected blas \(the default\) or blocks$"):
        linear_module.one_row_product()
    with pytest.raises(GptconvError, match="GPTCONV_ONE_ROW_PRODUCT"):  # the first forward reads it, prompt or not
        Linear(4, 4)(torch.randn(3, 4))
    with pytest.raises(GptconvError, match=r"'gemv': expected blas \(the default\) or blocks"):
        one_row("gemv")
    monkeypatch.setenv("GPTCONV_ONE_ROW_PRODUCT", "")  # set but empty: the default
    assert linear_module.one_row_product() == "blas"


@pytest.fixture
def blocks_on_two_threads(one_row):
    """The block product in force, on 2 threads (it needs at least 2); the old count afterwards."""
    one_row("blocks")
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def test_the_block_views_are_made_once_per_weight_and_thread_count(monkeypatch, one_row, blocks_on_two_threads):
    made = []
    real = linear_module._blocks
    monkeypatch.setattr(linear_module, "_blocks", lambda weight, x: made.append(weight.shape) or real(weight, x))
    m = Linear(48, 64, bias=False)
    x = torch.randn(1, 48)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(m(x), F.linear(x, m.weight))
        assert len(made) == 1 and m.__dict__["_made_for"][1] is not None  # the block product, made once
        m(torch.randn(5, 48))  # a prompt: F.linear, nothing made
        assert len(made) == 1
        torch.set_num_threads(3)
        m(x)
        assert len(made) == 2
        one_row("blas")
        m(x)
        assert len(made) == 2


def test_no_timing_in_the_models():
    """The product is a setting, never a measurement: no model code (models/, layers/, families/) reads a clock."""
    import pathlib
    import gptconv
    root = pathlib.Path(gptconv.__file__).parent
    for path in [p for folder in ("models", "layers", "families") for p in (root / folder).glob("*.py")]:
        text = path.read_text()
        for clock in ("perf_counter", "time.time", "monotonic", "process_time", "import time"):
            assert clock not in text, f"{path.name}: {clock}"


def test_block_views_follow_the_weight_they_were_made_of(blocks_on_two_threads):
    """Views made for one weight are remade when its memory changes (``.data =``, ``.to()``)."""
    m = Linear(48, 64, bias=False)
    x = torch.randn(1, 48)
    with torch.no_grad():
        m(x)
        m.weight.data = torch.zeros(64, 48)
        assert m(x).abs().max().item() == 0.0
        m.to(torch.float64)
        torch.testing.assert_close(m(x.double()), F.linear(x.double(), m.weight))


def test_kv_cache_refuses_a_layer_out_of_order():
    """A layer that skipped the cache would leave it behind without a word: the next layer is refused."""
    import gptconv
    cache = gptconv.KVCache(n_layers=2, batch=1, n_kv_heads=1, max_len=8, head_dim=2)
    k = torch.ones(1, 1, 1, 2)
    cache.update(0, k, k)
    cache.update(1, k, k)
    assert cache.pos == 1
    cache.update(0, k, k)
    with pytest.raises(ValueError, match="layer 0 stored where layer 1 was expected"):
        cache.update(0, k, k)


@pytest.mark.parametrize("dtype,layout", [(torch.float32, "out-in"), (torch.float32, "in-out view"),
                                          (torch.bfloat16, "out-in"), (torch.bfloat16, "in-out view"),
                                          (torch.float16, "out-in")])
@pytest.mark.parametrize("out_features,in_features", [(7, 5), (33, 64), (2304, 768), (768, 3072), (1000, 576)])
def test_blas_one_row_is_f_linear_bit_for_bit(dtype, layout, out_features, in_features, one_row):
    """The default one-row product calls the gemv directly where that is exact (float32; bfloat16 with
    an (out, in) weight) and F.linear elsewhere: either way F.linear's result, bit for bit."""
    one_row("blas")
    g = torch.Generator().manual_seed(out_features + in_features)
    w = torch.randn(out_features, in_features, generator=g).to(dtype)
    if layout == "in-out view":
        w = w.t().contiguous().t()
    b = torch.randn(out_features, generator=g).to(dtype)
    m = Linear(in_features, out_features, dtype=dtype)
    with torch.no_grad():
        m.weight = torch.nn.Parameter(w, requires_grad=False)
        m.bias.copy_(b)
        for _ in range(3):
            x = torch.randn(1, 1, in_features, generator=g).to(dtype)
            for bias in (None, b):
                assert torch.equal(linear(x, w, bias), F.linear(x, w, bias))
            assert torch.equal(m(x), F.linear(x, w, b))
            assert torch.equal(m(x[0, 0]), F.linear(x[0, 0], w, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_and_degenerate_rows_are_f_linear_too(dtype, one_row):
    """Rows the gemv would round differently from F.linear (a strided row, a transposed size-1
    dimension, a single input or output) take F.linear: the default product stays F.linear's result."""
    one_row("blas")
    g = torch.Generator().manual_seed(3)
    rows = [torch.randn(1, 1, 64, generator=g)[..., ::2], torch.randn(1, 32, 1, generator=g).transpose(1, 2),
            torch.randn(1, generator=g).expand(1, 32), torch.randn(1, 1, 64, generator=g)[..., 32:]]
    for x in rows:
        x = x.to(dtype)
        for w in (torch.randn(7, 32, generator=g), torch.randn(32, 7, generator=g).t()):
            w = w.to(dtype)
            for bias in (None, torch.randn(7, generator=g).to(dtype)):
                assert torch.equal(linear(x, w, bias), F.linear(x, w, bias))
    for w, x in ((torch.randn(5, 1, generator=g), torch.randn(1, 1, generator=g)),
                 (torch.randn(1, 16, generator=g), torch.randn(1, 16, generator=g))):
        b = torch.randn(w.size(0), generator=g).to(dtype)
        assert torch.equal(linear(x.to(dtype), w.to(dtype), b), F.linear(x.to(dtype), w.to(dtype), b))


def test_blocks_product_gives_gradients_after_a_no_grad_use(one_row):
    """The block views are made once; made under no_grad they carry no gradient, so a forward that
    needs one takes F.linear."""
    one_row("blocks")
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        m = Linear(48, 64)
        x = torch.randn(1, 48)
        with torch.no_grad():
            m(x)
        m(x).sum().backward()
        assert m.weight.grad is not None and m.weight.grad.abs().sum() > 0
    finally:
        torch.set_num_threads(old)
