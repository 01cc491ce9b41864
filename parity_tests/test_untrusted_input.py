"""Hostile inputs, second round: each ends in gptconv's promise or the test fails.

The promise: one line on stderr ("gptconv: error: …" naming the file and the problem), exit status 2,
no traceback and no "internal error" (status 3, a bug), no hang, bounded memory, nothing written where
it does not belong, nothing replaced without --force. Every CLI run here is a subprocess under an
address-space limit and a timeout (untrusted_files.bounded_cli), so a regression fails the test
instead of taking the machine down or hanging CI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import torch

from untrusted_files import (array_count_position, bounded_cli, bounded_popen, patch_u64, shorten_zip_record,
                                  write_gguf_with_vocab)

MiB = 1 << 20


def promise(r, *needles: str) -> str:
    """Exit 2, exactly one stderr line "gptconv: error: …" holding every needle, no sign of a bug."""
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gptconv: error: "), r.stderr[-4000:]
    for bad in ("internal error", "unexpected", "Traceback", "panicked"):
        assert bad not in lines[0], lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def tiny(ckpts, tmp_path) -> Path:
    """A fresh copy of the tiny GPT-2 folder, to spoil, with a tokenizer.json beside vocab.json and
    merges.txt as a real GPT-2 folder has (the fixture itself has none)."""
    from tokenizers import ByteLevelBPETokenizer
    d = tmp_path / "tiny"
    shutil.copytree(ckpts["tiny"], d)
    ByteLevelBPETokenizer(str(d / "vocab.json"), str(d / "merges.txt")).save(str(d / "tokenizer.json"))
    return d


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name)


# --- 1. Unbounded reads: a side file linked to /dev/zero is refused before it is read; so is one too large.

GENERATE, EXPORT_GGUF = ("generate", "hi", "-n", "1"), ("export", "--format", "gguf", "-o", "OUT")


@pytest.mark.parametrize("name,command", [
    ("config.json", ("pull",)), ("config.json", ("inspect",)), ("config.json", GENERATE),
    ("tokenizer_config.json", GENERATE), ("tokenizer_config.json", EXPORT_GGUF),
    ("tokenizer.json", GENERATE), ("tokenizer.json", EXPORT_GGUF),
    ("vocab.json", GENERATE),  # read only when there is no tokenizer.json
], ids=lambda v: v if isinstance(v, str) else v[0] + ("-gguf" if "gguf" in v else ""))
def test_side_file_linked_to_dev_zero(tiny, tmp_path, name, command):
    if name == "vocab.json":
        (tiny / "tokenizer.json").unlink()
    (tiny / name).unlink()
    (tiny / name).symlink_to("/dev/zero")
    verb, *rest = (str(tmp_path / "out.gguf") if a == "OUT" else a for a in command)
    promise(bounded_cli(verb, tiny, *rest), f"{tiny / name}:", "not a regular file")
    assert not (tmp_path / "out.gguf").exists()


def test_shard_index_linked_to_dev_zero(ckpts, tmp_path):
    d = tmp_path / "sharded"
    shutil.copytree(ckpts["tiny-sharded"], d)
    (d / "model.safetensors.index.json").unlink()
    (d / "model.safetensors.index.json").symlink_to("/dev/zero")
    for command in ("pull", "inspect"):
        promise(bounded_cli(command, d), "model.safetensors.index.json", "not a regular file")


def test_sparse_config_larger_than_any_json(tiny):
    cfg = tiny / "config.json"
    os.truncate(cfg, 65 * MiB)  # the JSON, then 65 MiB of holes: costs no disk
    for command in ("pull", "inspect"):
        promise(bounded_cli(command, tiny), "config.json", "more than")


# --- 2. GGUF array counts: an array that claims 2^40 items is refused at once, not walked.

@pytest.mark.parametrize("key", ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"])
def test_gguf_array_count_in_the_trillions(tmp_path, key):
    f = write_gguf_with_vocab(tmp_path / "v.gguf")
    assert bounded_cli("pull", f).returncode == 0  # the file was valid before the patch
    assert patch_u64(f, array_count_position(f, key), 2**40) == 100
    for command in ("inspect", "pull"):
        start = time.monotonic()
        promise(bounded_cli(command, f, timeout=60), "v.gguf")
        assert time.monotonic() - start < 30


# --- 3. FIFOs: never opened, so never a read that blocks for ever.

@pytest.mark.parametrize("name,command", [("config.json", "pull"), ("model.safetensors", "pull"),
                                          ("model.safetensors", "inspect"), ("tokenizer.json", "generate")])
def test_fifo_in_a_folder(tiny, name, command):
    (tiny / name).unlink()
    os.mkfifo(tiny / name)
    extra = ("hi", "-n", "1") if command == "generate" else ()
    promise(bounded_cli(command, tiny, *extra, timeout=60), name, "FIFO")


def test_gguf_that_is_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "x.gguf")
    promise(bounded_cli("inspect", tmp_path / "x.gguf", timeout=60), "x.gguf", "FIFO")
    promise(bounded_cli("pull", tmp_path / "x.gguf", timeout=60), "x.gguf", "FIFO")


def test_hf_export_refuses_a_tokenizer_file_that_is_a_fifo(tiny, tmp_path):
    """The export copies the folder's tokenizer files as they are: one that is not a regular file is
    named, not skipped (the export used to succeed without it)."""
    (tiny / "merges.txt").unlink()
    os.mkfifo(tiny / "merges.txt")
    promise(bounded_cli("export", tiny, "--format", "safetensors", "-o", tmp_path / "out", timeout=60),
            "merges.txt", "FIFO")
    assert not (tmp_path / "out").exists() and partials(tmp_path) == []


# --- 4. Chat templates: a template that loops or allocates without end is stopped and named.

@pytest.mark.parametrize("template,needle,seconds", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "did not finish", 30),
    ("{{ 'x' * 2000000000 }}", "needs more than", 60),
])
def test_chat_template_that_never_ends(tiny, template, needle, seconds):
    edit_json(tiny / "tokenizer_config.json", chat_template=template)
    start = time.monotonic()
    promise(bounded_cli("generate", tiny, "hi", "--chat", "-n", "1"), "chat template", needle)
    assert time.monotonic() - start < seconds


# --- 5. Tokenizer panic: a backtracking Split regex makes the Rust library panic; one line, no panic text.

PANIC_REGEX, PANIC_TEXT = r"(a|a)*[^a]", "a" * 32  # Oniguruma: "retry-limit-in-match over" → Rust panic


def test_tokenizer_regex_that_panics(tiny):
    from tokenizers import Tokenizer
    spec = json.loads((tiny / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": PANIC_REGEX}, "behavior": "Isolated", "invert": False},
        spec["pre_tokenizer"]]}
    (tiny / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(BaseException) as panic:  # the library itself panics on this text (the premise)
        Tokenizer.from_file(str(tiny / "tokenizer.json")).encode(PANIC_TEXT)
    assert type(panic.value).__name__ == "PanicException"
    env = {**os.environ, "RUST_BACKTRACE": "1"}  # a full Rust backtrace would go to stderr too
    r = bounded_cli("generate", tiny, PANIC_TEXT, "-n", "1", env=env)
    promise(r, "tokenizer")
    assert "panicked" not in r.stderr and "backtrace" not in r.stderr


# --- 6. pytorch_model.bin: a zip record shorter than its tensor, and a file of zeros.

@pytest.fixture
def bin_folder(ckpts, tmp_path) -> Path:
    d = tmp_path / "bin"
    shutil.copytree(ckpts["tiny-bin"], d)
    assert not (d / "model.safetensors").exists()
    return d


def test_bin_record_shorter_than_its_tensor(bin_folder, tmp_path):
    import zipfile
    f = bin_folder / "pytorch_model.bin"
    with zipfile.ZipFile(f) as z:
        record = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    shorten_zip_record(f, tmp_path / "short.bin", "/data/0", record.file_size - 64)
    shutil.move(tmp_path / "short.bin", f)
    line = promise(bounded_cli("pull", bin_folder), "pytorch_model.bin", "tensor '", "truncated")
    assert "transformer." in line


def test_bin_largest_record_cut_to_a_few_bytes(bin_folder, tmp_path):
    import zipfile
    f = bin_folder / "pytorch_model.bin"
    with zipfile.ZipFile(f) as z:  # its storage now runs past the end of the file
        record = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    shorten_zip_record(f, tmp_path / "short.bin", record.filename.split("/", 1)[1], 8)
    shutil.move(tmp_path / "short.bin", f)
    promise(bounded_cli("pull", bin_folder), "pytorch_model.bin")


def test_bin_of_zeros(bin_folder):
    f = bin_folder / "pytorch_model.bin"
    f.write_bytes(bytes(f.stat().st_size))
    for command, target in (("pull", bin_folder), ("inspect", f)):
        line = promise(bounded_cli(command, target), "pytorch_model.bin", "not a PyTorch checkpoint")
        assert "would call code" not in line and "weights_only=False" not in line


# --- 7. Concurrent exports: the final rename never replaces what another writer put there.

def test_output_that_appears_during_the_export(tmp_path):
    from gptconv.errors import GptconvError
    from gptconv.output import atomic_output
    out = tmp_path / "model.gguf"
    with pytest.raises(GptconvError, match="appeared while"):
        with atomic_output(out, force=False) as tmp:
            tmp.write_bytes(b"ours")
            out.write_bytes(b"another export's")
    assert out.read_bytes() == b"another export's"
    assert partials(tmp_path) == []


def test_output_replaced_during_a_forced_export(tmp_path):
    from gptconv.errors import GptconvError
    from gptconv.output import atomic_output
    out = tmp_path / "model.gguf"
    out.write_bytes(b"old")
    with pytest.raises(GptconvError, match="changed while"):
        with atomic_output(out, force=True) as tmp:
            tmp.write_bytes(b"ours")
            (tmp_path / "third").write_bytes(b"a third party's")
            os.replace(tmp_path / "third", out)
    assert out.read_bytes() == b"a third party's"
    assert partials(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


def test_forced_export_over_what_was_there_still_works(tmp_path):
    from gptconv.output import atomic_output
    out = tmp_path / "model.gguf"
    out.write_bytes(b"old")
    with atomic_output(out, force=True) as tmp:
        tmp.write_bytes(b"new")
    assert out.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


# --- 8. A failed final step leaves nothing behind; SIGTERM mid-export leaves the old output.

@pytest.mark.parametrize("fmt", ["gguf", "safetensors"])
@pytest.mark.parametrize("target", ["..", "/proc/x"])
def test_export_to_a_place_that_cannot_hold_it(ckpts, tmp_path, fmt, target):
    work = tmp_path / "work"
    work.mkdir()
    r = bounded_cli("export", ckpts["tiny"], "--format", fmt, "-o", target, cwd=work)
    promise(r, f"{target}:")
    assert partials(work) == [] and partials(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"] and list(work.iterdir()) == []


def _snapshot(out: Path):
    return {f.relative_to(out).as_posix(): f.read_bytes() for f in out.rglob("*")} if out.is_dir() else out.read_bytes()


def _written(partial: Path) -> int:
    if partial.is_dir():
        return sum(f.stat().st_size for f in partial.rglob("*") if f.is_file())
    return partial.stat().st_size if partial.exists() else 0


@pytest.mark.parametrize("fmt,name", [("gguf", "model.gguf"), ("safetensors", "model-hf")])
def test_sigterm_mid_export_keeps_the_old_output(gpt2_124m, tmp_path, fmt, name):
    out = tmp_path / name
    r = bounded_cli("export", gpt2_124m, "--format", fmt, "--dtype", "f16", "-o", out, timeout=300)
    assert r.returncode == 0, r.stderr
    before = _snapshot(out)
    p = bounded_popen("export", gpt2_124m, "--format", fmt, "-o", out, "--force",  # f32 over the f16 output
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    partial = out.with_name(f".{out.name}.partial-{p.pid}")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None and _written(partial) <= 20_000_000:
        time.sleep(0.005)
    assert p.poll() is None, "the export ended before it could be stopped mid-write"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, (p.returncode, err)
    assert err.strip().splitlines() == ["gptconv: error: terminated"], err
    assert partials(tmp_path) == [] and _snapshot(out) == before


# --- 9. reference -o: an existing file is kept without --force, replaced with it.

def test_reference_does_not_overwrite_without_force(ckpts, tmp_path):
    out = tmp_path / "ref.safetensors"
    out.write_bytes(b"precious")
    promise(bounded_cli("reference", ckpts["tiny"], "-o", out), "ref.safetensors", "already exists")
    assert out.read_bytes() == b"precious"
    r = bounded_cli("reference", ckpts["tiny"], "-o", out, "--force")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() != b"precious" and out.read_bytes()[8:9] == b"{"  # a safetensors header now
    assert partials(tmp_path) == []


# --- 10. Classified messages: inputs that break parsers or the system's limits are bad input, not bugs.

def test_config_nested_100000_deep(tiny):
    text = (tiny / "config.json").read_text().rstrip()
    assert text.endswith("}")
    (tiny / "config.json").write_text(text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    for command in ("pull", "inspect"):
        promise(bounded_cli(command, tiny), "config.json", "not valid JSON")


def test_config_integer_of_5001_digits(tiny):
    text = (tiny / "config.json").read_text().rstrip()
    (tiny / "config.json").write_text(text[:-1] + ', "x": ' + "7" * 5001 + "}")
    for command in ("pull", "inspect"):
        promise(bounded_cli(command, tiny), "config.json")


def test_names_that_are_not_utf8(tiny, tmp_path):
    missing = os.fsencode(tmp_path) + b"/no-\xff-such"
    for command in ("pull", "inspect"):
        promise(bounded_cli(command, missing), "no-\\xff-such")
    odd = os.fsencode(tmp_path) + b"/ckpt-\xfe"
    os.rename(tiny, odd)
    for command in ("pull", "inspect"):  # a good checkpoint under such a name: it loads, or one line says why
        r = bounded_cli(command, odd)
        if r.returncode != 0:  # safetensors takes only UTF-8 paths
            promise(r, "ckpt-\\xfe")
    os.unlink(odd + b"/config.json")
    for command in ("pull", "inspect"):
        promise(bounded_cli(command, odd), "ckpt-\\xfe", "config.json")


def test_name_of_300_characters(ckpts, tmp_path):
    long = tmp_path / ("n" * 300)
    for args in (("pull", long), ("inspect", long), ("export", ckpts["tiny"], "--format", "gguf", "-o", long)):
        promise(bounded_cli(*args), "n" * 50)
    assert partials(tmp_path) == []


def test_temperature_nan(ckpts):
    promise(bounded_cli("generate", ckpts["tiny"], "hi", "--temperature", "nan", "-n", "1"), "--temperature")


def test_prompt_longer_than_the_context(ckpts):
    n_positions = json.loads((ckpts["tiny"] / "config.json").read_text())["n_positions"]
    promise(bounded_cli("generate", ckpts["tiny"], "hello world " * n_positions, "-n", "1"), "context")


@pytest.mark.parametrize("source", ["a/..", "someone/model"])
def test_pull_with_an_unreachable_hub(tmp_path, source):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf-home"))
    promise(bounded_cli("pull", source, env=env, cwd=tmp_path, timeout=90), source)


def test_export_into_a_folder_that_does_not_exist(ckpts):
    promise(bounded_cli("export", ckpts["tiny"], "--format", "gguf", "-o", "/proc/nope/x"), "/proc/nope", "no such folder")


# --- 11. Click usage errors: one line, exit 2.

@pytest.mark.parametrize("args", [
    ("pull", "--bogus", "x"),
    ("pull",),
    ("generate", "TINY"),
    ("export", "TINY", "--format", "zip", "-o", "x"),
    ("frobnicate",),
    ("generate", "TINY", "hi", "-n", "0"),
])
def test_usage_errors(ckpts, args):
    promise(bounded_cli(*(ckpts["tiny"] if a == "TINY" else a for a in args)))


# --- 12. A dangling symlink at the output path counts as something there.

@pytest.mark.parametrize("fmt", ["gguf", "safetensors"])
def test_dangling_link_at_the_output(ckpts, tmp_path, fmt):
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "nowhere")
    promise(bounded_cli("export", ckpts["tiny"], "--format", fmt, "-o", out), "already exists")
    assert os.readlink(out) == str(tmp_path / "nowhere") and not (tmp_path / "nowhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --- 13. KV cache: only the reserve is allocated up front; growing it changes no token.

def _greedy(model, prompt: list[int], n: int, cache) -> list[int]:
    ids, out = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(n):
            token = model(ids, cache=cache, last_only=True)[:, -1].argmax(-1)
            out.append(int(token))
            ids = token[:, None]
    return out


def test_kv_cache_reserve_and_growth(ckpts):
    import gptconv
    from gptconv.decoding import generate_ids as generate
    model = gptconv.load(ckpts["tiny"])
    cfg = model.config
    huge = gptconv.KVCache(cfg.n_layers, 1, cfg.n_kv_heads, 2**24, cfg.head_dim, reserve=8)
    assert all(s.k.shape[2] == 8 and s.v.shape[2] == 8 for s in huge.layers)  # not 2^24 positions
    prompt, n = [5, 17, 3, 99, 42], 60
    full = gptconv.KVCache(cfg.n_layers, 1, cfg.n_kv_heads, len(prompt) + n, cfg.head_dim, reserve=None)
    expected = _greedy(model, prompt, n, full)
    assert _greedy(model, prompt, n, huge) == expected
    assert huge.capacity > 8 and huge.pos == len(prompt) + n - 1
    assert generate(model, prompt, n) == expected


# --- 14. inspect --json of a config holding NaN / Infinity: strict JSON on stdout.

def test_inspect_json_is_strict_with_nan_in_the_config(tiny):
    text = (tiny / "config.json").read_text().rstrip()
    (tiny / "config.json").write_text(text[:-1] + ', "layer_norm_epsilon": NaN, "x_inf": Infinity, "x_ninf": -Infinity}')
    r = bounded_cli("inspect", tiny, "--json")
    assert r.returncode == 0, r.stderr

    def refuse(constant):
        raise ValueError(constant)
    data = json.loads(r.stdout, parse_constant=refuse)["result"]
    assert data["kind"] == "hf-folder"


# --- 15. Sizes of 0 in a config: one line naming the field.

def test_gpt2_n_inner_zero(tiny):
    edit_json(tiny / "config.json", n_inner=0)
    promise(bounded_cli("pull", tiny), "config.json", "n_inner")


def test_llama_kv_heads_zero(llamas, tmp_path):
    d = tmp_path / "llama"
    shutil.copytree(llamas["llama3-gqa"], d)
    edit_json(d / "config.json", num_key_value_heads=0)
    promise(bounded_cli("pull", d), "config.json", "num_key_value_heads")


# --- 16. Found by an outside review of this round: more bad input that must be a one-line error.

@pytest.mark.parametrize("size", ["5iB", "5i", "9" * 400])
def test_shard_sizes_that_are_not_sizes(ckpts, tmp_path, size):
    promise(bounded_cli("export", ckpts["tiny"], "--format", "safetensors", "-o", tmp_path / "out",
                        "--max-shard-size", size), "--max-shard-size")


def test_seed_past_what_a_generator_takes(ckpts):
    promise(bounded_cli("verify", ckpts["tiny"], "--seed", str(2**64)), "--seed")


def test_recorded_reference_of_another_model(ckpts, tmp_path):
    """A reference recorded for one GPT-2 is named as not fitting another, not compared with it."""
    ref = tmp_path / "odd.safetensors"
    assert bounded_cli("reference", ckpts["odd"], "-o", ref).returncode == 0
    promise(bounded_cli("verify", ckpts["tiny"], "--reference", ref), "odd.safetensors")


def test_gguf_string_that_is_not_utf8_is_shown_escaped(tmp_path):
    from gguf import GGUFWriter
    f = tmp_path / "s.gguf"
    w = GGUFWriter(str(f), "llama")
    w.add_string("general.name", "Ñame")  # 0xC3 0x91 in UTF-8; the 0xC3 is then made a lone 0xFF below
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = f.read_bytes()
    f.write_bytes(data.replace("Ñame".encode(), b"\xff\x91ame"))
    r = bounded_cli("inspect", f)
    assert r.returncode == 0 and "general.name" in r.stdout and "\\xff" in r.stdout, r.stdout + r.stderr
    assert bounded_cli("inspect", f, "--json").returncode == 0


# --- 17. --force replaces a regular file (or a link to one) or a folder of an export, nothing else.
# Found by an outside hostile test of export: a FIFO or a device became a regular file (as root,
# `-o /dev/null --force` destroyed /dev/null), a fine-tune's folder lost its optimizer state, a link
# loop was an internal error, a link to a folder was "a file". Never the real /dev/null as -o here.

def _special_output(path: Path, kind: str) -> None:
    """``path`` as a FIFO, a socket, a link to /dev/null, a link to itself, a link to a folder, or a
    folder that holds a model beside files no export writes (a fine-tune's output folder)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()  # the socket file stays
    elif kind == "link-to-device":
        path.symlink_to("/dev/null")
    elif kind == "link-loop":
        path.symlink_to(path.name)
    elif kind == "link-to-folder":
        (path.parent / "elsewhere").mkdir()
        (path.parent / "elsewhere" / "config.json").write_text("{}")
        path.symlink_to("elsewhere")
    else:
        path.mkdir()
        for name in ("config.json", "model.safetensors", "NOTES.md", "training_args.bin", "optimizer.pt"):
            (path / name).write_bytes(name.encode())


def _snapshot(folder: Path) -> list:
    """Every entry under ``folder``: its name, its type, and a link's target or a file's bytes."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            content = (os.readlink(p) if os.path.islink(p) else
                       p.read_bytes() if os.path.isfile(p) else None)
            found.append((str(p.relative_to(folder)), stat.S_IFMT(mode), content))
    return found


SPECIAL_OUTPUTS = {  # kind → what the one line says it is, for a GGUF file and for an HF folder
    "fifo": ("a FIFO", "a FIFO"), "socket": ("a socket", "a socket"),
    "link-to-device": ("a symbolic link to a character device", "a symbolic link to a character device"),
    "link-loop": ("a symbolic link loop", "a symbolic link loop"),
    "link-to-folder": ("a symbolic link to a folder", "a symbolic link to a folder"),
    "foreign-files": ("a folder", "NOTES.md, optimizer.pt, training_args.bin"),
}


@pytest.mark.parametrize("fmt", ["gguf", "safetensors"])
@pytest.mark.parametrize("kind", list(SPECIAL_OUTPUTS))
def test_force_replaces_only_a_file_or_an_exported_folder(ckpts, tmp_path, kind, fmt):
    work = tmp_path / "work"
    work.mkdir()
    out = work / "o"
    _special_output(out, kind)
    before = _snapshot(work)
    line = promise(bounded_cli("export", ckpts["tiny"], "--format", fmt, "-o", out, "--force", timeout=60),
                   f"{out}:", SPECIAL_OUTPUTS[kind][fmt == "safetensors"])
    assert "--force" in line
    assert _snapshot(work) == before  # nothing replaced, nothing deleted, no temporary left
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_reference_never_replaces_a_fifo(ckpts, tmp_path):
    os.mkfifo(tmp_path / "ref.safetensors")
    promise(bounded_cli("reference", ckpts["tiny"], "-o", tmp_path / "ref.safetensors", "--force", timeout=60),
            "ref.safetensors:", "a FIFO")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "ref.safetensors").st_mode)


def test_force_names_what_a_folder_would_lose(ckpts, tmp_path):
    """The first few of the files no export writes, and how many there are; sub-folders marked."""
    out = tmp_path / "finetune"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "a.txt", "b.txt", "c.txt", "d.txt"):
        (out / name).write_text(name)
    (out / "checkpoint-500").mkdir()
    before = _snapshot(tmp_path)
    promise(bounded_cli("export", ckpts["tiny"], "--format", "safetensors", "-o", out, "--force"),
            f"{out}:", "5 files and folders", "a.txt, b.txt, c.txt and 2 more")
    assert _snapshot(tmp_path) == before


def test_force_replaces_an_exported_folder_with_every_kind_of_file(ckpts, tmp_path):
    """Shards, their index, generation_config.json and the tokenizer files: all an export's own."""
    out = tmp_path / "out"
    args = ("export", ckpts["tiny"], "--format", "safetensors", "-o", out, "--max-shard-size", "20KB")
    assert bounded_cli(*args).returncode == 0
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors.index.json", "generation_config.json", "vocab.json", "merges.txt"} <= names
    assert any(n.startswith("model-00001-of-") for n in names)
    r = bounded_cli(*args[:-1], "1GB", "--force")
    assert r.returncode == 0, r.stderr
    assert "model.safetensors" in {p.name for p in out.iterdir()} and partials(tmp_path) == []


@pytest.mark.parametrize("flags", [("--format", "gguf", "--max-shard-size", "1MB"),
                                   ("--format", "gguf", "--max-shard-size", "5GB"),
                                   ("--format", "safetensors", "--check-ctx", "8"),
                                   ("--format", "gguf", "--against", "llama.cpp"),
                                   ("--format", "gguf", "--against", "gptconv")], ids=lambda f: f"{f[1]}{f[2]}={f[3]}")
def test_flags_that_would_be_ignored_are_refused(ckpts, tmp_path, flags):
    """A flag the export would not use (given, even at its default) is refused before anything is written."""
    promise(bounded_cli("export", ckpts["tiny"], "-o", tmp_path / "out", *flags), flags[2])
    assert list(tmp_path.iterdir()) == []
