"""SentencePiece vocabularies (Llama 2, TinyLlama, Mistral, Gemma) as ``tokenizers`` BPE models.

A SentencePiece BPE model is a list of pieces with scores; it tokenizes by merging adjacent
pieces, the merge whose result scores highest first, and spells what no piece covers as byte
pieces (``<0x41>``). ``tokenizers``' BPE applies merges by rank, so the merges are listed for it:
every split of a piece into two pieces of the vocabulary, ranked by the score of the piece they
make (ties: the earlier piece). Ranking by id instead, as transformers 5 does for a bare
tokenizer.model, tokenizes whitespace runs differently from sentencepiece: Llama's "▁▁" scores
-1e9 although its id is 259.

Whitespace follows SentencePiece: a space prefixes the text ("dummy prefix") and every space is
"▁". In text with special tokens (which sentencepiece does not parse) the prefix is added again
after each one, as llama.cpp and transformers' legacy Llama tokenizer do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, processors

from ..errors import where
from ..sources.files import read_bytes

# Piece types, as sentencepiece's ModelProto and llama.cpp's tokenizer.ggml.token_type number them.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "▁"


@dataclass
class Pieces:
    """A SentencePiece vocabulary: pieces in id order with their scores and types."""

    pieces: list[str]
    scores: list[float]
    types: list[int]
    add_dummy_prefix: bool = True

    def __post_init__(self) -> None:
        if not len(self.pieces) == len(self.scores) == len(self.types):
            raise ValueError(f"{len(self.pieces)} pieces, {len(self.scores)} scores, {len(self.types)} types")


def merges(p: Pieces) -> list[tuple[str, str]]:
    """Every (left, right) that makes a normal piece from two pieces of the vocabulary, best score first."""
    ids = {piece: i for i, piece in enumerate(p.pieces) if p.types[i] == NORMAL}  # the others never merge
    found = []
    for i, piece in enumerate(p.pieces):
        if p.types[i] != NORMAL:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in ids and right in ids:
                found.append((-p.scores[i], i, ids[left], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def build(p: Pieces, bos: str | None, eos: str | None, add_bos: bool, add_eos: bool,
          rstrip: set[str] = frozenset()) -> HFTokenizer:
    """The ``tokenizers`` Tokenizer that tokenizes as SentencePiece (and llama.cpp) do; the tokens in
    ``rstrip`` swallow the spaces after them."""
    vocab = {}
    for i, piece in enumerate(p.pieces):
        vocab.setdefault(piece, i)  # a duplicated piece keeps its first id, as sentencepiece does
    unk = next((piece for piece, kind in zip(p.pieces, p.types) if kind == UNKNOWN), None)
    tk = HFTokenizer(models.BPE(vocab, merges(p), unk_token=unk, fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Prepend(SPACE)] if p.add_dummy_prefix else []
    tk.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE)])
    tk.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                                   + ([decoders.Strip(" ", 1, 0)] if p.add_dummy_prefix else []))
    tk.add_special_tokens([AddedToken(piece, special=True, normalized=False, rstrip=piece in rstrip)
                           for piece, kind in zip(p.pieces, p.types) if kind in (CONTROL, UNKNOWN)])
    tk.add_tokens([AddedToken(piece, special=False, normalized=False, rstrip=piece in rstrip)
                   for piece, kind in zip(p.pieces, p.types) if kind == USER_DEFINED])
    tk.post_processor = template(bos if add_bos else None, eos if add_eos else None, vocab)
    return tk


def template(bos: str | None, eos: str | None, vocab: dict[str, int]) -> processors.PostProcessor:
    """``<bos> $A <eos>`` with whichever of the two is added."""
    single = " ".join(([bos] if bos else []) + ["$A"] + ([eos] if eos else []))
    pair = " ".join(([bos] if bos else []) + ["$A"] + ([eos] if eos else []) + ([bos] if bos else []) + ["$B"]
                    + ([eos] if eos else []))
    specials = [(t, vocab[t]) for t in dict.fromkeys(x for x in (bos, eos) if x)]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def read_model(path: Path) -> Pieces:
    """A ``tokenizer.model`` file, read with sentencepiece's own schema (protobuf)."""
    try:
        from sentencepiece import sentencepiece_model_pb2 as schema
    except ImportError:
        raise where(path, "reading a SentencePiece model needs sentencepiece and protobuf "
                          "(pip install 'gptconv[sentencepiece]')") from None
    from google.protobuf.message import DecodeError
    model = schema.ModelProto()
    try:
        model.ParseFromString(read_bytes(path))
    except DecodeError as e:
        raise where(path, f"not a readable SentencePiece model ({e})") from None
    trainer, norm = model.trainer_spec, model.normalizer_spec
    if not model.pieces:
        raise where(path, "a SentencePiece model without pieces")
    if trainer.model_type != schema.TrainerSpec.BPE:
        kind = schema.TrainerSpec.ModelType.Name(trainer.model_type)
        raise where(path, f"SentencePiece model type {kind} is not supported (only BPE: Llama, Mistral, Gemma)")
    if norm.name not in ("identity", "") or norm.remove_extra_whitespaces or not norm.escape_whitespaces:
        raise where(path, f"SentencePiece normalization '{norm.name}' (remove_extra_whitespaces="
                          f"{norm.remove_extra_whitespaces}) is not supported (only 'identity', as Llama's)")
    return Pieces([p.piece for p in model.pieces], [p.score for p in model.pieces], [p.type for p in model.pieces],
                  add_dummy_prefix=norm.add_dummy_prefix)
