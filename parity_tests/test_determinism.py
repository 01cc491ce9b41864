"""The same input gives bit-identical logits in every process: nothing in the model is chosen by timing.

The one-token product (gptconv/layers/linear.py) is a setting, GPTCONV_ONE_ROW_PRODUCT; with either
value, a greedy decode in two fresh processes, and twice in one process, gives the same bits at
every step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from gptconv.parity.compare import SAME_MODEL

from helpers import run_cli

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
NEW_TOKENS = 8
THREADS = 2  # the block product needs two threads or more

# A greedy decode as gptconv's generation runs it (prefill, then T = 1 against the KV cache), kept
# here rather than imported so that it keeps each step's logits.
DECODE = """
import hashlib, json, sys
import torch
import gptconv
from gptconv.models import KVCache
from gptconv.layers import linear

torch.set_num_threads(int(sys.argv[2]))
model = gptconv.load(sys.argv[1])
prompt, new_tokens = json.loads(sys.argv[3]), int(sys.argv[4])
runs = []
with torch.no_grad():
    for _ in range(2):  # twice in this process
        cache = KVCache.for_model(model, batch=1, max_len=len(prompt) + new_tokens, reserve=len(prompt) + 4)
        ids, tokens, steps = torch.tensor([prompt]), [], []
        for _ in range(new_tokens):
            logits = model(ids, cache=cache, last_only=True)[:, -1]  # (1, V)
            steps.append(logits.clone())
            ids = logits.argmax(dim=-1)[:, None]
            tokens.append(int(ids))
        runs.append({"tokens": tokens, "sha256": [hashlib.sha256(s.float().numpy().tobytes()).hexdigest() for s in steps]})
torch.save(torch.cat(steps), sys.argv[5])
blocks_made = [m.__dict__["_made_for"][1] is not None for m in model.modules() if "_made_for" in m.__dict__]
print(json.dumps({"product": linear.one_row_product(), "blocks_used": any(blocks_made), "runs": runs}))
"""


def decode(path, product: str, out) -> dict:
    env = dict(os.environ, GPTCONV_ONE_ROW_PRODUCT=product)
    r = subprocess.run([sys.executable, "-c", DECODE, str(path), str(THREADS), json.dumps(PROMPT), str(NEW_TOKENS), str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(params=["gpt2-tiny", "llama3-gqa"])
def checkpoint(request):
    if request.param == "gpt2-tiny":
        return request.getfixturevalue("ckpts")["tiny"]
    return request.getfixturevalue("llamas")[request.param]


@pytest.mark.parametrize("product", ["blas", "blocks"])
def test_decode_logits_are_bit_identical_across_processes(checkpoint, product, tmp_path):
    first, second = (decode(checkpoint, product, tmp_path / f"{n}.pt") for n in (1, 2))
    for result in (first, second):
        assert result["product"] == product
        assert result["blocks_used"] == (product == "blocks")  # the setting is the product that ran
        assert len(result["runs"][0]["sha256"]) == NEW_TOKENS  # one prefill and NEW_TOKENS - 1 one-token steps
        assert result["runs"][0] == result["runs"][1]  # twice in one process
    assert first["runs"][0] == second["runs"][0]  # and in two processes: every step's logits, bit for bit
    a, b = torch.load(tmp_path / "1.pt"), torch.load(tmp_path / "2.pt")
    assert a.shape[0] == NEW_TOKENS and torch.equal(a, b)


def test_both_products_give_the_same_decode_up_to_rounding(checkpoint, tmp_path):
    blas, blocks = (decode(checkpoint, product, tmp_path / f"{product}.pt") for product in ("blas", "blocks"))
    assert blas["runs"][0]["tokens"] == blocks["runs"][0]["tokens"]
    torch.testing.assert_close(torch.load(tmp_path / "blocks.pt"), torch.load(tmp_path / "blas.pt"), rtol=SAME_MODEL.rtol, atol=SAME_MODEL.atol)


def test_a_bad_product_setting_is_one_line_exit_2(ckpts):
    r = run_cli("generate", ckpts["tiny"], "hi", "-n", "2", env=dict(os.environ, GPTCONV_ONE_ROW_PRODUCT="fastest"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("gptconv: error: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert "GPTCONV_ONE_ROW_PRODUCT" in r.stderr and "blas" in r.stderr and "blocks" in r.stderr
    assert "fastest" in r.stderr
