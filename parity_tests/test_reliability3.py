"""Issue 25's findings in sampling, perplexity, generate()'s options, --json failures, devices, -n and
Qwen's layer_types: each a test that failed before its fix."""

from __future__ import annotations

import json

import pytest

import gptconv
from gptconv.errors import GptconvError
from helpers import edited_copy, run_cli

TEXT = "The capital of France is Paris. The capital of Italy is Rome. " * 40


@pytest.fixture(scope="module")
def overflowed(ckpts, tmp_path_factory):
    """A fine-tune that overflowed: one MLP weight of GPT-2's is NaN."""
    return edited_copy(ckpts["tiny"], tmp_path_factory.mktemp("nan") / "nan",
                       lambda s: s["transformer.h.0.mlp.c_fc.weight"].__setitem__((3, 5), float("nan")))


@pytest.mark.parametrize("sampling", [["--temperature", "1"], []], ids=["sampled", "greedy"])
def test_generating_from_nan_logits_is_one_line(overflowed, sampling):
    r = run_cli("generate", overflowed, "Hello", "-n", "3", *sampling)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "logits hold NaN" in lines[0] and "internal error" not in lines[0]


def test_perplexity_of_nan_logits_is_one_line(overflowed, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    r = run_cli("perplexity", overflowed, text, "--ctx", "32", "--json")
    assert r.returncode == 2 and "logits hold NaN" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert json.loads(r.stdout)["error"]["exit"] == 2  # and --json says so on stdout


@pytest.mark.parametrize("options,flag", [
    (dict(temperature=float("nan")), "--temperature"), (dict(temperature=-1.0), "--temperature"),
    (dict(top_k=0), "--top-k"), (dict(seed=2**64), "--seed"), (dict(seed=-1), "--seed"),
    (dict(max_new_tokens=2.5), "--max-new-tokens"), (dict(max_new_tokens=-1), "--max-new-tokens"),
    (dict(max_new_tokens=0), "--max-new-tokens"), (dict(top_p=0.0), "--top-p"), (dict(top_k=True), "--top-k")])
def test_generate_checks_its_options_as_the_command_line_does(ckpts, options, flag):
    kwargs = dict(max_new_tokens=3) | options
    with pytest.raises(GptconvError, match=flag):
        gptconv.generate(str(ckpts["tiny"]), "Hello", **kwargs)


def test_every_json_failure_is_json(tmp_path):
    for args in (["verify", tmp_path / "missing", "--json"], ["inspect", tmp_path / "missing.gguf", "--json"],
                 ["export", tmp_path / "missing", "--format", "gguf", "-o", tmp_path / "o.gguf", "--json"]):
        r = run_cli(*args)
        assert r.returncode == 2
        out = json.loads(r.stdout)
        assert out["command"] == args[0] and out["error"]["kind"] == "input" and out["error"]["exit"] == 2
        assert out["error"]["message"] in r.stderr


def test_a_second_cpu_is_refused(ckpts):
    r = run_cli("trace", ckpts["tiny"], "--ids", "1,2", "--device", "cpu:1")
    assert r.returncode == 2 and "--device cpu:1" in r.stderr


def test_generating_past_the_context_says_so(ckpts):
    r = run_cli("generate", ckpts["odd"], "Hello", "-n", "100")  # the fixture has 37 positions
    assert r.returncode == 0, r.stderr
    assert "stopped after" in r.stderr and "context holds 37 positions" in r.stderr


@pytest.mark.parametrize("types,said", [
    (["full_attention"], "one kind per layer"), (["full_attention", "global"], "'global' is not"),
    (["sliding_attention", "full_attention"], "use_sliding_window is false")])
def test_qwen_layer_types_are_checked(llamas, tmp_path, types, said):
    import shutil
    folder = tmp_path / "qwen2"
    shutil.copytree(llamas["qwen2"], folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(layer_types=types, use_sliding_window=False)
    (folder / "config.json").write_text(json.dumps(config))
    for command in (["trace", folder, "--ids", "1,2"], ["export", folder, "--format", "gguf", "-o", tmp_path / "o.gguf"]):
        r = run_cli(*command)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_gemma3_with_no_layers_says_so(tmp_path):
    from fixtures import make_gemma3
    folder = make_gemma3(tmp_path / "g")
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    r = run_cli("trace", folder, "--ids", "1,2")
    assert r.returncode == 2 and "'num_hidden_layers' is 0; it must be at least 1" in r.stderr, r.stderr
