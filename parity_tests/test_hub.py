"""`pull` through huggingface-hub against a loopback server that answers like the Hub."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import run_cli
from hub_server import FakeHub


@pytest.fixture
def hub(ckpts, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ckpts["tiny"], repo)
    shutil.copy(ckpts["tiny-bin"] / "pytorch_model.bin", repo)  # a second format the pull must not fetch
    (repo / "flax_model.msgpack").write_bytes(b"\0" * 1000)
    with FakeHub() as server:
        server.repos["openai-community/gpt2"] = repo
        server.repos["someone/gated-model"] = repo
        server.gated.add("someone/gated-model")
        server.env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HOME": str(tmp_path / "hf-home")}
        server.env.pop("HF_TOKEN", None)
        server.env.pop("HF_HUB_OFFLINE", None)
        yield server


def test_pull_fetches_only_what_a_load_needs_then_loads_offline(hub):
    r = run_cli("pull", "gpt2", env=hub.env)
    assert r.returncode == 0, r.stderr
    assert "openai-community/gpt2" in r.stdout and "parameters" in r.stdout
    fetched = {p.rsplit("/", 1)[1] for m, p in hub.log if m == "GET" and "/resolve/" in p}
    assert fetched == {"config.json", "generation_config.json", "model.safetensors", "vocab.json",
                       "merges.txt", "tokenizer_config.json"}
    hub.__exit__()  # the Hub is gone: the cache must be enough

    code = ("import gptconv, torch; m = gptconv.load('gpt2'); "
            "print(m(torch.tensor([[1, 2, 3]])).shape, gptconv.load_tokenizer('gpt2').encode('hello'))")
    for extra in ({}, {"HF_HUB_OFFLINE": "1"}):
        out = subprocess.run([sys.executable, "-c", code], env={**hub.env, **extra},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert "torch.Size([1, 3, 512])" in out.stdout


def test_missing_repo_and_revision(hub):
    r = run_cli("pull", "nobody/nothing", env=hub.env)
    assert r.returncode == 2 and "no such model on the Hub" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("pull", "gpt2", "--revision", "v9", env=hub.env)
    assert r.returncode == 2 and "no revision 'v9'" in r.stderr


def test_gated_repo_says_how_to_get_access(hub):
    r = run_cli("pull", "someone/gated-model", env=hub.env)
    assert r.returncode == 2
    assert "gated" in r.stderr and "HF_TOKEN" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_offline_with_nothing_cached(hub):
    r = run_cli("pull", "gpt2", env={**hub.env, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "HF_HUB_OFFLINE is set and the model is not in the cache" in r.stderr


def test_cut_download_fails_cleanly_then_the_next_pull_completes(hub, ckpts):
    """The connection drops part-way through model.safetensors on every try of the first pull.

    huggingface-hub retries within the pull and then gives up; the next pull downloads the file again
    (it does not ask for a byte range: no resume from the partial) and its sha256 matches the source.
    """
    import hashlib
    from pathlib import Path
    size = (ckpts["tiny"] / "model.safetensors").stat().st_size
    hub.cut["model.safetensors"] = [size // 3, 100]
    first = run_cli("pull", "gpt2", env=hub.env)
    assert first.returncode == 2 and "gptconv: error:" in first.stderr and "Traceback" not in first.stderr
    hub.cut.clear()
    assert run_cli("pull", "gpt2", env=hub.env).returncode == 0
    files = list(Path(hub.env["HF_HOME"]).rglob("snapshots/*/model.safetensors"))
    want = hashlib.sha256((ckpts["tiny"] / "model.safetensors").read_bytes()).hexdigest()
    assert len(files) == 1 and hashlib.sha256(files[0].read_bytes()).hexdigest() == want
