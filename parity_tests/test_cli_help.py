"""The command line as a new user meets it: --version, help with examples and exit statuses, the
aliases, one set of dtype names (with the long ones as synonyms), --revision wherever a SOURCE is."""

from __future__ import annotations

import hashlib
import json

import click
import pytest

from gptconv.cli.main import cli
from gptconv.sources.hub import aliases
from helpers import run_cli


def test_version_names_gptconv_torch_and_the_references():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("gptconv 0.1.0 (torch 2.13.0") and "transformers" in r.stdout


def test_help_gives_exit_statuses_and_every_command_an_example():
    r = run_cli("--help")
    assert r.returncode == 0 and "Exit status: 0 done; 1 a parity check failed" in r.stdout and "gptconv aliases" in r.stdout
    for name in cli.commands:
        r = run_cli(name, "--help")
        assert r.returncode == 0 and "Examples:" in r.stdout and f"gptconv {name}" in r.stdout, name


def test_aliases_are_listed():
    r = run_cli("aliases")
    assert r.returncode == 0 and "gpt2" in r.stdout and "openai-community/gpt2" in r.stdout
    assert json.loads(run_cli("aliases", "--json").stdout) == aliases()


def test_every_command_that_takes_a_source_takes_a_revision():
    for name, command in cli.commands.items():
        params = {p.name for p in command.params}
        if "source" in params:
            assert "revision" in params, name


def test_one_set_of_dtype_names_with_the_long_ones_as_synonyms(ckpts, tmp_path):
    tiny = ckpts["tiny"]
    short, long = run_cli("trace", tiny, "--ids", "1,2,3", "--dtype", "bf16"), run_cli("trace", tiny, "--ids", "1,2,3",
                                                                                         "--dtype", "bfloat16")
    assert short.returncode == 0 and short.stdout == long.stdout
    assert short.stdout != run_cli("trace", tiny, "--ids", "1,2,3").stdout  # bf16 was used
    digests = []
    for name in ("f16", "float16", "FP16"):
        (tmp_path / name).mkdir()
        out = tmp_path / name / "m.gguf"  # the same file name: GGUF's general.name is its stem
        r = run_cli("export", tiny, "--format", "gguf", "--dtype", name, "-o", out)
        assert r.returncode == 0, r.stderr
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert len(set(digests)) == 1
    from gptconv.writers import export
    (tmp_path / "api").mkdir()
    api = export(str(tiny), tmp_path / "api" / "m.gguf", "gguf", "float16").out  # the library takes them too
    assert hashlib.sha256(api.read_bytes()).hexdigest() == digests[0]
    r = run_cli("trace", tiny, "--ids", "1", "--dtype", "q4_k_m")  # a storage type, not a compute dtype
    assert r.returncode == 2 and "choose f32, bf16, f16" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["trace", "generate"])
def test_revision_reaches_the_hub_for_trace_and_generate(command):
    r = run_cli(command, "gpt2", "x", "--revision", "v2", env={"HF_HUB_OFFLINE": "1", "HF_HOME": "/nonexistent"})
    assert r.returncode == 2 and "openai-community/gpt2@v2: HF_HUB_OFFLINE is set" in r.stderr, r.stderr


def test_click_sees_the_dtype_type():
    from gptconv.cli.main import DType
    assert DType(["f32"], long=True).convert("FLOAT32", None, None) == "float32"
    with pytest.raises(click.BadParameter):
        DType(["f32"]).convert("f64", None, None)


def _sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_json_has_one_shape_and_no_progress(ckpts, tmp_path):
    from pathlib import Path
    tiny = ckpts["tiny"]
    text = Path(__file__).parent / "data" / "alice-chapter-1.txt"
    gguf = tmp_path / "t.gguf"
    runs = {"verify": run_cli("verify", tiny, "--json", "--length", "16"),
            "export": run_cli("export", tiny, "--format", "gguf", "-o", gguf, "--json"),
            "inspect": run_cli("inspect", gguf, "--json"),
            "perplexity": run_cli("perplexity", tiny, text, "--ctx", "32", "--json"),
            "pull": run_cli("pull", tiny, "--json")}
    for command, r in runs.items():
        assert r.returncode == 0 and r.stderr == "", (command, r.stderr)
        out = json.loads(r.stdout)
        assert list(out) == ["command", "versions", "source", "seconds", "result"] and out["command"] == command
        assert out["versions"]["gptconv"] == "0.1.0" and out["versions"]["torch"].startswith("2.13")
        assert out["seconds"] > 0 and isinstance(out["result"], dict)
        source = out["source"]
        assert source["repo"] is None and source["commit"] is None  # local sources
        where = Path(source["path"])
        for f in source["files"]:
            file = where / f["name"] if where.is_dir() else where
            assert f["bytes"] == file.stat().st_size and f["sha256"] == _sha256(file), (command, f)
    assert json.loads(runs["verify"].stdout)["result"]["passed"] is True


def _on_a_terminal(*args) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal (stdout a pipe); return its exit status and stderr."""
    import os
    import pty
    import subprocess
    import sys
    import fcntl
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a width
    p = subprocess.Popen([sys.executable, "-m", "gptconv", *map(str, args)], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    p.communicate(timeout=600)
    os.close(master)
    return p.returncode, seen.decode("utf-8", "replace")


def test_progress_on_a_terminal_only_and_off_with_quiet_or_json(ckpts, tmp_path):
    from pathlib import Path
    tiny = ckpts["tiny"]
    text = Path(__file__).parent / "data" / "alice-chapter-1.txt"
    cases = {"export": (["export", tiny, "--format", "gguf", "-o", tmp_path / "{}.gguf"], "tensors"),
             "verify": (["verify", tiny, "--length", "16"], "verify"),
             "streamed verify": (["verify", tiny, "--length", "16", "--stream"], "verify"),
             "perplexity": (["perplexity", tiny, text, "--ctx", "32"], "windows")}
    # sixteen processes, each spending most of its time starting Python and importing torch: run side by
    # side (each on its own terminal or pipe), then judged one by one as before
    runs = {(name, tuple(extra)): (_on_a_terminal, [str(a).format("-".join([name, *extra])) for a in args] + extra)
            for name, (args, _) in cases.items() for extra in ([], ["--quiet"], ["--json"])}
    runs |= {(name, "pipe"): (run_cli, args if name != "export" else [str(a).format("pipe") for a in args])
             for name, (args, _) in cases.items()}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as pool:
        done = {key: pool.submit(run, *argv) for key, (run, argv) in runs.items()}
        done = {key: future.result() for key, future in done.items()}
    for name, (args, bar) in cases.items():
        for extra, shown in (([], True), (["--quiet"], False), (["--json"], False)):
            code, err = done[name, tuple(extra)]
            assert code == 0, (name, extra, err)
            assert (f"{bar}:" in err) == shown, (name, extra, err)
            assert name != "export" or "windows:" not in err  # no --check, no perplexity windows
            if not shown:
                assert err == "", (name, extra, err)
        r = done[name, "pipe"]
        assert r.returncode == 0 and r.stderr == "", (name, r.stderr)  # stderr not a terminal: no bar


def test_verify_counts_the_steps_it_compares(ckpts):
    """Progress is in steps compared (every model's, on every input, in lockstep), streamed or not."""
    import gptconv
    for blockwise in (True, False):
        seen = []
        report = gptconv.verify(ckpts["tiny"], length=16, blockwise=blockwise,
                                on_input=lambda done, total: seen.append((done, total)))
        assert report.passed
        total = len(report.steps)  # the embedding's dropout, each block, the final norm, the logits
        assert total == gptconv.open_source(ckpts["tiny"]).config.n_layers + 3
        assert seen == [(k, total) for k in range(1, total + 1)]


def test_json_source_lists_what_a_load_reads_and_trusts_no_file_name(ckpts, tmp_path):
    import shutil
    from gptconv.cli.envelope import described
    folder = tmp_path / "tiny"
    shutil.copytree(ckpts["tiny"], folder)
    (folder / "tf_model.h5").write_bytes(b"\0" * 1000)  # another format, which no load reads
    names = {f["name"] for f in described(folder)["files"]}
    assert "model.safetensors" in names and "config.json" in names and "tf_model.h5" not in names
    from gptconv.writers import export
    gguf = export(str(ckpts["tiny"]), tmp_path / "t.gguf", "gguf", "f32").out
    named = tmp_path / ("a" * 64)  # a name that looks like a content hash, outside the Hub cache
    gguf.rename(named)
    (tmp_path / "model.gguf").symlink_to(named)
    (only,) = described(tmp_path / "model.gguf")["files"]
    assert only["sha256"] == _sha256(named) != "a" * 64
