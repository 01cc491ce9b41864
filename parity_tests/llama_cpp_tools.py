"""llama.cpp's own tools, the yardsticks nobody on this project wrote: its HF → GGUF converter
(``convert_hf_to_gguf.py`` with its own ``gguf-py``) and its tokenizer test vocabularies
(``models/ggml-vocab-*.gguf`` with ``.inp`` / ``.out`` cases), from llama-cpp-python's source
distribution. ``make test`` unpacks them into .venv/llama.cpp-0.3.36 (GPTCONV_LLAMA_CPP_SRC names
another place).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader


def source() -> Path:
    folder = Path(os.environ.get("GPTCONV_LLAMA_CPP_SRC") or Path(__file__).parents[1] / ".venv" / "llama.cpp-0.3.36")
    if not (folder / "convert_hf_to_gguf.py").is_file():
        pytest.fail(f"llama.cpp's sources are not unpacked in {folder} (`make test` unpacks them)")
    return folder


def vocab_file(name: str) -> Path:
    return source() / "models" / f"ggml-vocab-{name}.gguf"


def vocab_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test cases: texts split on its separator, ids without special tokens."""
    path = vocab_file(name)
    texts = path.with_name(path.name + ".inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").split("\n")
    texts = texts[:-1] if texts[-1] == "" else texts
    lines = lines[:len(texts)]
    assert len(lines) == len(texts) and all(line.strip() or not t for line, t in zip(lines, texts)), path
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]


# llama.cpp's converter reading config.json itself, as it does where transformers cannot load the config: its
# AutoConfig(...).to_dict() path drops the legacy keys some of its model classes read (gptneox: rotary_pct)
RAW_CONFIG = "--raw-config"
# the converter run once per output type in one process (its imports, torch's and transformers', paid once):
# argv = [source, raw (0/1), script, then each run's arguments as one JSON list]
_RUNS = ("import json, runpy, sys; source, raw, script, runs = sys.argv[1], sys.argv[2] == '1', sys.argv[3], "
         "json.loads(sys.argv[4]); sys.path.insert(0, source)\n"
         "if raw:\n    import conversion.base as b\n"
         "    def refuse(*a, **k): raise ValueError('config.json read as it is')\n"
         "    b.AutoConfig.from_pretrained = refuse\n"
         "for run in runs:\n    sys.argv = [script, *run]\n"
         "    try:\n        runpy.run_path(script, run_name='__main__')\n"
         "    except SystemExit as e:\n        if e.code not in (0, None): raise\n")


def convert(folder: Path, out: Path, outtype: str = "f32", options: tuple[str, ...] = ()) -> Path:
    """llama.cpp's converter on an HF folder, in its own process with its own gguf-py; ``options``: more of
    its flags (``--no-mtp``: without the multi-token-prediction layers, which it otherwise requires), and
    ``RAW_CONFIG``: config.json read as the file says it, not through transformers."""
    return convert_each(folder, {outtype: out}, options)[outtype]


def convert_each(folder: Path, outs: dict[str, Path], options: tuple[str, ...] = ()) -> dict[str, Path]:
    """``convert`` to each output type of ``outs`` (type → file), the converter run once per type in one
    process (as many processes as types cost each the converter's imports again: ~4 s)."""
    script = str(source() / "convert_hf_to_gguf.py")
    flags = [o for o in options if o != RAW_CONFIG]
    runs = [[str(folder), "--outfile", str(out), "--outtype", outtype, *flags] for outtype, out in outs.items()]
    r = subprocess.run([sys.executable, "-c", _RUNS, str(source()), "1" if RAW_CONFIG in options else "0", script,
                        json.dumps(runs)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(outs)


_TOKENIZERS: dict[Path, Path] = {}  # a GGUF vocabulary → its tokenizer files, made once per process


def hf_tokenizer_from_gguf(gguf_path: Path, folder: Path) -> None:
    """transformers' own conversion of a GGUF vocabulary into tokenizer.json + tokenizer_config.json (made once
    per process and copied: the conversion costs seconds, the files do not depend on the folder)."""
    import shutil
    import tempfile
    if gguf_path not in _TOKENIZERS:
        from transformers import AutoTokenizer
        made = Path(tempfile.mkdtemp(prefix="gptconv-tokenizer-"))
        AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(made)
        _TOKENIZERS[gguf_path] = made
    folder.mkdir(parents=True, exist_ok=True)
    for file in _TOKENIZERS[gguf_path].iterdir():
        shutil.copyfile(file, folder / file.name)


def no_dummy_prefix(folder: Path) -> None:
    """A SentencePiece-style tokenizer.json that puts no ▁ before the text (Gemma 4's, llama.cpp's gemma4)."""
    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text())

    def edit(node):
        if isinstance(node, dict):
            if "prepend_scheme" in node:
                node["prepend_scheme"] = "never"
            if node.get("type") == "Prepend":  # a normalizer that puts ▁ first
                node["prepend"] = ""
            for v in node.values():
                edit(v)
        elif isinstance(node, list):
            for v in node:
                edit(v)
    edit(spec)
    path.write_text(json.dumps(spec, ensure_ascii=False))


def our_tokenizer_from_gguf(gguf_path: Path, folder: Path) -> None:
    """Our reading of a GGUF vocabulary (its ids equal llama.cpp's: test_tokenizer_cases.py) saved as
    tokenizer.json, where transformers' own conversion is not faithful: for Llama 3's it adds a
    128,257th token and drops the BOS template and ignore_merges."""
    import gptconv
    tok = gptconv.load_tokenizer(str(gguf_path))
    tok.tk.save(str(folder / "tokenizer.json"))
    name = lambda i: tok.token(i) if i is not None else None  # noqa: E731
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name(tok.bos_id), "eos_token": name(tok.eos_id),
        "clean_up_tokenization_spaces": False}))


def sentencepiece_model_from_gguf(gguf_path: Path, out: Path) -> None:
    """A tokenizer.model with a GGUF SentencePiece vocabulary's pieces, scores and types, built with
    sentencepiece's own schema; the rest as in Llama 2's (BPE, byte fallback, identity normalization,
    dummy prefix, whitespace kept)."""
    from sentencepiece import sentencepiece_model_pb2 as schema
    fields = GGUFReader(gguf_path).fields
    model = schema.ModelProto()
    for piece, score, kind in zip(*(fields[f"tokenizer.ggml.{k}"].contents() for k in ("tokens", "scores", "token_type"))):
        p = model.pieces.add()
        p.piece, p.score, p.type = piece, score, kind
    t = model.trainer_spec
    t.model_type, t.vocab_size, t.byte_fallback = schema.TrainerSpec.BPE, len(model.pieces), True
    t.unk_id, t.bos_id, t.eos_id, t.pad_id = 0, 1, 2, -1
    n = model.normalizer_spec
    n.name, n.add_dummy_prefix, n.remove_extra_whitespaces, n.escape_whitespaces = "identity", True, False, True
    out.write_bytes(model.SerializeToString())


def phi3_added_tokens(folder: Path) -> None:
    """Phi-3 mini's chat tokens (ids 32000 … 32010, read from llama.cpp's phi-3 test vocabulary) as
    Phi-3's folder has them: added_tokens.json, and special in tokenizer_config.json."""
    tokens = GGUFReader(vocab_file("phi-3")).fields["tokenizer.ggml.tokens"].contents()[32000:32011]
    added = {t: 32000 + n for n, t in enumerate(tokens)}
    (folder / "added_tokens.json").write_text(json.dumps(added))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {str(i): {"content": t, "special": True} for t, i in added.items()}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


class PlainReader(GGUFReader):
    """gguf-py's GGUFReader reading through a plain ndarray view of its memory map: the same bytes, so the same
    fields (parts, types, data) and tensors, parsed ~3× faster. numpy's memmap subclass runs Python code on
    every slice (``__getitem__``, ``__array_finalize__``), and the reader takes one or two slices per item: for
    Qwen2's 151,936 tokens and 151,387 merges that was 9 s of a 12 s parse."""

    def _get(self, offset, dtype, count=1, override_order=None):
        if type(self.data) is np.memmap:
            self.data = self.data.view(np.ndarray)  # still the file's mapping, not a copy
        return super()._get(offset, dtype, count, override_order)


def _raw(field) -> bytes:
    return b"".join(np.asarray(part).tobytes() for part in field.parts)


def differences(ours: Path | GGUFReader, theirs: Path | GGUFReader) -> tuple[dict[str, tuple], list[str]]:
    """(metadata keys whose values differ → (ours, theirs)), and every tensor that differs in name,
    type, shape or bytes. Values are compared as the bytes the files hold (type included). Either file may
    be given already read (``PlainReader``), for a caller that reads its fields too."""
    # each read once: ~3 s for Llama 3's 128k tokens and 280k merges (~10 s through np.memmap)
    ra, rb = (f if isinstance(f, GGUFReader) else PlainReader(f) for f in (ours, theirs))
    a = {k: f for k, f in ra.fields.items() if not k.startswith("GGUF.")}
    b = {k: f for k, f in rb.fields.items() if not k.startswith("GGUF.")}
    show = lambda f: "<absent>" if f is None else f.contents() if len(f.data) < 20 else f"[{len(f.data)} items]"  # noqa: E731
    keys = {k: (show(a.get(k)), show(b.get(k))) for k in sorted(set(a) | set(b))
            if k not in a or k not in b or _raw(a[k]) != _raw(b[k])}
    ta, tb = {t.name: t for t in ra.tensors}, {t.name: t for t in rb.tensors}
    problems = [f"only in ours: {n}" for n in sorted(set(ta) - set(tb))] + [f"only in theirs: {n}" for n in sorted(set(tb) - set(ta))]
    for n in sorted(set(ta) & set(tb)):
        x, y = ta[n], tb[n]
        if x.tensor_type != y.tensor_type or list(x.shape) != list(y.shape):
            problems.append(f"{n}: {x.tensor_type.name} {list(x.shape)} against {y.tensor_type.name} {list(y.shape)}")
        elif not np.array_equal(np.asarray(x.data).view(np.uint8), np.asarray(y.data).view(np.uint8)):
            problems.append(f"{n}: different bytes")
    return keys, problems


def add_n_ctx(folder: Path) -> None:
    """llama.cpp's converter reads GPT-2's context as n_ctx, which transformers 5 no longer saves."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.setdefault("n_ctx", config["n_positions"])
    path.write_text(json.dumps(config, indent=2))


def quantize(path: Path, out: Path, ftype: str) -> Path:
    """llama.cpp's own quantizer (``llama-quantize``) on a GGUF file: ``ftype`` as llama.cpp names its
    mixes (``Q4_K_M``, ``Q6_K``, …)."""
    import ctypes

    from gptconv.llamacpp import library
    lib = library()
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    assert lib.llama_model_quantize(str(path).encode(), str(out).encode(), ctypes.byref(params)) == 0
    return out
