"""Text ↔ token ids with the ``tokenizers`` library, from a checkpoint's own tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from .errors import GptconvError, where


class Tokenizer:
    def __init__(self, tk: HFTokenizer, eos_id: int | None = None, bos_id: int | None = None,
                 chat_template: str | None = None) -> None:
        self.tk, self.eos_id, self.bos_id, self.chat_template = tk, eos_id, bos_id, chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Special tokens written in ``text`` (``<|endoftext|>``) become their ids, as in transformers."""
        return self.tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tk.decode(ids, skip_special_tokens=skip_special_tokens)

    def token(self, id: int) -> str:
        return self.tk.id_to_token(id)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The checkpoint's chat template rendered in a sandbox (a template is untrusted input)."""
        if self.chat_template is None:
            raise GptconvError("this model has no chat template")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        special = lambda i: self.token(i) if i is not None else ""  # noqa: E731
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=special(self.bos_id), eos_token=special(self.eos_id))
        except TemplateError as e:
            raise GptconvError(f"the chat template failed: {e}") from None

    @classmethod
    def from_folder(cls, folder: Path, eos_id: int | None = None, bos_id: int | None = None) -> Tokenizer:
        """``tokenizer.json`` if present, else GPT-2's ``vocab.json`` + ``merges.txt``."""
        folder = Path(folder)
        config = _json_or_empty(folder / "tokenizer_config.json")
        if (folder / "tokenizer.json").exists():
            try:
                tk = HFTokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as e:  # the library raises plain Exception for a corrupt file
                raise where(folder / "tokenizer.json", f"not a readable tokenizer ({e})") from None
        elif (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
            tk = _byte_level_bpe(folder)
        else:
            raise where(folder, "no tokenizer: expected tokenizer.json, or vocab.json and merges.txt")
        _add_special_tokens(tk, config, _json_or_empty(folder / "special_tokens_map.json"))
        template = config.get("chat_template")
        return cls(tk, eos_id, bos_id, template if isinstance(template, str) else None)


def _byte_level_bpe(folder: Path) -> HFTokenizer:
    # GPT-2's byte-level BPE, assembled the way transformers' GPT2 converter does it.
    try:
        bpe = models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    except Exception as e:
        raise where(folder, f"vocab.json / merges.txt are not a BPE vocabulary ({e})") from None
    tk = HFTokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk


def _add_special_tokens(tk: HFTokenizer, config: dict, special_map: dict) -> None:
    """Tokens transformers treats as special (matched whole in text, never split)."""
    names = []
    for entry in (config.get("added_tokens_decoder") or {}).values():
        if isinstance(entry, dict) and isinstance(entry.get("content"), str):
            names.append(entry["content"])
    for source in (special_map, config):
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = source.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                names.append(value)
    known = tk.get_vocab(with_added_tokens=True)
    # Only tokens the vocabulary has: marking them special must never create new ids.
    tk.add_special_tokens([n for n in dict.fromkeys(names) if n in known])


def _json_or_empty(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise where(path, f"not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise where(path, "not a JSON object")
    return data


def load_tokenizer(source: object) -> Tokenizer:
    """The tokenizer of an opened source (see ``gptconv.loader.open_source``)."""
    cfg = source.config
    if source.format == "gguf":
        from .convert.gguf_tokenizer import tokenizer_from_gguf
        tk, template = tokenizer_from_gguf(source.gguf.fields)
        return Tokenizer(tk, cfg.eos_token_id, cfg.bos_token_id, template)
    return Tokenizer.from_folder(source.path, cfg.eos_token_id, cfg.bos_token_id)
