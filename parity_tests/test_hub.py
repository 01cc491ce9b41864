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


@pytest.mark.parametrize("token", [None, "hf_not_granted"])  # the Hub answers 401 without a token, 403 with one
def test_gated_repo_says_how_to_get_access(hub, token):
    env = {**hub.env, **({"HF_TOKEN": token} if token else {})}
    r = run_cli("pull", "someone/gated-model", env=env)
    assert r.returncode == 2
    assert "gated" in r.stderr and "HF_TOKEN" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    if token:  # not "set HF_TOKEN": it is set, and its account lacks access
        assert "the token in use (HF_TOKEN) has no access" in r.stderr and "then set HF_TOKEN" not in r.stderr
    else:
        assert "then set HF_TOKEN" in r.stderr


def test_offline_with_nothing_cached(hub):
    r = run_cli("pull", "gpt2", env={**hub.env, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "HF_HUB_OFFLINE is set and the model is not in the cache" in r.stderr


def test_cut_download_resumes_on_the_next_pull(tmp_path):
    """The connection drops part-way through the weights and stays down for the rest of the first pull.

    The first pull fails with one line and keeps what it received (whole 10 MiB chunks of
    huggingface-hub's http_get); the next pull asks for the rest with a Range request, and the
    file in the cache has the source's sha256.
    """
    import hashlib
    from pathlib import Path

    from fixtures import make_gpt2
    from huggingface_hub import constants
    repo = make_gpt2(tmp_path / "wide", "wide-vocab")
    data = (repo / "model.safetensors").read_bytes()
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    assert len(data) > chunk + 1_000_000
    with FakeHub() as hub:
        hub.repos["openai-community/gpt2"] = repo
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
        env.pop("HF_HUB_OFFLINE", None)
        hub.cut["model.safetensors"] = [chunk + 1_000_000] + [0] * 10  # then every retry is cut at once
        first = run_cli("pull", "gpt2", env=env)
        assert first.returncode == 2 and "Traceback" not in first.stderr
        assert f"cut off at {chunk:,} of {len(data):,} bytes" in first.stderr and "pull again to resume" in first.stderr
        assert len(first.stderr.strip().splitlines()) == 1
        partial = list(Path(env["HF_HOME"]).rglob("*.gptconv-partial"))
        assert len(partial) == 1 and partial[0].stat().st_size == chunk

        hub.cut.clear()
        hub.log.clear()
        second = run_cli("pull", "gpt2", env=env)
        assert second.returncode == 0, second.stderr
        assert ("RANGE", f"model.safetensors@{chunk}") in hub.log  # asked for the rest, not the whole file
        assert not any(e == ("RANGE", "model.safetensors@0") for e in hub.log)
        files = list(Path(env["HF_HOME"]).rglob("snapshots/*/model.safetensors"))
        assert len(files) == 1 and hashlib.sha256(files[0].read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
        assert list(Path(env["HF_HOME"]).rglob("*.gptconv-partial")) == []


def test_corrupt_resumed_download_is_caught_by_its_sha256(tmp_path):
    """A partial file whose bytes are not the file's (a disk error, another tool) fails the sha256 check."""
    from pathlib import Path

    from fixtures import make_gpt2
    from huggingface_hub import constants
    repo = make_gpt2(tmp_path / "wide", "wide-vocab")
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    with FakeHub() as hub:
        hub.repos["openai-community/gpt2"] = repo
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")}
        env.pop("HF_HUB_OFFLINE", None)
        hub.cut["model.safetensors"] = [chunk + 1000] + [0] * 10
        assert run_cli("pull", "gpt2", env=env).returncode == 2
        partial = next(Path(env["HF_HOME"]).rglob("*.gptconv-partial"))
        with open(partial, "r+b") as f:
            f.seek(12345)
            f.write(b"\xff" * 16)
        hub.cut.clear()
        r = run_cli("pull", "gpt2", env=env)
        assert r.returncode == 2 and "do not match the Hub's sha256" in r.stderr and "pull again" in r.stderr
        assert not partial.exists()
        assert run_cli("pull", "gpt2", env=env).returncode == 0


def test_pull_uses_the_cache_when_the_hub_cannot_be_reached(hub):
    assert run_cli("pull", "gpt2", env=hub.env).returncode == 0
    hub.__exit__()  # unreachable, without HF_HUB_OFFLINE: huggingface-hub would use the cache, and so do we
    r = run_cli("pull", "gpt2", env=hub.env)
    assert r.returncode == 0, r.stderr
    assert "parameters" in r.stdout
    assert len(r.stderr.strip().splitlines()) == 1
    assert "cannot be reached" in r.stderr and "using the snapshot in the cache" in r.stderr


CHAT = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"


def test_chat_template_jinja_is_fetched_used_and_kept(hub, tmp_path):
    """transformers 5 saves the chat template as chat_template.jinja, beside tokenizer_config.json."""
    from gguf import GGUFReader
    (hub.repos["openai-community/gpt2"] / "chat_template.jinja").write_text(CHAT)
    assert run_cli("pull", "gpt2", env=hub.env).returncode == 0
    fetched = {p.rsplit("/", 1)[1] for m, p in hub.log if m == "GET" and "/resolve/" in p}
    assert "chat_template.jinja" in fetched
    r = run_cli("generate", "gpt2", "hi", "--chat", "-n", "2", env=hub.env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<|user|>hi\n<|assistant|>")
    hf, gguf = tmp_path / "hf", tmp_path / "model.gguf"
    assert run_cli("export", "gpt2", "--format", "safetensors", "-o", hf, env=hub.env).returncode == 0
    assert (hf / "chat_template.jinja").read_text() == CHAT
    assert run_cli("export", "gpt2", "--format", "gguf", "-o", gguf, env=hub.env).returncode == 0
    assert GGUFReader(gguf).fields["tokenizer.chat_template"].contents() == CHAT


def _files_under(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink())


@pytest.mark.parametrize("name, answers", [
    ("config.json", ["../../../../escaped"]),            # a side file, on the first answer
    ("model.safetensors", ["../../../../escaped"]),      # the weights
    ("merges.txt", [None, "../../../../escaped"]),       # honest to our check, hostile to huggingface-hub's
])
def test_a_hostile_etag_cannot_choose_where_files_are_written(hub, tmp_path, name, answers):
    hub.etags[name] = list(answers)
    r = run_cli("pull", "gpt2", env=hub.env)
    one_line = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(one_line) == 1, r.stderr
    assert name in one_line[0] and "not a content hash" in one_line[0], one_line
    assert not list(tmp_path.rglob("escaped*")), "a file was written where the Hub said"
    if answers[0] is not None:  # refused before anything was written
        assert not any("blobs" in f or "snapshots" in f for f in _files_under(tmp_path / "hf-home")), \
            _files_under(tmp_path / "hf-home")


def test_a_hostile_commit_cannot_name_the_snapshot_folder(hub, tmp_path):
    hub.sha = "../../../../escaped"
    r = run_cli("pull", "gpt2", env=hub.env)
    assert r.returncode == 2 and "not a content hash" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("escaped*"))
    assert not any("blobs" in f or "snapshots" in f for f in _files_under(tmp_path / "hf-home"))


@pytest.mark.parametrize("args", [["a/.."], ["a/b--c"], ["./x"], ["gpt2", "--revision", "../../x"]])
def test_repo_ids_and_revisions_that_are_not_names(hub, args):
    r = run_cli("pull", *args, env=hub.env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "unexpected" not in r.stderr and "internal error" not in r.stderr, r.stderr


def test_pull_json_names_repo_commit_and_each_files_sha256(hub):
    import hashlib
    import json
    from pathlib import Path
    from hub_server import COMMIT
    r = run_cli("pull", "gpt2", "--json", env=hub.env)
    assert r.returncode == 0, r.stderr
    source = json.loads(r.stdout)["source"]
    assert source["repo"] == "openai-community/gpt2" and source["commit"] == COMMIT and source["name"] == "gpt2"
    names = {f["name"] for f in source["files"]}
    assert {"config.json", "model.safetensors"} <= names and "flax_model.msgpack" not in names
    for f in source["files"]:
        data = (Path(source["path"]) / f["name"]).read_bytes()
        assert f["sha256"] == hashlib.sha256(data).hexdigest() and f["bytes"] == len(data)
