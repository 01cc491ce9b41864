from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch


def hf_model(folder: Path, dtype: torch.dtype = torch.float32):
    """transformers' model of ``folder``, eager attention; in float64 eager experts too (its grouped product
    has no float64), elsewhere its default experts, as every other transformers model here is built."""
    from transformers import AutoModelForCausalLM
    experts = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager", **experts).eval()


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptconv", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def assert_fp32_parity(ours: torch.Tensor, reference: torch.Tensor, label: str) -> None:
    """Our float32 logits against a reference's: within parity.FP32, the same argmax everywhere."""
    from gptconv.parity.compare import FP32
    diff = (ours - reference).abs().max().item()
    print(f"\n{label}: fp32 max|Δ| = {diff:.3e}")
    assert diff <= FP32.atol
    assert torch.equal(ours.argmax(-1), reference.argmax(-1))


def random_ids(vocab: int, length: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def edited_copy(src: Path, dst: Path, edit: Callable[[dict], None]) -> Path:
    """A copy of a single-file safetensors checkpoint folder whose tensors ``edit`` changed in place."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    edit(state)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def with_mtp_layer(ckpt: Path, folder: Path, where: str = "mtp.", config_key: bool = True) -> Path:
    """A Qwen hybrid ``ckpt`` with one MTP layer as released files have it: a full-attention layer (layer 3's
    tensors, moved off them so that the two cannot be taken for each other), ``fc`` over [e; h] and three norms
    (about 0: 1 + w), every value a bfloat16 one (GGUF's 1 + w then reads back exactly); config.json says
    ``mtp_num_hidden_layers`` where ``config_key`` (Qwen3.5's do, Qwen3-Next's do not)."""
    g = torch.Generator().manual_seed(7)

    def add_mtp(state):
        d = state["model.embed_tokens.weight"].shape[1]
        for key in [k for k in state if k.startswith("model.layers.3.")]:
            t = state[key]
            state[f"{where}layers.0.{key.removeprefix('model.layers.3.')}"] = (
                t + 0.05 * torch.randn(t.shape, generator=g)).bfloat16().to(t.dtype)
        state[f"{where}fc.weight"] = (0.2 * torch.randn(d, 2 * d, generator=g)).bfloat16().float()
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            state[f"{where}{n}.weight"] = (0.1 * torch.randn(d, generator=g)).bfloat16().float()
    edited_copy(ckpt, folder, add_mtp)
    if config_key:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "mtp_num_hidden_layers": 1}))
    return folder


def with_trailing_mtp_layer(ckpt: Path, folder: Path, n_layers: int) -> Path:
    """A DeepSeek-V3 or GLM ``ckpt`` with one MTP layer as their releases hold it: ``model.layers.{n}``, a full
    layer (the last one's tensors, moved off them) with its own embed_tokens, enorm, hnorm, eh_proj and shared
    head (norm, head); config.json says num_nextn_predict_layers 1."""
    g = torch.Generator().manual_seed(7)

    def add_mtp(state):
        vocab, d = state["model.embed_tokens.weight"].shape
        last = f"model.layers.{n_layers - 1}."
        for key in [k for k in state if k.startswith(last)]:
            t = state[key]
            state[f"model.layers.{n_layers}.{key.removeprefix(last)}"] = t + 0.05 * torch.randn(t.shape, generator=g)
        for name, shape in (("embed_tokens.weight", (vocab, d)), ("enorm.weight", (d,)), ("hnorm.weight", (d,)),
                            ("eh_proj.weight", (d, 2 * d)), ("shared_head.norm.weight", (d,)),
                            ("shared_head.head.weight", (vocab, d))):
            state[f"model.layers.{n_layers}.{name}"] = 0.2 * torch.randn(shape, generator=g)
    edited_copy(ckpt, folder, add_mtp)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    return folder


def swap(a: str, b: str) -> Callable[[dict], None]:
    def edit(state: dict) -> None:
        state[a], state[b] = state[b], state[a]
    return edit


# Text that tokenizers get wrong first: whitespace runs and a leading space, accents and a word in
# combining-heavy Vietnamese, CJK, emoji with joiners, digits, byte fallback (a character outside the
# vocabulary, a NUL), newlines, and special tokens of several families written in the text.
TORTURE = ["Hello world", " Hello", "  two  spaces  ", "\tTab\t\t", "café naïve Ærø", "Cửa Việt",
           "你好世界, こんにちは", "🙂🚀👩‍👩‍👧", "digits 1234567890 3.14", "𝔘nicode \u0000 nul", "\n\nnewlines\n",
           "<s>Hello</s> world", "Hello <s> world", "<|endoftext|>a", "<|im_start|>user\nhi<|im_end|>",
           "<|user|>\nhi<|end|>\n<|assistant|>", "   ", "", "a"]


def hf_round_trip(folder, out, **kw):
    """Export ``folder`` to an HF folder in f32: transformers loads the same tensors and logits, bit
    for bit, and so does our model (ours against transformers: each family's logits test)."""
    import gptconv
    from gptconv.writers import export
    export(str(folder), out, "safetensors", "f32", **kw)
    original, exported = hf_model(folder), hf_model(out)
    a, b = original.state_dict(), exported.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ids = random_ids(original.config.vocab_size, 32)
    ours = gptconv.load(out)
    with torch.no_grad():
        ref, got, mine = original(ids).logits, exported(ids).logits, ours(ids)
        before = gptconv.load(folder)(ids)
    assert torch.equal(ref, got)  # the same weights give transformers the same logits, bit for bit
    assert torch.equal(mine, before)  # and us


def assert_generation_matches(folder, n_max: int = 120) -> None:
    """Greedy generation through our KV cache equals recomputing the whole sequence each step, and
    transformers' own ``generate``, for up to ``n_max`` positions."""
    import gptconv
    from gptconv.decoding import generate_ids
    model = gptconv.load(folder)
    prompt = random_ids(model.config.vocab_size, 6, batch=1, seed=5)[0].tolist()
    n = min(model.config.context_length, n_max) - len(prompt)
    cached = generate_ids(model, prompt, n)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert cached == ids[len(prompt):]
    out = hf_model(folder).generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False,
                                    pad_token_id=0, eos_token_id=None)
    assert cached == out[0, len(prompt):].tolist()


def assert_fused_experts_read_alike(folder: Path, out: Path) -> None:
    """``folder``'s model saved by transformers in its module's layout (each layer's experts as gate_up_proj
    and down_proj, as save_original_format=False and the released MoE files store them) loads as the same
    model."""
    import gptconv
    from safetensors import safe_open
    hf_model(folder).save_pretrained(out, save_original_format=False)
    for f in folder.iterdir():
        if f.name.startswith("tokenizer"):
            (out / f.name).write_bytes(f.read_bytes())
    with safe_open(out / "model.safetensors", "pt") as s:
        assert "model.layers.0.mlp.experts.gate_up_proj" in s.keys()
    a, b = gptconv.load(out).state_dict(), gptconv.load(folder).state_dict()
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def assert_left_padding_kept_out(monkeypatch, folder, layer: type, lengths: list[int], n: int, pad_id: int) -> None:
    """Prompts of ``lengths``, left-padded into one batch, each generate ``n`` tokens as they do alone; the
    check can fail: with the padding hidden from ``layer`` (a recurrent layer: pads then enter its state),
    they do not."""
    import gptconv
    from gptconv.decoding import generate_batch, generate_ids
    model = gptconv.load(folder)
    rows = random_ids(model.config.vocab_size, max(lengths), batch=len(lengths), seed=3)
    prompts = [row[:k].tolist() for row, k in zip(rows, lengths)]
    alone = [generate_ids(model, p, n) for p in prompts]
    assert generate_batch(model, prompts, n, pad_id=pad_id) == alone

    class Unpadded:  # the step's padding hidden from ``layer`` only
        def __init__(self, step):
            self._step = step
        pad = None

        def __getattr__(self, name):
            return getattr(self._step, name)
    real = layer.forward
    monkeypatch.setattr(layer, "forward", lambda self, x, step: real(self, x, Unpadded(step)))
    assert generate_batch(model, prompts, n, pad_id=pad_id) != alone


def recorded_reference(ckpt: Path, folder: Path, length: int = 64) -> Path:
    """transformers' outputs on verify's inputs, recorded once (float64 and float32) so that planted faults
    are judged without a transformers run each; the model without a fault passes against it."""
    import gptconv
    ref = gptconv.record_reference(str(ckpt), folder / "ref.safetensors", length=length)
    assert gptconv.verify(str(ckpt), dtype="f32", reference_file=str(ref)).passed
    return ref


def assert_planted_fault_fails(ckpt: Path, reference: Path, fault: str) -> None:
    """verify against the recorded reference must fail with the fault planted."""
    import gptconv
    report = gptconv.verify(str(ckpt), dtype="f32", reference_file=str(reference))
    print(f"\n{fault}: max|Δ| = {report.max_abs_diff:.3g}, first divergent step {report.first_divergent_step}")
    assert not report.passed


def assert_verifies_at_fp32_and_bf16(folder: Path, label: str) -> None:
    """verify against transformers (float64-calibrated) passes at float32 and at bfloat16."""
    import gptconv
    for dtype in ("float32", "bfloat16"):
        report = gptconv.verify(str(folder), dtype=dtype)
        print(f"\n{label} {dtype}: verify vs transformers: max|Δ| = {report.max_abs_diff:.3e} "
              f"at {report.inputs['random']} positions")
        assert report.passed, (dtype, report.first_divergent_step, report.notes)
