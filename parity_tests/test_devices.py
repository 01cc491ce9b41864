"""--device: where models run. Here, checks of the choice itself and of the CPU path; on a machine with
CUDA, verify, generate and a padded batch there (skipped cleanly without it; scripts/device-check.sh is
the longer check for such a machine)."""

from __future__ import annotations

import pytest
import torch

import gptconv
from gptconv.devices import parse_device
from helpers import random_ids, run_cli

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def test_choices():
    assert parse_device("cpu") == torch.device("cpu")
    assert parse_device("auto").type == ("cuda" if torch.cuda.is_available() else
                                         "mps" if torch.backends.mps.is_available() else "cpu")
    for bad in ("tpu", "cuda:x", ""):
        with pytest.raises(gptconv.GptconvError, match="choose cpu, cuda, cuda:N, mps or auto"):
            parse_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", [["trace", "--ids", "1,2"], ["generate", "x"], ["verify"]])
def test_a_device_torch_cannot_use_is_one_line_before_any_work(ckpts, command):
    name, *rest = command
    r = run_cli(name, ckpts["tiny"], *rest, "--device", "cuda")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"gptconv: error: --device cuda: torch sees no CUDA device here (torch {torch.__version__})")


def test_cpu_and_auto_give_the_same_model(ckpts):
    ids = random_ids(512, 16, batch=1)
    with torch.no_grad():
        a = gptconv.load(ckpts["tiny"])(ids)
        b = gptconv.load(ckpts["tiny"], device="cpu")(ids)
    assert torch.equal(a, b)
    r = run_cli("verify", ckpts["tiny"], "--device", "auto", "--length", "32")
    assert r.returncode == 0, r.stdout + r.stderr


@CUDA
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_verify_on_cuda(llamas, dtype):
    report = gptconv.verify(llamas["llama3-gqa"], dtype=dtype, device="cuda")
    assert report.passed, (report.first_divergent_step, report.notes)


@CUDA
def test_generate_and_a_padded_batch_on_cuda(llamas):
    folder = llamas["llama3-gqa"]
    on_cpu = gptconv.generate(folder, "Alice", 16)
    on_gpu = gptconv.generate(folder, "Alice", 16, device="cuda")
    assert on_gpu.ids == on_cpu.ids
    model = gptconv.load(folder, device="cuda")
    assert next(model.parameters()).device.type == "cuda"
    ids = random_ids(model.config.vocab_size, 12, batch=2).cuda()
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        alone = model(ids[1:, 5:])[0]
        assert (model(ids, attention_mask=mask)[1, 5:] - alone).abs().max() <= 1e-4
