"""The tokenizer a GGUF file carries (``tokenizer.ggml.*``), read, written, and run as llama.cpp runs it.

Two kinds: byte-level BPE (``tokenizer.ggml.model = gpt2``: tokens, merges, a pre-tokenizer named
by ``tokenizer.ggml.pre``) and SentencePiece (``llama``: tokens, scores, token types; see
``spm.py``). ``GGUFVocab`` is the metadata as data; ``GGUFVocab.tokenizer()`` builds the
``tokenizers`` Tokenizer that gives llama.cpp's ids for it, defaults included (llama.cpp adds a BOS
for SentencePiece and Llama 3 vocabularies unless the file says otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf import GGUFWriter, Keys
from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from ..errors import NoTokenizer, where
from . import spm
from .spm import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED  # noqa: F401  (llama.cpp's token types)

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _split_then_bytes(regex: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


# llama.cpp's pre-tokenizer names → (how the text is split, whether a word in the vocabulary is
# taken whole before any merge: llama.cpp's ignore_merges, tokenizers' BPE(ignore_merges=True))
_LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")


def _pre_tokenizer(name: str) -> pre_tokenizers.PreTokenizer | None:
    if name in ("gpt-2", "gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    if name == "smollm":  # SmolLM2's own tokenizer.json: every digit apart, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    if name in _LLAMA3_NAMES or name == "smaug-bpe":
        return _split_then_bytes(_LLAMA3_SPLIT)
    if name in ("qwen2", "deepseek-r1-qwen"):
        return _split_then_bytes(_QWEN2_SPLIT)
    return None


PRE_TOKENIZER_NAMES = ("gpt-2", "smollm", "llama-bpe", "qwen2")  # as llama.cpp spells them


# Tokens llama.cpp treats as control tokens whatever their type in the file (it finds end-of-turn,
# end-of-generation and fill-in-the-middle tokens by their text when it loads a vocabulary;
# llama-vocab.cpp): Qwen2's "</s>" is a normal token in its GGUF yet one token in llama.cpp's hands.
_CONTROL_BY_TEXT = frozenset((
    "</s>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "[PAD]", "<PAD>", "<PRE>", "<SUF>", "<MID>", "<REPO>", "▁<PRE>",
    "▁<SUF>", "▁<MID>", "<end_of_turn>", "<end_of_utterance>", "<eos>", "<turn|>", "<reponame>",
    "<fim-prefix>", "<fim-suffix>", "<fim-middle>", "<fim-pad>", "<fim-repo>",
    "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>",
    "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|fim_repo|>", "<|file_sep|>",
    "<|repo_name|>", "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>", "<|prefix|>", "<|suffix|>",
    "<|middle|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<|end_of_text|>",
    "<|return|>", "<|call|>", "<|calls|>", "<|flush|>", "<|tool_response>", "[e~[",
    "<｜end▁of▁sentence｜>", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>",
))
# ... except in a vocabulary that marks its "</s>" as a normal one (Gemma 4 by its "<|tool_response>", PLaMo
# by an end-of-generation "<|plamo:eos|>"): there llama.cpp makes "</s>" a normal token, whatever its type.
_NORMAL_S_MARKERS = ("<|tool_response>", "<|plamo:eos|>")
# Phi-3 (by general.name): llama.cpp strips the spaces after its special tokens, except these.
_KEEP_SPACE = ("<unk>", "<s>", "<|endoftext|>")  # special tokens that keep the space after them even so


def _rstrips_special(name: str) -> bool:
    """llama.cpp's vocabulary loader, for a model whose general.name contains one of the names a family
    lists (its ``gguf_vocab["rstrip_special_when_named"]``), strips the spaces after special tokens."""
    from ..families import FAMILIES
    return any(n in name.lower() for f in FAMILIES for n in f.gguf_vocab.get("rstrip_special_when_named", ()))

# The special tokens GGUF has keys for (tokenizer.ggml.bos_token_id, …) and the add_* flags.
ID_KEYS = {"bos": Keys.Tokenizer.BOS_ID, "eos": Keys.Tokenizer.EOS_ID, "unk": Keys.Tokenizer.UNK_ID,
            "sep": Keys.Tokenizer.SEP_ID, "pad": Keys.Tokenizer.PAD_ID, "mask": Keys.Tokenizer.MASK_ID,
            "eot": Keys.Tokenizer.EOT_ID, "eom": Keys.Tokenizer.EOM_ID}
_ADD_KEYS = {"bos": Keys.Tokenizer.ADD_BOS, "eos": Keys.Tokenizer.ADD_EOS, "sep": Keys.Tokenizer.ADD_SEP}


@dataclass
class GGUFVocab:
    """A tokenizer as GGUF stores it."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str | None  # the pre-tokenizer name; SentencePiece vocabularies say "default"
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None  # SentencePiece only
    merges: list[str] | None = None  # BPE only: "left right"
    special: dict[str, int] = field(default_factory=dict)  # bos, eos, unk, pad, … → id
    add: dict[str, bool] = field(default_factory=dict)  # bos / eos → added by the tokenizer, where said
    add_space_prefix: bool | None = None  # SentencePiece's dummy prefix, where said (llama.cpp: yes)
    chat_template: str | None = None
    name: str = ""  # general.name: llama.cpp keys a few token attributes on it (Phi-3)

    @classmethod
    def read(cls, f) -> GGUFVocab:
        """From a file's metadata (``gguf.GGUFFields``), every array checked against the token count."""
        model = f.get(Keys.Tokenizer.MODEL, str, None)
        if model is None:
            raise NoTokenizer(f"{f.path}: carries no tokenizer ({Keys.Tokenizer.MODEL} is absent)")
        if model not in ("gpt2", "llama", "gemma4"):
            raise where(f.path, f"tokenizer model '{model}' is not supported (byte-level BPE 'gpt2', "
                                "SentencePiece 'llama', Gemma 4's 'gemma4')")
        tokens = f.get(Keys.Tokenizer.LIST, list)
        types = f.get(Keys.Tokenizer.TOKEN_TYPE, list, [NORMAL] * len(tokens))
        scores = f.get(Keys.Tokenizer.SCORES, list, None) if model == "llama" else None
        merges = f.get(Keys.Tokenizer.MERGES, list, None) if model in ("gpt2", "gemma4") else None
        if len(types) != len(tokens) or (scores is not None and len(scores) != len(tokens)):
            raise where(f.path, f"tokenizer metadata is inconsistent: {len(tokens)} tokens, {len(types)} token types"
                                + (f", {len(scores)} scores" if scores is not None else ""))
        if model in ("gpt2", "gemma4") and (merges is None or any(not isinstance(m, str) or len(m.split(" ")) != 2 for m in merges)):
            raise where(f.path, "tokenizer metadata is inconsistent: BPE merges missing or malformed")
        if not all(isinstance(t, int) and 1 <= t <= 6 for t in types):
            raise where(f.path, "tokenizer metadata is inconsistent: token types outside 1 … 6")
        special = {}
        for kind, key in ID_KEYS.items():
            value = f.get(key, int, None)
            if value is not None:
                if not 0 <= value < len(tokens):
                    raise where(f.path, f"{key} = {value} is not a token id (the vocabulary has {len(tokens)})")
                special[kind] = value
        add = {kind: v for kind, key in _ADD_KEYS.items() if (v := f.get(key, bool, None)) is not None}
        return cls(model, f.get(Keys.Tokenizer.PRE, str, None), tokens, types, scores, merges, special, add,
                   f.get(Keys.Tokenizer.ADD_PREFIX, bool, None), f.get(Keys.Tokenizer.CHAT_TEMPLATE, str, None),
                   f.get(Keys.General.NAME, str, ""))

    def write(self, w: GGUFWriter) -> None:
        w.add_tokenizer_model(self.model)
        if self.pre is not None:
            w.add_tokenizer_pre(self.pre)
        w.add_token_list(self.tokens)
        if self.scores is not None:
            w.add_token_scores(self.scores)
        w.add_token_types(self.types)
        if self.merges is not None:
            w.add_token_merges(self.merges)
        for kind, token_id in self.special.items():
            w.add_uint32(ID_KEYS[kind], token_id)
        for kind, value in self.add.items():
            w.add_bool(_ADD_KEYS[kind], value)
        if self.add_space_prefix is not None:
            w.add_add_space_prefix(self.add_space_prefix)
        if self.chat_template is not None:
            w.add_chat_template(self.chat_template)

    def adds(self, kind: str) -> bool:
        """Does llama.cpp add this special token to a tokenized text? (its defaults where the file is silent)"""
        if kind in self.add:
            return self.add[kind]
        if kind == "bos":
            return self.model in ("llama", "gemma4") or self.pre in _LLAMA3_NAMES
        return False

    def llama_cpp_types(self) -> list[int]:
        """The token types llama.cpp tokenizes by: the file's, with the tokens it knows by their text made
        control tokens (``_CONTROL_BY_TEXT``), and "</s>" made normal where the vocabulary says so."""
        types = [CONTROL if t in _CONTROL_BY_TEXT and kind != CONTROL else kind for t, kind in zip(self.tokens, self.types)]
        eog = {self.tokens[i] for kind, i in self.special.items() if kind in ("eos", "eot", "eom") and 0 <= i < len(types)}
        eog |= {t for t in _NORMAL_S_MARKERS if t in _CONTROL_BY_TEXT and t in self.tokens}  # EOG by their text
        if "</s>" in self.tokens and eog & set(_NORMAL_S_MARKERS):
            types[self.tokens.index("</s>")] = NORMAL
        return types

    def tokenizer(self, origin: object) -> HFTokenizer:
        """The ``tokenizers`` Tokenizer giving llama.cpp's ids for this vocabulary."""
        token = lambda kind: self.tokens[self.special[kind]] if kind in self.special and self.adds(kind) else None  # noqa: E731
        types = self.llama_cpp_types()
        if self.model == "llama":
            pieces = spm.Pieces(self.tokens, self.scores or [0.0] * len(self.tokens), types,
                                add_dummy_prefix=self.add_space_prefix is not False)
            rstrip = {t for t, kind in zip(self.tokens, types) if kind in (CONTROL, USER_DEFINED, UNKNOWN)
                      and t not in _KEEP_SPACE} if _rstrips_special(self.name) else set()
            return spm.build(pieces, token("bos"), token("eos"), self.adds("bos"), self.adds("eos"), rstrip)
        if self.model == "gemma4":
            return self._gemma4(token("bos"), token("eos"), types)
        pre = _pre_tokenizer(self.pre or "default")
        if pre is None:
            raise where(origin, f"pre-tokenizer '{self.pre}' is not supported ({', '.join(PRE_TOKENIZER_NAMES)})")
        vocab = {t: i for i, t in enumerate(self.tokens)}
        tk = HFTokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in self.merges or []], fuse_unk=False,
                                    ignore_merges=self.pre in _LLAMA3_NAMES))
        tk.pre_tokenizer = pre
        tk.decoder = decoders.ByteLevel()
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, kind in zip(self.tokens, types) if kind == CONTROL])
        tk.add_tokens([AddedToken(t, special=False, normalized=False)
                       for t, kind in zip(self.tokens, types) if kind == USER_DEFINED])
        bos, eos = token("bos"), token("eos")
        tk.post_processor = (spm.template(bos, eos, vocab) if bos or eos
                             else processors.ByteLevel(trim_offsets=False))
        return tk

    def _gemma4(self, bos: str | None, eos: str | None, types: list[int]) -> HFTokenizer:
        """llama.cpp's gemma4: spaces written ▁, the text split at newlines only, BPE by the merges' order over
        its characters, a character no merge reaches as its UTF-8 bytes (``<0xNN>``); BOS always added."""
        vocab = {t: i for i, t in enumerate(self.tokens)}
        tk = HFTokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in self.merges or []], byte_fallback=True,
                                    fuse_unk=False))
        tk.normalizer = normalizers.Replace(" ", spm.SPACE)
        tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
        tk.decoder = decoders.Sequence([decoders.Replace(spm.SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, kind in zip(self.tokens, types) if kind == CONTROL])
        tk.add_tokens([AddedToken(t, special=False, normalized=False)
                       for t, kind in zip(self.tokens, types) if kind == USER_DEFINED])
        if bos or eos:
            tk.post_processor = spm.template(bos, eos, vocab)
        return tk
