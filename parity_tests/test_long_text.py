"""Long texts (perplexity's) are tokenized in pieces, in memory a small multiple of the text, to exactly
the ids of one call on the whole text — checked on real vocabularies (llama.cpp's test vocabularies)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gptconv
import gptconv.tokenizer as tokenizer
import llama_cpp_tools

ALICE = (Path(__file__).parent / "data" / "alice-chapter-1.txt").read_text(encoding="utf-8")


def hostile_text() -> str:
    """Alice, llama.cpp's tokenizer test texts (spaces, newlines, digits, CJK, emoji) and runs that cross
    piece boundaries: long words, long whitespace (shorter than the margin: a run longer than that may
    split where the piece starts, which the next test covers)."""
    cases = "\n".join(t for t, _ in llama_cpp_tools.vocab_cases("llama-bpe"))
    return (ALICE + cases + " " * 250 + "a" * 250 + "\n\n\n" + "🙂" * 100) * 3


@pytest.mark.parametrize("vocab", ["gpt-2", "llama-bpe", "llama-spm", "qwen2", "phi-3"])
def test_pieces_give_the_ids_of_one_call(vocab, monkeypatch):
    monkeypatch.setattr(tokenizer, "PIECE", 2000)  # many stitches on a text of ~100k characters
    monkeypatch.setattr(tokenizer, "MARGIN", 600)
    tok = gptconv.load_tokenizer(str(llama_cpp_tools.vocab_file(vocab)))
    text = hostile_text()
    whole = tok.encode(text)
    calls = []
    encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda t, *a, **k: calls.append(len(t)) or encode(t, *a, **k))
    ids = tok.encode_long(text)
    assert ids.dtype == torch.long and ids.tolist() == whole
    assert len(text) not in calls  # stitched, not tokenized whole as a fallback


def test_splits_that_reach_past_the_margin_fall_back_to_one_call(monkeypatch):
    """Llama 3's pre-tokenizer cuts a long run of spaces into pieces counted from the run's start: a piece
    starting inside a 5,000-space run under a margin of 300 cuts it elsewhere, the two neighbours disagree,
    and the text is tokenized whole — the ids are still those of one call."""
    monkeypatch.setattr(tokenizer, "PIECE", 2000)
    monkeypatch.setattr(tokenizer, "MARGIN", 300)
    tok = gptconv.load_tokenizer(str(llama_cpp_tools.vocab_file("llama-bpe")))
    text = (ALICE[:3000] + " " * 5000) * 3  # a cut inside each run
    calls = []
    encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda t, *a, **k: calls.append(len(t)) or encode(t, *a, **k))
    assert tok.encode_long(text).tolist() == encode(text)
    assert len(text) in calls  # it did fall back


def _peak_rss_tokenizing(text_file: Path, tokenizer: Path) -> int:
    """Peak RSS (bytes) of a process that imports gptconv and tokenizes ``text_file`` with encode_long."""
    import subprocess
    import sys
    code = ("import resource, sys, gptconv; from pathlib import Path; tok = gptconv.load_tokenizer(sys.argv[1]); "
            "ids = tok.encode_long(Path(sys.argv[2]).read_text(encoding='utf-8')); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")  # KiB on Linux
    r = subprocess.run([sys.executable, "-c", code, str(tokenizer), str(text_file)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return int(r.stdout.split()[-1]) * 1024


def test_a_long_text_takes_memory_of_its_own_size(tmp_path, smollm2):
    """perplexity's tokenization of 8 MB of text: one call took ~2 GB (250× the text); in pieces, the
    process grows by a few times the text over importing gptconv and tokenizing 100 kB."""
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text(ALICE * 4, encoding="utf-8")
    large.write_text((ALICE * (8_000_000 // len(ALICE) + 1))[:8_000_000], encoding="utf-8")
    base = _peak_rss_tokenizing(small, smollm2)
    grown = _peak_rss_tokenizing(large, smollm2) - base
    print(f"\ntokenizing 8 MB: {grown / 1e6:.0f} MB over a 100 kB text ({grown / 8e6:.1f}× the text)")
    assert grown < 10 * 8_000_000
