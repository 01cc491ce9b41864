"""Issue 38's findings on the newer surfaces (side files, --force, file-driven sizes, recorded references,
the GGUF path's checks): each a test that failed before its fix."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

import gptconv
from gptconv.errors import GptconvError
from test_untrusted_input import promise
from untrusted_files import bounded_cli

SECRET = "user's secret: hunter2\n"


@pytest.fixture
def folder(ckpts, tmp_path) -> Path:
    """A fresh copy of the tiny GPT-2 folder with the side files a Hub folder has, and a secret outside it."""
    d = tmp_path / "tiny"
    shutil.copytree(ckpts["tiny"], d)
    (d / "special_tokens_map.json").write_text('{"eos_token": "<|endoftext|>"}')
    (d / "added_tokens.json").write_text("{}")
    (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (tmp_path / "secret.txt").write_text(SECRET)
    return d


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- 1. Side files are read, never copied blind: a link must stay inside the checkpoint's folder.

@pytest.mark.parametrize("name,fmt", [("special_tokens_map.json", "safetensors"), ("added_tokens.json", "safetensors"),
                                      ("chat_template.jinja", "safetensors"), ("chat_template.jinja", "gguf")])
def test_a_side_file_linked_out_of_its_folder_is_refused(folder, tmp_path, name, fmt):
    (folder / name).unlink()
    (folder / name).symlink_to(tmp_path / "secret.txt")
    out = tmp_path / ("out.gguf" if fmt == "gguf" else "out")
    promise(bounded_cli("export", folder, "--format", fmt, "-o", out), f"{folder / name}:", "outside")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial" in p.name]


def test_a_side_file_linked_inside_its_folder_or_its_hub_cache_repo_is_read(folder, tmp_path):
    (folder / "templates").mkdir()
    (folder / "chat_template.jinja").rename(folder / "templates" / "chat.jinja")
    (folder / "chat_template.jinja").symlink_to("templates/chat.jinja")
    out = gptconv.export(str(folder), tmp_path / "out", "safetensors").out
    assert (out / "chat_template.jinja").read_text() == (folder / "templates" / "chat.jinja").read_text()
    # the Hub cache: models--ORG--NAME/snapshots/REV/FILE links to ../../blobs/HASH
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for f in folder.iterdir():
        if f.is_file() and not f.is_symlink():
            shutil.copyfile(f, blobs / _sha(f))
            (snapshot / f.name).symlink_to(Path("../../blobs") / _sha(f))
    shutil.copyfile(folder / "templates" / "chat.jinja", blobs / "t")
    (snapshot / "chat_template.jinja").symlink_to("../../blobs/t")
    assert gptconv.export(str(snapshot), tmp_path / "out2", "gguf").out.exists()


def test_a_json_side_file_that_is_not_json_is_not_copied(folder, tmp_path):
    (folder / "added_tokens.json").write_text("ssh-rsa AAAA… not json")
    promise(bounded_cli("export", folder, "--format", "safetensors", "-o", tmp_path / "out"),
            "added_tokens.json", "not valid JSON")
    assert not (tmp_path / "out").exists()


# --- 3. --force replaces only the output it saw when the export began, never a file of the source.

@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "vocab.json"])
def test_force_never_replaces_a_file_of_the_source(folder, name):
    before = _sha(folder / name)
    promise(bounded_cli("export", folder, "--format", "gguf", "-o", folder / name, "--force"),
            "a file of the source", "--force will not replace it")
    assert _sha(folder / name) == before


def test_force_may_still_replace_an_earlier_export_inside_the_source_folder(folder):
    old = gptconv.export(str(folder), folder / "model.gguf", "gguf").out
    assert gptconv.export(str(folder), old, "gguf", "f16", force=True).out == old


def test_force_replaces_only_what_it_saw_first(tmp_path):
    from gptconv.output import atomic_output, identity
    out = tmp_path / "model.gguf"
    out.write_bytes(b"what was there when the export began")
    seen = identity(out)
    (tmp_path / "other").write_bytes(b"another export, finished meanwhile")
    os.replace(tmp_path / "other", out)
    with pytest.raises(GptconvError, match="changed since this command began"):
        with atomic_output(out, force=True, seen=seen) as tmp:
            tmp.write_bytes(b"ours")
    assert out.read_bytes() == b"another export, finished meanwhile"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


# --- 4. Every expansion a file drives is bounded by the tensor it applies to.

@pytest.mark.parametrize("fmt", ["gguf", "safetensors"])
def test_exports_racing_to_one_output_leave_one_whole_export(folder, tmp_path, fmt):
    """Item 6: three exports of one folder started together to one output (two with --force): the first to
    finish writes it; each other refuses in one line or (a --force that saw it when it began) replaces it;
    none ends otherwise; no partial is left; what is there is the model, whole."""
    import subprocess
    import sys
    out = tmp_path / ("model.gguf" if fmt == "gguf" else "hf")
    procs = [subprocess.Popen([sys.executable, "-m", "gptconv", "export", str(folder), "--format", fmt, "-o", str(out),
                               *(["--force"] if i else [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    ends = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert all(code in (0, 2) for code, _ in ends), ends
    assert 0 in [code for code, _ in ends], ends  # more than one where a --force began after the first ended
    assert all(len(err.strip().splitlines()) == 1 and str(out) in err for code, err in ends if code == 2), ends
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, folder.name, "secret.txt"])
    import torch
    ours, theirs = gptconv.load(str(out)).state_dict(), gptconv.load(str(folder)).state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_an_fp8_block_larger_than_its_weight_allocates_no_more_than_the_weight():
    import torch
    from gptconv import memory
    from gptconv.sources.quantized import dequantize_fp8
    weight = torch.randn(4, 6).to(torch.float8_e4m3fn)
    scale = torch.tensor([[0.5]])
    memory.reset_peak()
    before = memory.resident()
    got = dequantize_fp8(weight, scale, [2**26, 2**26])  # one block; expanded as given: 1.3 GB
    assert memory.peak() - before < 100e6
    assert torch.equal(got, weight.float() * 0.5)
    assert torch.equal(dequantize_fp8(weight, torch.tensor([[1.0, 2.0]]), [4, 5]),
                       weight.float() * torch.tensor([1.0] * 5 + [2.0]))  # a last block cut short


# --- Tokenizer ids past the model's vocabulary: one line, not an IndexError.

@pytest.mark.parametrize("command", ["trace", "generate", "perplexity"])
def test_a_token_id_past_the_vocabulary_is_one_line(folder, tmp_path, command):
    import json

    from tokenizers import ByteLevelBPETokenizer
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    tk = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    extra = [f"<x{i}>" for i in range(vocab - tk.get_vocab_size() + 1)]
    tk.add_special_tokens(extra)
    assert tk.token_to_id(extra[-1]) == vocab
    tk.save(str(folder / "tokenizer.json"))
    text = tmp_path / "t.txt"
    text.write_text(f"Hello {extra[-1]} world. " * 30)
    args = {"trace": ("trace", folder, f"Hi {extra[-1]}"), "generate": ("generate", folder, f"Hi {extra[-1]}", "-n", "1"),
            "perplexity": ("perplexity", folder, text, "--ctx", "16")}[command]
    promise(bounded_cli(*args), f"token id {vocab:,}", "past the model's vocabulary")


# --- 5. A field is absent or valid, never replaced because it is falsy.

@pytest.mark.parametrize("kind,field,value", [
    ("yarn", "factor", 0), ("yarn", "beta_fast", 0), ("yarn", "original_max_position_embeddings", 0),
    ("longrope", "factor", 0), ("longrope", "original_max_position_embeddings", 0)])
def test_a_rope_field_given_as_zero_is_refused_not_replaced(llamas, tmp_path, kind, field, value):
    import json
    d = tmp_path / "llama"
    shutil.copytree(llamas["llama2-mha"], d)
    config = json.loads((d / "config.json").read_text())
    head = config["hidden_size"] // config["num_attention_heads"]
    scaling = {"rope_type": kind, "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
    if kind == "longrope":
        scaling |= {"short_factor": [1.0] * (head // 2), "long_factor": [2.0] * (head // 2)}
    scaling[field] = value
    config.pop("rope_scaling", None)
    config["rope_parameters"] = scaling
    (d / "config.json").write_text(json.dumps(config))
    promise(bounded_cli("trace", d, "--ids", "1,2"), f"'{field}' is 0", "(or absent)")


# --- 7. An HF folder renders the chat template transformers renders; export says where llama.cpp's differs.

def test_chat_template_jinja_takes_priority_as_in_transformers(folder, tmp_path):
    import json

    from transformers import AutoTokenizer
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "CONFIG'S {% for m in messages %}{{ m['content'] }}{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text("JINJA'S {% for m in messages %}{{ m['content'] }}{% endfor %}")
    messages = [{"role": "user", "content": "hi"}]
    theirs = AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, tokenize=False)
    ours = gptconv.load_tokenizer(str(folder)).apply_chat_template(messages, add_generation_prompt=False)
    assert ours == theirs == "JINJA'S hi"
    summary = gptconv.export(str(folder), tmp_path / "out.gguf", "gguf")
    assert any("chat_template.jinja's" in n and "llama.cpp's converter" in n for n in summary.notes)
    from gptconv.sources.gguf_file import open_gguf
    assert open_gguf(summary.out).fields.get("tokenizer.chat_template", str).startswith("JINJA'S")


# --- 5. The GGUF path enforces what the HF path does: a config a file gives is refused in one line.

GGUF_SHAPES = {
    "qwen3_5_text": ("gpt-2", dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=96,
                                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                   linear_value_head_dim=16, linear_conv_kernel_dim=4, tie_word_embeddings=True,
                                   bos_token_id=50256, eos_token_id=50256)),
    "lfm2": ("gpt-2", dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=192, block_multiple_of=32,
                           conv_L_cache=3, layer_types=["conv", "full_attention", "conv"], bos_token_id=50256,
                           eos_token_id=50256, pad_token_id=50256)),
    "deepseek_v3": ("gpt-2", dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, intermediate_size=96,
                                  moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, n_group=4,
                                  topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32,
                                  q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=24, v_head_dim=20,
                                  bos_token_id=50256, eos_token_id=50256)),
    "gemma4_text": ("llama-spm-bpe", dict(vocab_size=32000, max_position_embeddings=64, hidden_size=64,
                                          intermediate_size=96, num_hidden_layers=3,
                                          layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                                          sliding_window=16, hidden_size_per_layer_input=8,
                                          vocab_size_per_layer_input=32000, bos_token_id=1, eos_token_id=2,
                                          pad_token_id=0)),
    "llama": ("gpt-2", dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, intermediate_size=96,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, bos_token_id=50256,
                            eos_token_id=50256, rope_parameters=dict(
                                rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                high_freq_factor=4.0, original_max_position_embeddings=16))),
    "gemma3_text": ("llama-spm-bpe", dict(vocab_size=32000, max_position_embeddings=64, hidden_size=64,
                                          intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, sliding_window=8, bos_token_id=1,
                                          eos_token_id=2, pad_token_id=0)),  # llama.cpp's: every 6th global
    "gpt_oss": ("gpt-2", dict(vocab_size=50257, max_position_embeddings=64, hidden_size=64, intermediate_size=32,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              num_local_experts=4, num_experts_per_tok=2, sliding_window=8, bos_token_id=50256,
                              eos_token_id=50256, pad_token_id=50256)),
}


class _Built(dict):
    """Each family's checkpoint (``arch + "/hf"``) and its GGUF export (``arch``), made when first asked for."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, key: str) -> Path:
        from fixtures import make_checkpoint
        arch = key.removesuffix("/hf")
        vocab, shape = GGUF_SHAPES[arch]
        folder = make_checkpoint(self.root / arch, arch, vocab, shape)
        self[arch + "/hf"] = folder
        self[arch] = gptconv.export(str(folder), self.root / f"{arch}.gguf", "gguf").out
        return self[key]


@pytest.fixture(scope="module")
def family_ggufs(tmp_path_factory) -> dict[str, Path]:
    return _Built(tmp_path_factory.mktemp("ggufs"))


def patched(gguf: Path, dst: Path, changes: dict[str, object], hide: tuple[str, ...] = ()) -> Path:
    """A copy of ``gguf`` with metadata values changed in place (scalars, or every item of an array) and the
    keys of ``hide`` renamed out of sight (their last letter changed)."""
    from gguf import GGUFReader
    shutil.copyfile(gguf, dst)
    reader = GGUFReader(dst, "r+")
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    for key, value in changes.items():
        field = reader.fields[key.format(arch=arch)]
        for i in field.data:
            field.parts[i][...] = value
    for key in hide:
        name = reader.fields[key.format(arch=arch)].parts[1]
        name[-1] = ord("Z")
    reader.data.flush()
    del reader
    return dst


@pytest.mark.parametrize("arch,changes,hide,needle", [
    ("qwen3_5_text", {"{arch}.full_attention_interval": 0}, ("{arch}.attention.recurrent_layers",),
     "full_attention_interval 0"),
    ("lfm2", {"{arch}.shortconv.l_cache": 0}, (), "kernel"),
    ("deepseek_v3", {"{arch}.expert_group_count": 0}, (), "expert_groups"),
    ("deepseek_v3", {"{arch}.expert_group_count": 8}, (), "groups of two or more"),
    ("deepseek_v3", {"{arch}.attention.kv_lora_rank": 0}, (), "kv_lora_rank"),
    ("gemma4_text", {"{arch}.attention.sliding_window_pattern": True}, (), "last layer slides"),
], ids=["interval-0", "l_cache-0", "groups-0", "one-expert-a-group", "kv_lora_rank-0", "all-sliding"])
def test_a_gguf_config_the_hf_path_refuses_is_refused_in_one_line(family_ggufs, tmp_path, arch, changes, hide,
                                                                    needle):
    bad = patched(family_ggufs[arch], tmp_path / "bad.gguf", changes, hide)
    promise(bounded_cli("trace", bad, "--ids", "1,2"), str(bad), needle)


def test_deepseek_with_one_expert_a_group_is_refused_from_its_config(family_ggufs, tmp_path):
    import json
    d = tmp_path / "ds"
    shutil.copytree(family_ggufs["deepseek_v3/hf"], d)
    config = json.loads((d / "config.json").read_text())
    config["n_group"] = config["n_routed_experts"]
    (d / "config.json").write_text(json.dumps(config))
    promise(bounded_cli("trace", d, "--ids", "1,2"), "config.json", "groups of two or more")


# --- 2. A recorded reference is checked: bound to its weights, its calibration plausible, its coverage said.

@pytest.fixture(scope="module")
def recorded(ckpts, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("recorded")
    folder = root / "tiny"
    shutil.copytree(ckpts["tiny"], folder)
    return folder, gptconv.record_reference(str(folder), root / "ref.safetensors")


def rewritten(ref: Path, dst: Path, edit) -> Path:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    with safe_open(str(ref), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(ref))
    edit(tensors, meta)
    save_file(tensors, str(dst), metadata=meta)
    return dst


def test_a_reference_whose_own_run_is_noise_is_refused(recorded, tmp_path):
    import torch
    folder, ref = recorded
    g = torch.Generator().manual_seed(0)

    def noise(t, _meta):
        for k in [k for k in t if not k.endswith("/ids") and k.count("/") == 1]:  # the float32 run
            t[k] = torch.randn(t[k].shape, generator=g) * 50
    bad = rewritten(ref, tmp_path / "noise.safetensors", noise)
    promise(bounded_cli("verify", folder, "--reference", bad), str(bad), "no rounding of the float64 run")


@pytest.mark.parametrize("edit,needle", [
    (lambda t, m: t.update({"random/logits": t["random/logits"].to(torch_int32())}), "stored as int32"),
    (lambda t, m: t.update({"random/float64/logits": t["random/float64/logits"].half()}), "stored as float16"),
    (lambda t, m: t.update({"random/block.0": t["random/block.0"] > 0}), "stored as bool"),
], ids=["int32-logits", "float16-truth", "bool-step"])
def test_a_reference_stored_in_other_dtypes_is_refused(recorded, tmp_path, edit, needle):
    folder, ref = recorded
    bad = rewritten(ref, tmp_path / "bad.safetensors", edit)
    promise(bounded_cli("verify", folder, "--reference", bad), str(bad), needle)


def torch_int32():
    import torch
    return torch.int32


def test_a_reference_says_what_it_covers_and_what_it_was_recorded_from(recorded, tmp_path):
    folder, ref = recorded
    full = gptconv.verify(str(folder), reference_file=ref)
    assert full.passed and not [n for n in full.notes if "covers" in n or "weights" in n], full.notes

    def cut(t, meta):
        for k in [k for k in t if not k.startswith("random/") or not k.endswith(("/ids", "logits"))]:
            del t[k]
        meta["inputs"] = '["random"]'
        meta.pop("weights")
    partial = gptconv.verify(str(folder), reference_file=rewritten(ref, tmp_path / "cut.safetensors", cut))
    said = " | ".join(partial.notes)
    assert "covers 1 of verify's 4 inputs" in said and "steps verify compares" in said, said
    assert "does not say which weights" in said, said
    from helpers import edited_copy
    edited_copy(folder, tmp_path / "other2", lambda s: s["transformer.h.0.mlp.c_fc.bias"].add_(1e-3))
    moved = gptconv.verify(str(tmp_path / "other2"), reference_file=ref)
    assert any("recorded from other weights" in n for n in moved.notes), moved.notes


# --- 8. An interrupt is exit 130 wherever it lands, reads included.

def test_an_interrupt_that_a_read_turns_into_another_error_is_still_exit_130(ckpts, monkeypatch, capsys):
    import signal
    import sys

    import gptconv.api
    from gptconv import output
    import importlib
    cli = importlib.import_module("gptconv.cli.main")

    def read_interrupted(path):  # what safetensors does: the KeyboardInterrupt raised in its read → ValueError
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10**7):
                pass
        except KeyboardInterrupt:
            raise ValueError("Error while deserializing header: interrupted") from None
    monkeypatch.setattr(gptconv.api, "inspect", read_interrupted)
    monkeypatch.setattr(sys, "argv", ["gptconv", "inspect", str(ckpts["tiny"])])
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as e:
            cli.main()
    finally:
        signal.signal(signal.SIGINT, before)
        output._signalled[0] = None
    assert e.value.code == 130
    assert capsys.readouterr().err.strip() == "gptconv: error: interrupted"


@pytest.mark.parametrize("sections,needle", [([100, 100, 100], "adds up to 300"), (["a", 1], "not a list"),
                                              ([-2, 5, 5], "not a list")])
def test_a_field_only_the_reference_reads_is_still_checked(llamas, tmp_path, sections, needle):
    """M-RoPE's sections: plain RoPE on text, unread by us, read by transformers (whose model failed inside)."""
    import json
    d = tmp_path / "llama"
    shutil.copytree(llamas["llama2-mha"], d)
    config = json.loads((d / "config.json").read_text())
    config.pop("rope_scaling", None)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
    (d / "config.json").write_text(json.dumps(config))
    promise(bounded_cli("trace", d, "--ids", "1,2"), "mrope_section", needle)


@pytest.mark.parametrize("fmt", ["gguf", "safetensors"])
def test_an_output_name_its_temporary_cannot_take_is_refused_before_any_work(ckpts, tmp_path, fmt):
    out = tmp_path / ("n" * 245)
    promise(bounded_cli("export", ckpts["tiny"], "--format", fmt, "-o", out), "its name is 245 bytes")
    assert list(tmp_path.iterdir()) == []
    assert gptconv.export(str(ckpts["tiny"]), tmp_path / ("n" * 230), fmt).out.exists()  # what fits still works


# --- 4b. A GGUF vocabulary is read in bulk: RAM a small multiple of its bytes, the values gguf's reader gives.

def _vocab_file(path: Path, n: int, tokens=None) -> Path:
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens or [f"t{i}" for i in range(n)])
    w.add_token_scores([float(-i) for i in range(n)])
    w.add_token_types([1 + i % 6 for i in range(n)])
    w.add_array("test.flags", [bool(i % 2) for i in range(5)])
    w.add_tensor("x", np.zeros((4, 4), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def test_a_gguf_vocabulary_costs_ram_of_its_size_in_the_file(tmp_path):
    import tracemalloc
    from gptconv.sources.gguf_file import read_fields
    path = _vocab_file(tmp_path / "v.gguf", 200_000)
    tracemalloc.start()
    try:
        read_fields(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the reader made two numpy views an item: ~1.5 KB a token, 300 MB here, for a 4.6 MB file
    assert peak <= 2 * path.stat().st_size, f"{peak:,} bytes to read a {path.stat().st_size:,}-byte file's metadata"


def test_a_gguf_array_read_in_bulk_gives_what_ggufs_reader_gives(tmp_path):
    from gguf import GGUFReader
    from gptconv.sources.gguf_file import read_fields
    tokens = ["<unk>", "é", "日本", "", " a", "\u2581b"]
    path = _vocab_file(tmp_path / "v.gguf", len(tokens), tokens)
    ours, theirs = read_fields(path).reader.fields, GGUFReader(path).fields
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert ours[key].contents() == theirs[key].contents(), key
        assert ours[key].types == theirs[key].types, key
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "test.flags"):
        assert [ours[key].contents(i) for i in range(3)] == [theirs[key].contents(i) for i in range(3)]


def test_a_string_array_past_the_end_of_the_file_is_one_line(tmp_path):
    import struct
    from gptconv.sources.gguf_file import read_fields
    path = _vocab_file(tmp_path / "v.gguf", 50)
    data = bytearray(path.read_bytes())
    at = data.index(b"t49") - 8  # the last token's 8-byte length
    data[at:at + 8] = struct.pack("<Q", 10**12)
    path.write_bytes(data)
    with pytest.raises(GptconvError, match=r"v\.gguf.*string 49 of the array .* past the end of the file"):
        read_fields(path)


# --- 6. The fuzz reaches each family's GGUF fields: every numeric `{arch}.*` field set to hostile values.

@pytest.mark.parametrize("arch,form", [(arch, form) for arch in GGUF_SHAPES for form in ("gguf", "hf")] +
                         [("deepseek_v3", "fp8"), ("gpt_oss", "mxfp4")])
def test_each_family_config_field_set_hostile_ends_in_one_line_or_a_trace(family_ggufs, tmp_path, arch, form):
    """Item 5 and 6 both ways: every numeric field of the family's GGUF metadata, and of its config.json,
    set to 0, -1, 2^31-1, its type's max, NaN, inf, 1e30 or a flipped bool; in an FP8 or MXFP4 checkpoint
    (as DeepSeek-V3 and gpt-oss ship) also a scale tensor's values, shape and dtype (fuzz_fields.py)."""
    import json
    import subprocess
    import sys

    from fixtures import fp8_folder, mxfp4_folder
    source = family_ggufs[arch if form == "gguf" else arch + "/hf"]
    if form == "fp8":
        source = fp8_folder(source, tmp_path / "fp8", 16)
    elif form == "mxfp4":
        source = mxfp4_folder(source, tmp_path / "mxfp4")
    script = Path(__file__).with_name("fuzz_fields.py")
    (tmp_path / "cases").mkdir()
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "cases"), str(source)], capture_output=True, text=True,
                       timeout=600, cwd=script.parent)
    lines = r.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), f"exit status {r.returncode}:\n{r.stderr[-3000:]}"
    result = json.loads(lines[-1])
    print(f"\nfield fuzz of {source.name}:", result["summary"])
    assert result["failures"] == [], f"{len(result['failures'])} failures:\n" + "\n".join(result["failures"][:8])
    assert result["summary"].get("error") and result["summary"].get("traced")


def test_a_hostile_reference_file_ends_in_a_stated_verdict_or_one_line(recorded, tmp_path):
    """Item 6: a recorded reference with a metadata value removed or replaced, a tensor removed or given NaN,
    inf, zeros, huge values, another dtype or shape, ids past the vocabulary, or the file cut
    (fuzz_references.py): a verdict that says what the file lacks, or one line naming the file."""
    import json
    import subprocess
    import sys
    folder, ref = recorded
    script = Path(__file__).with_name("fuzz_references.py")
    r = subprocess.run([sys.executable, str(script), str(tmp_path), str(folder), str(ref)], capture_output=True,
                       text=True, timeout=600, cwd=script.parent)
    lines = r.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), f"exit status {r.returncode}:\n{r.stderr[-3000:]}"
    result = json.loads(lines[-1])
    print("\nreference fuzz:", result["summary"], result["verdicts"])
    assert result["failures"] == [], f"{len(result['failures'])} failures:\n" + "\n".join(result["failures"][:8])
    assert result["summary"]["refused"] > 100 and "prompt0/ids zeros" in result["verdicts"]["failed"]


def test_a_killed_exports_partial_under_a_name_never_reused_goes_once_an_hour_old(folder, tmp_path):
    """LOW: a partial of another output name whose process is gone is removed by the next export into that
    folder once an hour untouched; a fresh one (another machine's on a shared folder?) and a live one stay."""
    old, fresh = tmp_path / ".other.gguf.partial-99999999", tmp_path / ".else.gguf.partial-99999998"
    live = tmp_path / f".third.gguf.partial-{os.getpid()}"
    for p in (old, fresh, live):
        p.write_bytes(b"half")
    for p in (old, live):
        os.utime(p, (p.stat().st_atime - 7200, p.stat().st_mtime - 7200))
    gptconv.export(str(folder), tmp_path / "model.gguf", "gguf")
    assert not old.exists() and fresh.exists() and live.exists()
