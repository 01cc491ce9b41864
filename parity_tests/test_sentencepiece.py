"""SentencePiece tokenizers (Llama 2, TinyLlama, Mistral): a bare tokenizer.model, a tokenizer.json
with byte fallback, and GGUF SentencePiece vocabularies, against sentencepiece, transformers and
llama.cpp. The vocabulary is Llama 2's (llama.cpp's ggml-vocab-llama-spm.gguf, as a tokenizer.model)."""

from __future__ import annotations

import os
import shutil

import pytest

import gptconv
import llama_cpp_tools
from gptconv.writers import export
from gptconv.llamacpp import LlamaCpp
from gptconv.tokenizer import Tokenizer
from helpers import TORTURE, run_cli

PLAIN = [t for t in TORTURE if "<" not in t]  # no special tokens: sentencepiece does not parse them
# transformers 5 converts a bare tokenizer.model with merges ranked by piece id, not by score: Llama's
# whitespace pieces ("▁▁", id 259) score -1e9, so these come out differently from sentencepiece's.
TRANSFORMERS_5_DIFFERS = {" Hello", "  two  spaces  ", "   "}


@pytest.fixture(scope="module")
def spm_folder(converter_fixtures):
    return converter_fixtures["llama2-spm"]  # tokenizer.model + tokenizer_config.json


@pytest.fixture(scope="module")
def json_folder(spm_folder, tmp_path_factory):
    """The same tokenizer saved by transformers as tokenizer.json, without the tokenizer.model."""
    from transformers import AutoTokenizer
    folder = tmp_path_factory.mktemp("spm-json") / "llama2-json"
    shutil.copytree(spm_folder, folder)
    (folder / "tokenizer.model").unlink()
    AutoTokenizer.from_pretrained(spm_folder).save_pretrained(folder)
    (folder / "tokenizer.model").unlink(missing_ok=True)
    assert (folder / "tokenizer.json").is_file()
    return folder


def test_a_bare_tokenizer_model_tokenizes_as_sentencepiece(spm_folder):
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_folder / "tokenizer.model"))
    ours = Tokenizer.from_folder(spm_folder)
    for text in PLAIN:
        ids = sp.encode(text)
        assert ours.encode(text, add_special_tokens=False) == ids, text
        assert ours.decode(ids) == sp.decode(ids), text
    assert ours.encode("Hello")[0] == sp.bos_id()  # BOS added, as transformers' Llama tokenizer does


def test_a_bare_tokenizer_model_against_transformers(spm_folder):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(spm_folder)
    ours = Tokenizer.from_folder(spm_folder)
    for text in PLAIN:
        same = ours.encode(text, add_special_tokens=False) == hf(text, add_special_tokens=False)["input_ids"]
        assert same == (text not in TRANSFORMERS_5_DIFFERS), text


def test_a_tokenizer_json_tokenizes_as_transformers(json_folder):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(json_folder)
    ours = Tokenizer.from_folder(json_folder)
    for text in TORTURE:
        assert ours.encode(text) == hf(text)["input_ids"], text
        assert ours.decode(ours.encode(text)) == hf.decode(hf(text)["input_ids"]), text


def test_gguf_sentencepiece_vocabulary_tokenizes_as_llama_cpp(spm_folder, tmp_path):
    """llama.cpp's converter writes the vocabulary; our reading of its file gives llama.cpp's ids."""
    path = llama_cpp_tools.convert(spm_folder, tmp_path / "llama2.gguf")
    tok = gptconv.load_tokenizer(str(path))
    with LlamaCpp(path, vocab_only=True) as llm:
        for text in TORTURE:
            for add in (True, False):
                assert tok.encode(text, add_special_tokens=add) == llm.tokenize(text, add_special=add), (text, add)


def test_export_of_a_tokenizer_json_runs_in_llama_cpp_as_in_transformers(json_folder, tmp_path):
    """From a tokenizer.json alone, llama.cpp's converter gives every piece the score -1000, and llama.cpp,
    which merges by score, then splits accented words differently; ours scores pieces by merge rank.
    What stays apart is a text that starts with a space: transformers 5 adds no prefix to it, llama.cpp does."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(json_folder)
    ours = tmp_path / "ours.gguf"
    export(str(json_folder), ours, "gguf", "f32")
    theirs = llama_cpp_tools.convert(json_folder, tmp_path / "theirs.gguf")
    differs = {}
    for path in (ours, theirs):
        with LlamaCpp(path, vocab_only=True) as llm:
            differs[path] = {t for t in PLAIN if llm.tokenize(t, add_special=False) != hf(t, add_special_tokens=False)["input_ids"]}
    assert differs[ours] == {t for t in PLAIN if t.startswith(" ")}
    assert differs[theirs] > differs[ours] and "café naïve Ærø" in differs[theirs]


def test_unsupported_sentencepiece_models_are_refused(spm_folder, tmp_path):
    from sentencepiece import sentencepiece_model_pb2 as schema
    folder = tmp_path / "unigram"
    shutil.copytree(spm_folder, folder)
    model = schema.ModelProto()
    model.ParseFromString((folder / "tokenizer.model").read_bytes())
    model.trainer_spec.model_type = schema.TrainerSpec.UNIGRAM
    (folder / "tokenizer.model").write_bytes(model.SerializeToString())
    r = run_cli("trace", folder, "Hello")
    assert r.returncode == 2 and "model type UNIGRAM is not supported" in r.stderr
    (folder / "tokenizer.model").write_bytes(b"\x0a\xff\xff not a model")
    r = run_cli("trace", folder, "Hello")
    assert r.returncode == 2 and "not a readable SentencePiece model" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_missing_sentencepiece_is_one_line_naming_the_extra(spm_folder, tmp_path):
    blocker = tmp_path / "no-sentencepiece"
    blocker.mkdir()
    (blocker / "sentencepiece.py").write_text("raise ImportError('sentencepiece is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = run_cli("trace", spm_folder, "Hello", env=env)
    assert r.returncode == 2 and "gptconv[sentencepiece]" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_chat_prompt_has_one_bos(json_folder, tmp_path):
    """A chat template writes its own BOS; the tokenizer must not add another (as transformers'
    apply_chat_template, which tokenizes without special tokens)."""
    import json

    from transformers import AutoTokenizer
    folder = tmp_path / "chat"
    shutil.copytree(json_folder, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    result = gptconv.generate(folder, "Hello there", 1, chat=True)
    want = AutoTokenizer.from_pretrained(folder).apply_chat_template([{"role": "user", "content": "Hello there"}],
                                                                     tokenize=True)
    want = want if isinstance(want, list) else want["input_ids"]  # transformers 5: a BatchEncoding
    assert result.prompt_ids == list(want)
    bos = gptconv.load_tokenizer(folder).bos_id
    assert result.prompt_ids[0] == bos and result.prompt_ids[1] != bos
