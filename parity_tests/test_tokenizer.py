"""Our token ids (``tokenizers``) equal transformers' AutoTokenizer ids, from either file form."""

from __future__ import annotations

import shutil

import pytest

from gptconv.tokenizer import Tokenizer

STRINGS = [
    "The capital of France is",
    "hello world",
    "   leading spaces, trailing spaces   ",
    "tabs\t\tand\nnew\n\n\nlines and     runs",
    "café naïve Ærø Ünïcödé",
    "你好世界, こんにちは",
    "emoji 🙂🚀👩‍👩‍👧",
    "digits 1234567890 3.14159 -42",
    "<|endoftext|>",
    "one<|endoftext|>two <|endoftext|> three",
    "",
]


@pytest.fixture(scope="module")
def folders(ckpts, tmp_path_factory):
    """The fixture's vocab.json + merges.txt, and the same tokenizer as a tokenizer.json only."""
    from transformers import AutoTokenizer
    slow = ckpts["tiny"]
    fast = tmp_path_factory.mktemp("tok") / "tokenizer-json"
    shutil.copytree(slow, fast)
    AutoTokenizer.from_pretrained(slow).save_pretrained(fast)
    (fast / "vocab.json").unlink()
    (fast / "merges.txt").unlink()
    assert (fast / "tokenizer.json").exists()
    return {"vocab+merges": slow, "tokenizer.json": fast}


@pytest.mark.parametrize("form", ["vocab+merges", "tokenizer.json"])
def test_ids_equal_transformers(folders, form):
    from transformers import AutoTokenizer
    ref = AutoTokenizer.from_pretrained(folders[form])
    ours = Tokenizer.from_folder(folders[form])
    for text in STRINGS:
        assert ours.encode(text) == ref(text)["input_ids"], text
        assert ours.decode(ours.encode(text)) == text


def test_end_of_text_is_one_special_token(folders):
    ours = Tokenizer.from_folder(folders["vocab+merges"])
    assert ours.encode("<|endoftext|>") == [0]
