"""The public functions, one per command: ``pull``, ``trace``, ``generate``, ``verify``, ``export``,
``inspect``, ``record_reference``, ``perplexity``; each returns a typed result with ``to_dict()`` (``results.py``),
and the CLI only parses arguments and prints these results."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path

import torch

from . import memory
from .decoding import check_options, generate_batch, generate_tokens
from .devices import parse_device
from .errors import GptconvError, where
from .families import BY_WRAPPER
from .layers.mtp import HELD
from .loader import Source, load_source, open_source, parse_dtype
from .parity.compare import Report
from .parity.run import record_reference, verify
from .perplexity import Perplexity, check_windows, measure, summarize
from .results import Result
from .sources.files import JSON_LIMIT, read_text
from .sources.hf_folder import open_hf_folder, read_safetensors, read_torch_bin
from .tokenizer import Tokenizer, load_tokenizer, tokenizer_or_none
from .tracing import StepStats, trace_steps
from .writers import SHARD_BYTES, ExportSummary, export as write


@dataclass
class PullSummary(Result):
    source: str
    repo_id: str | None
    folder: Path
    arch: str
    parameters: int
    dtypes: dict[str, int]  # source dtype → tensor count
    files: list[tuple[str, int]]  # (name, bytes)
    context_length: int
    layout: str
    # a multimodal checkpoint (its model_type): the tensors its text model leaves out, by their names, and what they are
    wrapper: str | None
    left_out: list[str]
    left_out_what: str
    dropped: list[str]  # tensors the key map drops on purpose, each by a named rule (RoPE buffers)
    held: list[str]  # tensors held in the model, not run by the trace (MTP layers): export writes them back
    family: str = ""  # the family (gptconv/families/) whose formats these are, where not the architecture's name


def pull(source: str, revision: str | None = None) -> PullSummary:
    """Download (or find) the checkpoint, map and check every tensor, and summarise it."""
    src = open_source(source, revision, prefer_cache=False, backend="per-tensor")
    parameters = check_every_tensor(src)  # the full strict load: every tensor read, mapped and checked
    dtypes = Counter(src.stored_types.values())
    return PullSummary(
        source, src.repo_id, src.path, src.arch, parameters, dict(dtypes),
        [(f.name, f.stat().st_size) for f in src.files], src.config.context_length, src.layout,
        src.wrapper, src.left_out, BY_WRAPPER[src.wrapper][1].left_out_what if src.wrapper else "", src.dropped,
        src.held, getattr(src.config, "family", src.arch),
    )


def check_every_tensor(src: Source) -> int:
    """Read every tensor of ``src`` through its key map, one at a time (each checked as a load checks it,
    then let go: memory of one tensor, whatever the model's size); the model's parameter count."""
    from .convert import model_shapes
    from .models import build_empty
    from .streaming import tie_groups
    model = build_empty(src.config)
    plan = src.plan(model_shapes(model))
    src.layout, src.dropped = plan.layout, list(plan.dropped)
    src.held = list(dict.fromkeys(key for key, target, _ in plan.moves if target.startswith(HELD)))
    for _name, tensor in plan.tensors(torch.float32):
        del tensor
    plan.forget()
    return sum(model.get_parameter(first).numel() for first in tie_groups(model))


@dataclass
class Trace(Result):
    source: str
    arch: str
    config: object  # our config (GPT2Config or DecoderConfig)
    ids: list[int]
    steps: list[StepStats]  # ids first, logits last
    top: list[tuple[int, str | None, float]]  # the next token's 5 likeliest: (id, text if a tokenizer, p)


def trace(source: str | Path, text: str | None = None, ids: str | list[int] | None = None,
          dtype: str = "float32", revision: str | None = None, device: str = "cpu",
          stream: bool | None = None) -> Trace:
    """Each named step of the forward pass on ``text`` (or token ``ids``), with its shape and statistics.
    ``stream``: the model read a block at a time as it runs (``gptconv.streaming``); by default, where
    it would not fit in memory whole."""
    device = parse_device(device)
    dt = parse_dtype(dtype)
    src = open_source(source, revision)
    tok = tokenizer_or_none(src)
    prompt = encode_prompt(src, text, ids, tokenizer=tok)
    shape = memory.Shape.of(src.config)
    need = lambda streamed: memory.trace_need(src.name, shape, dt, len(prompt), streamed)  # noqa: E731
    if stream is None:
        stream = device.type == "cpu" and need(False).peak > memory.available()
    if stream and device.type != "cpu":
        raise GptconvError(f"{src.name}: a model read a block at a time runs on the CPU, not {device}")
    memory.check(need(stream), [("--stream", lambda: need(True))] if not stream and device.type == "cpu" else [])
    if stream:
        src = open_source(source, revision, backend="per-tensor") if src.format == "hf" else src
    steps, logits = trace_steps(load_source(src, dt, device, blockwise=stream), torch.tensor([prompt]))
    top = torch.topk(torch.softmax(logits[0, -1].float(), -1), 5)
    words = [tok.decode([int(i)]) if tok is not None else None for i in top.indices]
    return Trace(str(source), src.arch, src.config, prompt, steps,
                 [(int(i), w, float(p)) for i, w, p in zip(top.indices, words, top.values)])


@dataclass
class Generation(Result):
    source: str
    prompt: str  # as the model saw it (wrapped in the chat template with ``chat``)
    prompt_ids: list[int]
    ids: list[int]  # the new tokens
    text: str  # the new text, up to a stop string
    stopped_at_eos: bool
    stop_string: str | None = None  # the stop string the text reached, cut off the text
    stopped_at_context: bool = False  # the model's context filled up before max_new_tokens


def generate(source: str | Path, prompt: str | list[str], max_new_tokens: int = 32, *, chat: bool = False,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             stop: str | list[str] | None = None, seed: int | None = None, dtype: str = "float32",
             on_text: Callable[[str], object] | None = None, revision: str | None = None,
             device: str = "cpu") -> Generation | list[Generation]:
    """Continue ``prompt`` token by token through the KV cache (greedy unless ``temperature``; sampled
    from ``top_k`` and ``top_p``), stopping at the tokenizer's EOS or once the new text holds a ``stop``
    string (cut off the text). ``chat``: wrap the prompt as a user message in the model's chat template.
    ``on_text``: called with the prompt as the model sees it, then with each new piece of text as soon
    as it is whole UTF-8 (what the CLI prints as it goes; one prompt only).

    A list of prompts (different lengths welcome) runs as one padded batch and gives a list: each
    prompt the tokens it gets alone (greedy: the same tokens), each stopping on its own."""
    check_options(max_new_tokens, temperature, top_k, top_p, seed)  # before anything loads
    device = parse_device(device)
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not s for s in stops):
        raise GptconvError("a stop string cannot be empty")
    src = open_source(source, revision)
    tok = load_tokenizer(src)
    texts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not texts:
        raise GptconvError("no prompt given")
    # a chat template writes its own BOS ({{ bos_token }}), as transformers' apply_chat_template assumes
    texts = [tok.apply_chat_template([{"role": "user", "content": t}]) if chat else t for t in texts]
    prompt_ids = [encode_prompt(src, t, None, add_special_tokens=not chat, tokenizer=tok) for t in texts]
    if parse_device(device).type == "cpu":
        _check_generate(src, parse_dtype(dtype), prompt_ids, max_new_tokens)
    model = load_source(src, dtype, device)
    eos = {tok.eos_id} if tok.eos_id is not None else set()
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop_ids=eos)

    def finish(text: str, ids: list[int], out: list[int]) -> Generation:
        new = tok.decode(out)
        reached = _first_stop(new, stops)
        at_eos = bool(out) and out[-1] in eos
        full = not at_eos and reached is None and len(out) < max_new_tokens and \
            len(ids) + len(out) >= model.config.context_length
        return Generation(str(source), text, ids, out, new if reached is None else new[:new.index(reached)],
                          at_eos, reached, full)

    if not isinstance(prompt, str):
        if on_text is not None:
            raise GptconvError("on_text streams one prompt; a list of prompts returns its Generations at the end")
        done = (lambda out: _first_stop(tok.decode(out), stops) is not None) if stops else None
        outs = generate_batch(model, prompt_ids, max_new_tokens, pad_id=_pad_id(tok), done=done, **options)
        return [finish(t, ids, out) for t, ids, out in zip(texts, prompt_ids, outs)]
    say = on_text or (lambda piece: None)
    say(texts[0])
    out: list[int] = []
    shown = ""
    for token in generate_tokens(model, prompt_ids[0], max_new_tokens, **options):
        out.append(token)
        new = tok.decode(out)
        reached = _first_stop(new, stops)
        if reached is not None:
            new = new[:new.index(reached)]
        else:  # hold back an end that may yet become a stop string: what is shown is never taken back
            new = new[:len(new) - _stop_prefix(new, stops)]
        if not new.endswith("\ufffd") and len(new) > len(shown):  # wait for the rest of a multi-byte character
            say(new[len(shown):])
            shown = new
        if reached is not None:
            break
    final = finish(texts[0], prompt_ids[0], out)
    if len(final.text) > len(shown):  # what was held back, now that no stop string can complete it
        say(final.text[len(shown):])
    return final


def _check_generate(src: Source, dtype: torch.dtype, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Refuse in one line a generation whose weights, cache and prefill would not fit in memory:
    generation needs its weights resident (every token reads them all)."""
    shape = memory.Shape.of(src.config)
    longest = max(map(len, prompts))
    positions = min(src.config.context_length, longest + max_new_tokens)

    def need(dt: torch.dtype) -> memory.Need:
        cache = memory.kv_cache_bytes(src.config, positions, dt, len(prompts))
        return memory.generate_need(src.name, shape, cache, dt, longest, len(prompts))
    memory.check(need(dtype), [("--dtype bf16", lambda: need(torch.bfloat16))] if dtype == torch.float32 else [])


def _stop_prefix(text: str, stops: list[str]) -> int:
    """The length of the longest end of ``text`` that a stop string begins with (0 if none)."""
    return max((n for s in stops for n in range(min(len(s) - 1, len(text)), 0, -1) if text.endswith(s[:n])),
               default=0)


def _first_stop(text: str, stops: list[str]) -> str | None:
    """The stop string that occurs first in ``text``, if any."""
    found = [(text.index(s), s) for s in stops if s in text]
    return min(found)[1] if found else None


def _pad_id(tok: Tokenizer) -> int:
    """Any id serves (pads are masked out); the tokenizer's EOS or BOS reads best in a dump."""
    return next((i for i in (tok.eos_id, tok.bos_id) if i is not None), 0)


def encode_prompt(src: Source, text: str | None, ids: str | list[int] | None,
                  add_special_tokens: bool = True, tokenizer: Tokenizer | None = None) -> list[int]:
    """Token ids from ``text`` (through the checkpoint's tokenizer, adding its BOS where it adds one
    unless ``add_special_tokens`` is false) or ``ids`` (a list, or a string like "464,3139")."""
    if ids is not None:
        try:
            out = [int(t) for t in (ids.replace(",", " ").split() if isinstance(ids, str) else ids)]
        except (ValueError, TypeError):
            raise GptconvError(f"--ids '{ids}': expected integers separated by commas or spaces") from None
        bad = [i for i in out if not 0 <= i < src.config.vocab_size]
        if bad or not out:
            raise GptconvError(f"--ids: {bad[0] if bad else 'nothing'} is not a token id in 0 … {src.config.vocab_size - 1}")
    elif text is None:
        raise GptconvError("give a TEXT or --ids")
    else:
        out = (tokenizer or load_tokenizer(src)).encode(text, add_special_tokens=add_special_tokens)
        if not out:
            raise GptconvError("the text gives no tokens")
        in_vocabulary(src, out)
    if len(out) > src.config.context_length:
        raise GptconvError(f"the prompt is {len(out):,} tokens; this model's context holds "
                           f"{src.config.context_length:,}")
    return out


def in_vocabulary(src: Source, ids: list[int] | torch.Tensor) -> None:
    """Refuse in one line the ids of a tokenizer that gives tokens the model has no row for."""
    top = int(max(ids)) if len(ids) else -1
    if top >= src.config.vocab_size:
        raise where(src.path, f"its tokenizer gives token id {top:,}, past the model's vocabulary of "
                              f"{src.config.vocab_size:,} (ids 0 … {src.config.vocab_size - 1:,})")


ENGINES = ("gptconv", "llama.cpp")


def export(source: str | Path, out: str | Path, format: str = "safetensors", dtype: str = "f32",
           max_shard_bytes: int = SHARD_BYTES, force: bool = False, clamp: bool = False,
           revision: str | None = None, check: str | Path | None = None, check_ctx: int | None = None,
           check_in: str = "gptconv", on_window: Callable[[int, int], None] = lambda n, total: None,
           on_tensor: Callable[[int, int], None] = lambda done, total: None) -> ExportSummary:
    """Write ``source`` as an HF folder (``format="safetensors"``, shards of at most
    ``max_shard_bytes``) or a GGUF file (``format="gguf"``); see ``writers``. With ``check``, a text
    file: then the written model's perplexity on it against ``source`` (the ``perplexity`` report),
    the written file run by ``check_in`` — gptconv (dequantized) or llama.cpp (a GGUF as stored)."""
    if check is not None:  # what the check needs is checked before the export, not after it
        if check_in not in ENGINES:
            raise GptconvError(f"--against {check_in}: choose {' or '.join(ENGINES)}")
        if check_in == "llama.cpp":
            from .llamacpp import library
            library("--against llama.cpp")
            if format != "gguf":
                raise GptconvError("--against llama.cpp runs a GGUF file: export with --format gguf")
        src = open_source(source, revision)
        limit = src.config.context_length
        check_ctx = check_ctx or min(512, limit - limit % 2)
        check_windows(load_tokenizer(src).encode_long(read_text(Path(check), JSON_LIMIT)), check_ctx, limit, check,
                      "--check-ctx")
        if check_in == "gptconv":  # the written model beside the source in float32, checked before writing
            memory.check(memory.perplexity_need(src.name, memory.Shape.of(src.config),
                                                torch.float32, check_ctx, True))
    summary = write(source, out, format, dtype, max_shard_bytes, force, clamp, revision, on_tensor)
    if check is not None:
        summary.check = perplexity(summary.out, check, check_ctx, source, revision=revision, on_window=on_window,
                                   engine=check_in)
    return summary




def perplexity(source: str | Path, text_file: str | Path, ctx: int = 512, against: str | Path | None = None,
               dtype: str = "float32", revision: str | None = None,
               on_window: Callable[[int, int], None] = lambda n, total: None, engine: str = "gptconv",
               device: str = "cpu") -> Perplexity:
    """Perplexity of SOURCE on a text file as llama.cpp's llama-perplexity scores it (``perplexity.py``);
    ``against``: a base model (the same tokenizer, run here in float32) whose next-token distributions
    this one is compared with: KL divergence, top-1 agreement, Δ perplexity. ``engine="llama.cpp"``
    runs SOURCE, a GGUF file, in llama.cpp as stored (its quantized kernels, its tokenizer)."""
    if engine not in ENGINES:
        raise GptconvError(f"--in {engine}: choose {' or '.join(ENGINES)}")
    device = parse_device(device)
    text_file = Path(text_file)
    text = read_text(text_file, JSON_LIMIT)
    src = open_source(source, revision)
    if engine == "gptconv":
        tok = load_tokenizer(src)
        ids = tok.encode_long(text)  # (N,): in pieces, memory a small multiple of the text
        in_vocabulary(src, ids)
        adds_bos = tok.bos_id is not None and ids[:1].tolist() == [tok.bos_id] and \
            tok.encode(text[:PROBE], False)[:1] != [tok.bos_id]
        check_windows(ids, ctx, src.config.context_length, text_file)
        if device.type == "cpu":
            memory.check(memory.perplexity_need(src.name, memory.Shape.of(src.config), parse_dtype(dtype), ctx,
                                                against is not None))
        base = _perplexity_base(against, revision, text, ids, src.config.vocab_size, ctx, text_file, device)
        m = measure(load_source(src, parse_dtype(dtype), device), ids, ctx, tok.bos_id if adds_bos else None, base,
                    on_window)
        return summarize(str(source), str(text_file), ctx, m, None if against is None else str(against),
                         f"gptconv, {parse_dtype(dtype)}".replace("torch.", ""))
    from .llamacpp import LlamaCpp, library, version
    library("--in llama.cpp")
    if src.format != "gguf":
        raise where(src.path, "--in llama.cpp runs a GGUF file (export one with `gptconv export --format gguf`)")
    if parse_dtype(dtype) != torch.float32:
        raise GptconvError(f"--dtype {dtype}: llama.cpp runs the file as stored")
    with LlamaCpp(src.path, ctx) as llm:
        ids = llm.tokenize(text)
        check_windows(ids, ctx, src.config.context_length, text_file)
        base = _perplexity_base(against, revision, text, ids, src.config.vocab_size, ctx, text_file, device)

        def run(window: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(llm.logits(window[0].tolist()))[None]
        m = measure(run, ids, ctx, llm.bos_replacing_first, base, on_window)
    types = ", ".join(sorted(set(src.stored_types.values())))
    return summarize(str(source), str(text_file), ctx, m, None if against is None else str(against),
                     f"llama.cpp (llama-cpp-python {version()}), the file as stored ({types}), F32 KV cache")


PROBE = 4096  # characters enough to see whether a text's own first token is BOS


def _perplexity_base(against: str | Path | None, revision: str | None, text: str, ids: list[int], vocab_size: int,
                     ctx: int, text_file: Path, device: torch.device) -> torch.nn.Module | None:
    """The base model of a comparison, in float32, when its tokenizer splits the text into the same ids."""
    if against is None:
        return None
    base_src = open_source(against, revision)
    if base_src.config.vocab_size != vocab_size or not torch.equal(load_tokenizer(base_src).encode_long(text),
                                                                   torch.as_tensor(ids, dtype=torch.long)):
        raise GptconvError(f"--against {against}: its tokenizer does not split the text into the same tokens; "
                           "the two cannot be compared token by token")
    check_windows(ids, ctx, base_src.config.context_length, text_file)
    return load_source(base_src, torch.float32, device)


@dataclass
class TensorEntry:
    name: str
    dtype: str  # torch's name, or GGUF's type (Q4_1, F32, …)
    shape: tuple[int, ...]


@dataclass
class Inspection(Result):
    path: Path
    kind: str
    config: dict | None
    metadata: dict
    tensors: list[TensorEntry]


def inspect(path: str | Path) -> Inspection:
    """Tensors (name, dtype, shape), metadata and config of a file or checkpoint folder."""
    path = Path(path)
    if path.is_dir():
        ckpt = open_hf_folder(path)
        infos, kind, config, meta = ckpt.tensors, "hf-folder", ckpt.config, {}
    elif path.suffix == ".safetensors":
        infos, kind, config = read_safetensors(path), "safetensors", None
        from safetensors import safe_open
        meta = safe_open(str(path), framework="pt").metadata() or {}
    elif path.suffix == ".gguf":
        from .sources.gguf_file import open_gguf
        g = open_gguf(path)
        meta = {k: _short(f) for k, f in g.fields.reader.fields.items() if not k.startswith("GGUF.")}
        tensors = [TensorEntry(n, g.stored_types[n], i.shape) for n, i in sorted(g.tensors.items())]
        return Inspection(path, "gguf", None, meta, tensors)
    elif path.suffix in (".bin", ".pt", ".pth"):
        infos, kind, config, meta = read_torch_bin(path), "pytorch", None, {}
    elif not path.exists():
        raise where(path, "no such file or folder")
    else:
        raise where(path, "unknown kind of file (expected a folder, .safetensors or .bin)")
    tensors = [TensorEntry(n, str(i.dtype).removeprefix("torch."), i.shape) for n, i in sorted(infos.items())]
    return Inspection(path, kind, config, meta, tensors)


def _short(field) -> object:
    """A GGUF metadata value for display: long arrays (vocabularies, merges) as their length."""
    try:
        value = field.contents()
    except Exception:  # bytes that do not decode (a string that is not UTF-8): shown as they are
        value = repr(bytes(field.parts[-1]))[:200] if field.parts else "(unreadable)"
    if isinstance(value, list) and len(value) > 8:
        return f"[{len(value):,} items]"
    return value


__all__ = ["ExportSummary", "Generation", "Inspection", "PullSummary", "Report", "Trace", "export", "generate",
           "inspect", "pull", "record_reference", "trace", "verify"]
