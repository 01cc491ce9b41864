"""The one-row (decode) path of our Linear: the same products as F.linear, whatever the weight's layout."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from gptconv.models import linear as linear_module
from gptconv.models.linear import Linear, linear


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("out_features,in_features", [(64, 48), (67, 48), (5, 48), (48, 50)])
@pytest.mark.parametrize("layout", ["out-in", "in-out view"])
@pytest.mark.parametrize("blocks", [True, False], ids=["blocks", "gemv"])
def test_single_row_equals_f_linear(threads, out_features, in_features, layout, blocks, monkeypatch):
    # both products, whichever this machine's timing would pick
    monkeypatch.setattr(linear_module, "_blocks_are_faster", lambda weight, product: blocks)
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
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            module = Linear(in_features, out_features, bias=bias is not None)
            with torch.no_grad():
                module.weight = torch.nn.Parameter(w, requires_grad=False)
                if bias is not None:
                    module.bias.copy_(bias)
                torch.testing.assert_close(module(x), want, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(module(x[0, 0]), want[0, 0], rtol=1e-5, atol=1e-5)
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
    code = ("import sys, gptconv; from gptconv.models import build_empty, GPT2_PRESETS; "
            "m = build_empty(GPT2_PRESETS['gpt2']); assert next(m.parameters()).is_meta; "
            "print('torch._dynamo' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_the_choice_is_timed_once_per_shape_and_kept(monkeypatch):
    monkeypatch.setattr(linear_module, "_BLOCKS_FASTER", {})
    timed = []
    real = linear_module._seconds
    monkeypatch.setattr(linear_module, "_seconds", lambda run, repeat=3: timed.append(run) or real(run, repeat))
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        w, x = torch.randn(64, 48), torch.randn(1, 48)
        for _ in range(3):
            torch.testing.assert_close(linear(x, w), F.linear(x, w))
        assert len(timed) == 2 and list(linear_module._BLOCKS_FASTER) == [((64, 48), (48, 1), torch.float32, 2)]
        linear(x, torch.randn(32, 48))  # another shape is timed on its own
        assert len(timed) == 4
    finally:
        torch.set_num_threads(old)
