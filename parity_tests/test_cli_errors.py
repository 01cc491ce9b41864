"""Bad input gets one line naming the file and the problem, exit 2, no traceback."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import run_cli


def one_line_error(r, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gptconv: error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def copy(ckpts, tmp_path):
    def make(name: str = "tiny") -> Path:
        dst = tmp_path / f"copy-{name}"
        shutil.copytree(ckpts[name], dst)
        return dst
    return make


def edit_tensors(folder: Path, edit) -> None:
    state = load_file(folder / "model.safetensors")
    edit(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_no_such_source():
    one_line_error(run_cli("pull", "./does/not/exist"), "does/not/exist", "no such file")


def test_truncated_safetensors(copy):
    d = copy()
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:5000])
    one_line_error(run_cli("pull", d), "model.safetensors", "not a readable safetensors file")


def test_missing_tensor(copy):
    d = copy()
    edit_tensors(d, lambda s: s.pop("transformer.h.1.ln_2.bias"))
    one_line_error(run_cli("pull", d), "missing tensor: 'transformer.h.1.ln_2.bias'")


def test_wrong_shape(copy):
    d = copy()
    edit_tensors(d, lambda s: s.update({"transformer.wpe.weight": torch.zeros(100, 64)}))
    one_line_error(run_cli("trace", d, "--ids", "1,2"), "'transformer.wpe.weight' is [100, 64]",
                   "'pos_emb.weight' needs [128, 64]")


class PlantsAFile:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_malicious_pickle_is_refused_and_never_runs(ckpts, tmp_path):
    d = tmp_path / "evil"
    d.mkdir()
    shutil.copy(ckpts["tiny-bin"] / "config.json", d)
    marker = tmp_path / "pwned"
    with open(d / "pytorch_model.bin", "wb") as f:
        pickle.dump({"transformer.wte.weight": PlantsAFile(str(marker))}, f)
    PlantsAFile(str(marker))  # (constructing it plants nothing; only unpickling would)
    r = run_cli("pull", d)
    one_line_error(r, "pytorch_model.bin", "refused")
    assert not marker.exists()


def test_safetensors_preferred_over_bin(copy, ckpts):
    d = copy()
    (d / "pytorch_model.bin").write_bytes(b"not even a pickle")
    r = run_cli("pull", d)
    assert r.returncode == 0 and "model.safetensors" in r.stdout and "pytorch_model.bin" not in r.stdout


def test_config_missing_field_and_wrong_type(copy):
    d = copy()
    cfg = json.loads((d / "config.json").read_text())
    del cfg["n_layer"]
    (d / "config.json").write_text(json.dumps(cfg))
    one_line_error(run_cli("pull", d), "config.json", "missing field 'n_layer'")
    cfg["n_layer"] = "twelve"
    (d / "config.json").write_text(json.dumps(cfg))
    one_line_error(run_cli("pull", d), "field 'n_layer' is 'twelve'")
    cfg["n_layer"] = 10**12
    (d / "config.json").write_text(json.dumps(cfg))
    one_line_error(run_cli("pull", d), "n_layers = 1000000000000 is not an integer in 1 … 1,024")
    (d / "config.json").write_text("{not json")
    one_line_error(run_cli("pull", d), "config.json", "not valid JSON")


def test_unsupported_architecture(copy):
    d = copy()
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "bert"
    (d / "config.json").write_text(json.dumps(cfg))
    one_line_error(run_cli("pull", d), "model_type 'bert' is not supported")


def test_index_escaping_the_folder_is_refused(ckpts, tmp_path):
    d = tmp_path / "escape"
    shutil.copytree(ckpts["tiny-sharded"], d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    name = next(iter(index["weight_map"]))
    for evil in ("../secret.safetensors", "/etc/passwd"):
        index["weight_map"][name] = evil
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
        one_line_error(run_cli("pull", d), "model.safetensors.index.json", f"shard '{evil}' is not a plain file name")


def test_missing_shard(ckpts, tmp_path):
    d = tmp_path / "sharded"
    shutil.copytree(ckpts["tiny-sharded"], d)
    (d / "model-00002-of-00003.safetensors").unlink()
    one_line_error(run_cli("pull", d), "shard 'model-00002-of-00003.safetensors' is missing")


def test_bad_flags_and_ids(ckpts):
    r = run_cli("generate", ckpts["tiny"], "hi", "--max-new-tokens", "zero")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    one_line_error(run_cli("trace", ckpts["tiny"], "--ids", "1,x"), "--ids")
    one_line_error(run_cli("trace", ckpts["tiny"], "--ids", "99999"), "99999 is not a token id")
    one_line_error(run_cli("verify", ckpts["tiny"], "--length", "5000"), "--length 5000")


def test_debug_shows_the_traceback(copy):
    d = copy()
    (d / "config.json").write_text("[]")
    r = run_cli("--debug", "pull", d)
    assert r.returncode == 2 and "Traceback" in r.stderr
