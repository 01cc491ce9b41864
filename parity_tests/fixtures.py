"""Checkpoints made in the test session with transformers (random init, no downloads).

``initializer_range`` is raised to 0.2 so that a wrong transpose or a swapped tensor moves the
logits by far more than any tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import ByteLevelBPETokenizer

from gptconv.families.gemma3 import FULL, SLIDING

TOKENIZER_TEXT = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Ünïcödé, accents: café, naïve, Ærø; emoji 🙂🚀; digits 1234567890; CJK 你好世界",
    "hello   world\t\ttabs\n\nnewlines    and runs of     spaces",
]

GPT2_SHAPES = {
    # name: (config overrides, description)
    "tiny": dict(vocab_size=512, n_positions=128, n_embd=64, n_layer=2, n_head=4),
    "odd": dict(vocab_size=403, n_positions=37, n_embd=60, n_layer=3, n_head=5, n_inner=100),
    # over huggingface-hub's 10 MiB download chunk, so a cut-off download leaves bytes to resume from
    "wide-vocab": dict(vocab_size=50257, n_positions=64, n_embd=64, n_layer=1, n_head=4),
    "gpt2-124m": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
}


def write_bpe_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE (GPT-2's kind) trained on a few lines: vocab.json, merges.txt, tokenizer.json."""
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(TOKENIZER_TEXT * 20, vocab_size=min(vocab_size, 400), min_frequency=1,
                            special_tokens=["<|endoftext|>"])
    tok.save_model(str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "add_prefix_space": False, "model_max_length": 1024}))


def make_gpt2(folder: Path, shape: str, seed: int = 0, init: float = 0.2) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(**GPT2_SHAPES[shape], initializer_range=init, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    _scramble_norms(model)
    model.save_pretrained(folder)
    write_bpe_tokenizer(folder, cfg.vocab_size)
    return folder


def _scramble_norms(model: torch.nn.Module) -> None:
    """Random-init norms are all ones and biases zeros: make them random too, so mixing them up shows.
    A norm weight that starts at zero is an offset (Gemma's RMSNorm scales by 1 + w): random around 0,
    rounded to bfloat16 as the released checkpoints store them (1 + w is then exact, as GGUF stores it)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight") and not p.any():  # an offset norm
                p.copy_((torch.randn(p.shape, generator=g) * 0.1).bfloat16().float())
            elif p.ndim == 1 and name.endswith("scale"):  # multipliers (Gemma 4's router): about 1; its input's
                # about 3, so that its scores part the experts as a trained router's do (random ones near a tie
                # let any rounding pick another expert)
                p.copy_((torch.randn(p.shape, generator=g) * 0.3 + 1.0) * (3.0 if name.endswith("router.scale") else 1.0))
            elif p.ndim == 1:  # norms and biases
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if name.endswith("weight") and ("ln" in name or "norm" in name) else 0.0))
        for name, b in model.named_buffers():  # Gemma 4's per-layer output scale, saved though a buffer
            if name.endswith("layer_scalar"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's bias on the choice of experts
                b.copy_(torch.randn(b.shape, generator=g) * 0.2)


def resave_as_bin(src: Path, dst: Path, legacy: bool = False) -> Path:
    """The same weights as ``pytorch_model.bin``; ``legacy``: GPT-2's original file layout, without
    the ``transformer.`` prefix and with the ``attn.bias`` / ``attn.masked_bias`` buffers."""
    from safetensors.torch import load_file
    dst.mkdir(parents=True, exist_ok=True)
    state = load_file(src / "model.safetensors")
    if legacy:
        state = {k.removeprefix("transformer."): v for k, v in state.items()}
        n_pos = json.loads((src / "config.json").read_text())["n_positions"]
        for i in range(json.loads((src / "config.json").read_text())["n_layer"]):
            state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool))[None, None]
            state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, dst / "pytorch_model.bin")
    copy_side_files(src, dst)
    return dst


def resave_sharded(src: Path, dst: Path, n_shards: int = 3) -> Path:
    from safetensors.torch import load_file
    dst.mkdir(parents=True, exist_ok=True)
    state = load_file(src / "model.safetensors")
    names = sorted(state)
    weight_map = {}
    for s in range(n_shards):
        shard = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: state[n] for n in names[s::n_shards]}
        save_file(part, str(dst / shard), metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    copy_side_files(src, dst)
    return dst


def copy_side_files(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.suffix in (".json", ".txt") and not f.name.endswith("index.json"):
            (dst / f.name).write_bytes(f.read_bytes())


LLAMA_SHAPES = {
    # Llama-2 style: multi-head attention, untied head
    "llama2-mha": dict(vocab_size=512, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, intermediate_size=176),
    # Llama-3 style GQA with n_heads / n_kv_heads = 3 != n_kv_heads = 2
    "llama3-gqa": dict(vocab_size=480, max_position_embeddings=96, hidden_size=72, num_hidden_layers=3,
                       num_attention_heads=6, num_key_value_heads=2, intermediate_size=160, rope_theta=500000.0),
    # Llama 3.1 scaling with a small original context, tested far past it
    "llama31-scaled": dict(vocab_size=400, max_position_embeddings=256, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                           rope_theta=10000.0),
    # Llama 3.2 style: four layers, tied head, factor 32 over a small original context
    "llama32-deep": dict(vocab_size=384, max_position_embeddings=160, hidden_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 20},
                         rope_theta=500000.0),
    "linear-scaled": dict(vocab_size=400, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                          rope_scaling={"type": "linear", "factor": 4.0}),
    "tied": dict(vocab_size=448, max_position_embeddings=64, hidden_size=48, num_hidden_layers=2,
                 num_attention_heads=3, num_key_value_heads=1, intermediate_size=96, tie_word_embeddings=True),
    # head_dim set apart from hidden_size / heads (as Qwen3 and Gemma do)
    "head-dim": dict(vocab_size=400, max_position_embeddings=64, hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, head_dim=24),
    "biases": dict(vocab_size=400, max_position_embeddings=64, hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, attention_bias=True,
                   mlp_bias=True),
    # Qwen2: q/k/v biases (always on), no output bias; make it with model_type="qwen2"
    "qwen2": dict(vocab_size=400, max_position_embeddings=64, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, rope_theta=1000000.0),
}


def make_llama(folder: Path, shape: str, seed: int = 0, init: float = 0.2, model_type: str = "llama") -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    kwargs = dict(LLAMA_SHAPES[shape], initializer_range=init, bos_token_id=1, eos_token_id=2)
    if model_type == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**kwargs))
    else:
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    _scramble_norms(model)
    model.save_pretrained(folder)
    write_bpe_tokenizer(folder, kwargs["vocab_size"])
    return folder


def legacy_rope_config(folder: Path) -> Path:
    """Rewrite config.json in the pre-transformers-5 form: top-level rope_theta, rope_scaling with 'type'."""
    cfg = json.loads((folder / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    if params.get("rope_type", "default") != "default":
        params["type"] = params.pop("rope_type")
        cfg["rope_scaling"] = params
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# Checkpoints with real tokenizers (llama.cpp's test vocabularies and SmolLM2's, converted by
# transformers; Llama 2's as a tokenizer.model) and random weights: what both converters get.
CONVERTER_FIXTURES = {
    "gpt2": ("gpt2", "gpt-2", dict(vocab_size=50257, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                   bos_token_id=50256, eos_token_id=50256)),
    "llama3-gqa-scaled": ("llama", "llama-bpe", dict(
        vocab_size=128256, max_position_embeddings=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, bos_token_id=128000, eos_token_id=128001, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32})),
    "smollm2-tied": ("llama", "smollm2", dict(
        vocab_size=49152, max_position_embeddings=128, hidden_size=72, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, intermediate_size=160, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        rope_theta=100000.0)),
    "llama2-spm": ("llama", "llama-spm", dict(
        vocab_size=32000, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=176, bos_token_id=1, eos_token_id=2)),
    "qwen2": ("qwen2", "qwen2", dict(
        vocab_size=151936, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, rope_theta=1000000.0, tie_word_embeddings=False)),
    "qwen3": ("qwen3", "qwen2", dict(
        vocab_size=151936, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, head_dim=24, rope_theta=1000000.0, tie_word_embeddings=True)),
    # Phi-3 mini's tokenizer: Llama 2's tokenizer.model and Phi-3's chat tokens as added tokens
    # (llama.cpp's phi3 needs them), the vocabulary padded to 32,064
    "phi3": ("phi3", "llama-spm", dict(
        vocab_size=32064, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, sliding_window=20, original_max_position_embeddings=128,
        bos_token_id=1, eos_token_id=32000, pad_token_id=32000)),
    "mixtral": ("mixtral", "llama-spm", dict(
        vocab_size=32000, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
        bos_token_id=1, eos_token_id=2)),
    "mistral-swa": ("mistral", "llama-spm", dict(
        vocab_size=32000, max_position_embeddings=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, sliding_window=16, bos_token_id=1, eos_token_id=2)),
}


def make_converter_fixture(folder: Path, name: str, vocab_gguf: Path) -> Path:
    arch, vocab, kwargs = CONVERTER_FIXTURES[name]
    return make_checkpoint(folder, arch, vocab, kwargs, vocab_gguf, our_tokenizer=name == "llama3-gqa-scaled")


def make_checkpoint(folder: Path, arch: str, vocab: str, kwargs: dict, vocab_gguf: Path | None = None,
                    our_tokenizer: bool = False, config_json: dict | None = None) -> Path:
    """A random-init checkpoint of ``arch`` saved by transformers (init range 0.2, norms scrambled) with
    a real tokenizer both converters read: llama.cpp's test vocabulary ``vocab`` (``vocab_gguf``: another
    file), as a SentencePiece tokenizer.model (llama-spm) or a tokenizer.json. ``config_json``: keys added to
    the saved config.json (legacy names the released files carry, which transformers 5 does not write)."""
    import transformers
    import llama_cpp_tools
    # llama-spm-bpe: tokenizer.json; gpt-2-glm: with GLM's special tokens added
    vocab_gguf = vocab_gguf or llama_cpp_tools.vocab_file(vocab.removesuffix("-bpe").removesuffix("-glm"))
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(arch, **kwargs, initializer_range=0.2)
    model = transformers.AutoModelForCausalLM.from_config(config)
    _scramble_norms(model)
    model.save_pretrained(folder)
    if vocab == "llama-spm":
        llama_cpp_tools.sentencepiece_model_from_gguf(vocab_gguf, folder / "tokenizer.model")
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
            "eos_token": "<|endoftext|>" if arch == "phi3" else "</s>", "unk_token": "<unk>",
            "add_bos_token": True, "add_eos_token": False, "legacy": True}))
        if arch == "phi3":
            llama_cpp_tools.phi3_added_tokens(folder)
    elif our_tokenizer:
        llama_cpp_tools.our_tokenizer_from_gguf(vocab_gguf, folder)
    else:
        llama_cpp_tools.hf_tokenizer_from_gguf(vocab_gguf, folder)
    if vocab == "llama-spm-bpe":  # as Gemma 4's own: spaces as ▁, no space put before the text
        llama_cpp_tools.no_dummy_prefix(folder)
    if vocab.endswith("-glm"):  # the tokens llama.cpp's converter looks up in a GLM tokenizer
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(folder)
        tok.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>"]})
        tok.save_pretrained(folder)
    if arch == "gpt2":
        llama_cpp_tools.add_n_ctx(folder)
    if config_json:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config_json}, indent=2))
    return folder


# The Llama family's other members, each with what sets it apart, tested past every window.
FAMILY_SHAPES = {
    # Mistral v0.1: every layer sees its last 16 positions only; the tests run to 96
    "mistral-swa": ("mistral", dict(vocab_size=400, max_position_embeddings=96, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                                    sliding_window=16)),
    # Qwen3: RMSNorm on each q and k head before RoPE, head_dim apart from hidden_size / heads
    "qwen3": ("qwen3", dict(vocab_size=400, max_position_embeddings=96, hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, head_dim=24,
                            rope_theta=1000000.0, tie_word_embeddings=True)),
    # Phi-3: fused qkv_proj and gate_up_proj, a sliding window (2047 in phi-3-mini; 20 here)
    "phi3": ("phi3", dict(vocab_size=400, max_position_embeddings=96, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, sliding_window=20,
                          pad_token_id=0, original_max_position_embeddings=96)),
    # Mixtral: 4 experts, 2 chosen per token
    "mixtral": ("mixtral", dict(vocab_size=400, max_position_embeddings=96, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
                                num_local_experts=4, num_experts_per_tok=2)),
}


def make_family(folder: Path, name: str, seed: int = 0, init: float = 0.2, **changes) -> Path:
    import transformers
    model_type, kwargs = FAMILY_SHAPES[name]
    kwargs = {**kwargs, **changes}
    torch.manual_seed(seed)
    cls = transformers.AutoConfig.for_model(model_type, **kwargs, initializer_range=init, bos_token_id=1,
                                            eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(cls)
    _scramble_norms(model)
    model.save_pretrained(folder)
    write_bpe_tokenizer(folder, kwargs["vocab_size"])
    return folder


# Gemma 3 (text) with every feature at a size a test can run past: six layers, five local (window 16)
GEMMA3_SHAPE = dict(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=96, sliding_window=16,
             query_pre_attn_scalar=24,
             rope_parameters={FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                              SLIDING: {"rope_type": "default", "rope_theta": 1e4}})


def make_gemma3(folder: Path, vocab: str = "bpe", **changes) -> Path:
    import transformers
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(**{**GEMMA3_SHAPE, **changes}, initializer_range=0.2, bos_token_id=1,
                                        eos_token_id=2, pad_token_id=0)
    model = transformers.Gemma3ForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # every norm: zeros at init, so a swapped one would not show
                p.copy_((torch.randn(p.shape, generator=g) * 0.1).bfloat16().float())
    model.save_pretrained(folder)
    if vocab == "bpe":
        from fixtures import write_bpe_tokenizer
        write_bpe_tokenizer(folder, cfg.vocab_size)
    else:  # llama.cpp ships no Gemma 3 vocabulary: Llama 2's SentencePiece model, which its converter accepts
        import llama_cpp_tools
        llama_cpp_tools.sentencepiece_model_from_gguf(llama_cpp_tools.vocab_file(vocab), folder / "tokenizer.model")
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "add_bos_token": True, "add_eos_token": False, "legacy": True}))
    return folder


# Multimodal checkpoints: the text model (every feature of its family, tiny) inside transformers' wrapper
# with a one-layer vision tower. Tokenizers the converter reads: Llama 2's SentencePiece vocabulary for
# Gemma 3 and Mistral 3 (llama.cpp ships none of theirs), Qwen2's byte-level BPE for Qwen3-VL.
_TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=96, initializer_range=0.2)
WRAPPER_FIXTURES = {
    "gemma3": ("llama-spm", dict(
        text_config=dict(**{**_TEXT, "num_hidden_layers": 6}, vocab_size=32000, sliding_window=16,
                         query_pre_attn_scalar=16, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=3, boi_token_index=4, eoi_token_index=5, tie_word_embeddings=True)),
    "mistral3": ("llama-spm", dict(
        text_config=dict(model_type="mistral", **_TEXT, vocab_size=32000, sliding_window=None, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=False),
        vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14, head_dim=16),
        image_token_index=10, tie_word_embeddings=False)),
    "qwen3_vl": ("qwen2", dict(
        text_config=dict(**_TEXT, vocab_size=151936, rope_theta=5e6, bos_token_id=151643, eos_token_id=151645,
                         rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        vision_config=dict(hidden_size=32, intermediate_size=64, depth=1, num_heads=2, out_hidden_size=64,
                           patch_size=14, deepstack_visual_indexes=[0]),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=False)),
    # Qwen3.5's: a hybrid text model (3 linear-attention layers, 1 gated full-attention layer) and no MTP layers
    # (transformers reads its tokenizer as Qwen2's, whose pre-tokenizer is the only one llama.cpp's converter
    # then recognises)
    "qwen3_5": ("qwen2", dict(
        text_config=dict(**{**_TEXT, "num_hidden_layers": 4, "head_dim": 32}, vocab_size=151936, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                         bos_token_id=151643, eos_token_id=151645),
        vision_config=dict(hidden_size=32, intermediate_size=64, depth=1, num_heads=2, out_hidden_size=64,
                           patch_size=14),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=False)),
    # Gemma 4's (E2B-like: per-layer embeddings, wider global heads), without its audio tower
    "gemma4": ("llama-spm-bpe", dict(
        text_config=dict(**{**_TEXT, "num_hidden_layers": 3}, model_type="gemma4_text", vocab_size=32000,
                         layer_types=["sliding_attention", "sliding_attention", "full_attention"], global_head_dim=32,
                         sliding_window=16, hidden_size_per_layer_input=8, vocab_size_per_layer_input=32000,
                         final_logit_softcapping=30.0, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, head_dim=16),
        audio_config=None)),
}
# the norms that scale by 1 + w (scrambled about 0, the others about 1)
_OFFSET_NORMS = {"gemma3": lambda n: True, "qwen3_5": lambda n: "linear_attn.norm" not in n}


def make_wrapper(folder: Path, name: str) -> Path:
    """A random-init multimodal checkpoint saved by transformers (text norms scrambled, as elsewhere)."""
    import transformers
    import llama_cpp_tools
    vocab, kwargs = WRAPPER_FIXTURES[name]
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(name, **kwargs)
    model = transformers.AutoModelForImageTextToText.from_config(config)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim == 1 and "language_model" in n and "norm" in n:  # ones or zeros at init: a swap would not show
                offset = _OFFSET_NORMS.get(name, lambda n: False)(n)
                p.copy_((torch.randn(p.shape, generator=g) * 0.1 + (0.0 if offset else 1.0)).bfloat16().float())
    model.save_pretrained(folder)
    if vocab == "llama-spm":
        llama_cpp_tools.sentencepiece_model_from_gguf(llama_cpp_tools.vocab_file(vocab), folder / "tokenizer.model")
        (folder / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "add_bos_token": True, "add_eos_token": False, "legacy": True}))
    else:
        llama_cpp_tools.hf_tokenizer_from_gguf(llama_cpp_tools.vocab_file(vocab.removesuffix("-bpe")), folder)
    if vocab == "llama-spm-bpe":  # as Gemma 4's own: spaces as ▁, no space put before the text
        llama_cpp_tools.no_dummy_prefix(folder)
    return folder


def relayout(src: Path, dst: Path, renames: dict[str, str]) -> Path:
    """The same checkpoint with its tensors under other prefixes (``renames``: old prefix → new)."""
    from safetensors.torch import load_file, save_file
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    out = {}
    for k, t in tensors.items():
        new = next((n + k[len(o):] for o, n in renames.items() if k.startswith(o)), k)
        out[new] = t
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


# --- checkpoints as the low-precision releases ship them

def fp8_folder(ckpt, folder, block: int):
    """The fixture with every linear weight of its layers in float8 E4M3 with one float32 scale per block of
    block × block (weight_scale_inv; quantization_config fp8), by the format's rule: a block's scale is its
    max|w| / 448 (E4M3's largest), each weight w / scale rounded to E4M3. Blocks at the edges are cut short."""
    import json
    import shutil
    from safetensors.torch import load_file, save_file
    shutil.copytree(ckpt, folder)
    tensors = load_file(folder / "model.safetensors")
    for name in [k for k in tensors if k.endswith(("proj.weight", "proj_with_mqa.weight")) and ".layers." in k]:
        w = tensors.pop(name)
        rows, cols = w.shape
        grid = (-(-rows // block), -(-cols // block))
        padded = torch.zeros(grid[0] * block, grid[1] * block)
        padded[:rows, :cols] = w
        blocks = padded.view(grid[0], block, grid[1], block)
        scale = blocks.abs().amax((1, 3)) / 448.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(grid[0] * block, -1)[:rows, :cols]
        tensors[name], tensors[name.removesuffix("weight") + "weight_scale_inv"] = q.contiguous(), scale
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [block, block]}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E, R, C) → HF's (E, R, C/32, 16) blocks and (E, R, C/32) scales, by the OCP MX rule: each block of 32
    shares the exponent floor(log2 max|x|) − 2 (E2M1's largest exponent), each value rounds to the nearest E2M1."""
    b = w.float().reshape(*w.shape[:-1], -1, 32)
    amax = b.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2 + 127, torch.zeros_like(amax)).clamp(0, 254)
    idx = (b[..., None] / torch.ldexp(torch.ones_like(amax), (e - 127).int())[..., None, None] - E2M1).abs().argmin(-1)
    return (idx[..., 0::2] | (idx[..., 1::2] << 4)).to(torch.uint8), e.to(torch.uint8)


def mxfp4_folder(ckpt, folder):
    """``ckpt`` with its experts' two matrices in MXFP4 (``*_blocks`` + ``*_scales``, quantization_config
    mxfp4), as openai/gpt-oss-20b ships them."""
    import json
    import shutil
    from safetensors.torch import load_file, save_file
    shutil.copytree(ckpt, folder)
    tensors = load_file(folder / "model.safetensors")
    for name in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = quantize_mxfp4(tensors.pop(name).transpose(1, 2))  # rows are the outputs
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
