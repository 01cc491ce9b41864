"""The fuzz's hostile case classes (see fuzz.py): special files, extreme JSON, GGUF array counts, GGUF
tensor tables that lie, tokenizers and chat templates that panic, loop or allocate, users' key tables.
Each function makes one case's files (or, for a key table, the rows to build it from)."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import struct
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEXT = "Hello world! The capital of France is Paris. café 🙂 1234"  # what every tokenizer case encodes

# ---------------------------------------------------------------------------------------------------
# special-file: side files (or the GGUF file) that are not regular files

SPECIAL_KINDS = ("fifo", "devzero", "dangling", "selfloop", "folder", "outside", "garbage")
# what a link out of a folder points at, which must never land in an export: a JSON object and a template
# alike, so that any side file could take it
SECRET = b'{"fuzz-secret-7f3a": "a user\'s file outside the checkpoint"}'
SIDE_FILES = ("config.json", "tokenizer_config.json", "tokenizer.json", "vocab.json", "merges.txt")
ABSENT_SIDE_FILES = ("special_tokens_map.json", "chat_template.jinja", "chat_template.json")  # made where none is


def make_special(path: Path, kind: str, rng: random.Random | None = None) -> None:
    """``path`` (removed first) as a FIFO, a link to /dev/zero, a link to nothing, a link to itself, a folder,
    a link to a file outside its folder holding ``SECRET`` (made beside the folder), or random bytes."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "dangling":
        os.symlink(path.with_name(path.name + ".gone"), path)
    elif kind == "selfloop":
        os.symlink(path.name, path)
    elif kind == "outside":
        secret = path.parent.parent / "secret.txt"
        secret.write_bytes(SECRET)
        os.symlink(secret, path)
    elif kind == "garbage":
        rng = rng or random.Random(0)
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.choice([1, 17, 300, 5000]))))
    else:
        path.mkdir()


# ---------------------------------------------------------------------------------------------------
# json-extreme: values no real config has, written as raw JSON text

PLACEHOLDER = "\x00fuzz-placeholder\x00"


def extreme_literal(rng: random.Random) -> tuple[str, str, str]:
    """(kind, raw JSON text, short description)."""
    kind = rng.choice(["deep-list", "deep-list", "deep-dict", "bigint", "bigfloat", "nan"])
    if kind in ("deep-list", "deep-dict"):
        depth = rng.choice([500, 990, 10_000, 50_000, 200_000])
        if kind == "deep-list":
            return kind, "[" * depth + rng.choice(["", "1", '"x"']) + "]" * depth, f"depth {depth:,}"
        return kind, '{"a":' * depth + "1" + "}" * depth, f"depth {depth:,}"
    if kind == "bigint":
        digits = rng.choice([5_000, 20_000, 200_000])
        return kind, rng.choice(["", "-"]) + "9" * digits, f"{digits:,} digits"
    if kind == "bigfloat":
        digits = rng.choice([5_000, 50_000])
        return kind, rng.choice(["1" + "0" * digits + ".5", "0." + "0" * digits + "1", f"1e{digits}"]), f"{digits:,} digits"
    literal = rng.choice(["NaN", "Infinity", "-Infinity"])
    return kind, literal, literal


def put_raw(text: str, raw: str, rng: random.Random) -> tuple[bytes, str]:
    """``text`` (JSON) with one value, at a random place (top level or deeper), replaced by ``raw``; the
    whole document now and then. Returns the new bytes and the path of the value replaced."""
    data = json.loads(text)
    if rng.random() < 0.1 or not isinstance(data, (dict, list)) or not data:
        return raw.encode(), "(the whole file)"
    node, path = data, []
    while True:
        key = rng.choice(sorted(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        child = node[key]
        if isinstance(child, (dict, list)) and child and rng.random() < 0.5:
            node = child
            continue
        node[key] = PLACEHOLDER
        break
    out = json.dumps(data).replace(json.dumps(PLACEHOLDER), raw, 1)
    return out.encode(), "/".join(str(k) for k in path)


# ---------------------------------------------------------------------------------------------------
# GGUF metadata written by hand: a tokenizer (with arrays) added to a model file, and the arrays found again

STRING, ARRAY, UINT32, INT32, FLOAT32 = 8, 9, 4, 5, 6
SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
LEAST_ITEM = {STRING: 8, ARRAY: 12}  # what CheckedReader takes as an item's least size


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", vtype) + payload


def _array(item_type: int, items: list[bytes]) -> bytes:
    return struct.pack("<IQ", item_type, len(items)) + b"".join(items)


def gguf_with_kvs(data: bytes, kvs: list[bytes]) -> bytes:
    """The GGUF file ``data`` with the metadata entries ``kvs`` put right after its header. They are
    padded (with one more string entry) to a multiple of 32 bytes, the default alignment, so the tensor
    data, which starts at the next aligned offset after the tensor infos, keeps its alignment."""
    blob = b"".join(kvs)
    pad_len = -(len(blob) + len(_kv("fuzz.pad", STRING, _str("")))) % 32
    blob += _kv("fuzz.pad", STRING, _str(" " * pad_len))
    magic, version, n_tensors, n_kv = struct.unpack("<IIQQ", data[:24])
    return struct.pack("<IIQQ", magic, version, n_tensors, n_kv + len(kvs) + 1) + blob + data[24:]


def tokenizer_kvs(folder: Path, chat_template: str | None) -> list[bytes]:
    """A byte-level BPE tokenizer (the folder's vocab.json and merges.txt) as GGUF metadata, with an
    array of arrays and an f32 array beside it."""
    vocab = json.loads((folder / "vocab.json").read_text())
    merges = [m for m in (folder / "merges.txt").read_text().splitlines() if m and not m.startswith("#")][:24]
    # the special token, the 256 bytes, then one token per merge, in merge order: the vocabulary of the
    # first 24 merges (small, so that each case parses it quickly)
    tokens = sorted(vocab, key=vocab.get)[:257 + len(merges)]
    kvs = [
        _kv("tokenizer.ggml.model", STRING, _str("gpt2")),
        _kv("tokenizer.ggml.pre", STRING, _str("gpt-2")),
        _kv("tokenizer.ggml.tokens", ARRAY, _array(STRING, [_str(t) for t in tokens])),
        _kv("tokenizer.ggml.token_type", ARRAY,
            _array(INT32, [struct.pack("<i", 3 if t == "<|endoftext|>" else 1) for t in tokens])),
        _kv("tokenizer.ggml.merges", ARRAY, _array(STRING, [_str(m) for m in merges])),
        _kv("tokenizer.ggml.bos_token_id", UINT32, struct.pack("<I", vocab["<|endoftext|>"])),
        _kv("tokenizer.ggml.eos_token_id", UINT32, struct.pack("<I", vocab["<|endoftext|>"])),
        _kv("fuzz.nested", ARRAY, _array(ARRAY, [_array(UINT32, [struct.pack("<I", i) for i in range(n)])
                                                 for n in (3, 0, 5)])),
        _kv("fuzz.floats", ARRAY, _array(FLOAT32, [struct.pack("<f", i / 7) for i in range(6)])),
    ]
    if chat_template is not None:
        kvs.append(_kv("tokenizer.chat_template", STRING, _str(chat_template)))
    return kvs


def gguf_arrays(data: bytes) -> list[tuple[str, int, int, int]]:
    """Every array in a GGUF file's metadata, nested ones too: (key, offset of its u64 count, its count,
    the largest count CheckedReader's size check lets through there)."""
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    pos, found = 24, []

    def value(vtype: int, pos: int, key: str) -> int:
        if vtype == STRING:
            return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
        if vtype == ARRAY:
            item, count = struct.unpack_from("<IQ", data, pos)
            least = LEAST_ITEM.get(item) or SCALAR_SIZE[item]
            found.append((key, pos + 4, count, (len(data) - pos - 12) // least))
            pos += 12
            for i in range(count):
                pos = value(item, pos, f"{key}[{i}]")
            return pos
        return pos + SCALAR_SIZE[vtype]

    for _ in range(n_kv):
        n = struct.unpack_from("<Q", data, pos)[0]
        key = data[pos + 8:pos + 8 + n].decode()
        vtype = struct.unpack_from("<I", data, pos + 8 + n)[0]
        pos = value(vtype, pos + 12 + n, key)
    return found


def mutate_array_count(data: bytes, rng: random.Random, costly: bool) -> tuple[bytes, str, str]:
    """``costly``: set the count to the largest one the reader's size check lets through, so that it parses
    the rest of the file as made-up items (~0.5 s a read here), else to one of the cheap hostile values."""
    key, offset, count, fits = rng.choice(gguf_arrays(data))
    values = [("2^32", 2**32), ("2^40", 2**40), ("2^63-1", 2**63 - 1), ("2^64-1", 2**64 - 1), ("file-length", len(data)),
              ("count+1", count + 1), ("count-1", max(count - 1, 0)), ("0", 0)]
    kind, value = ("fits", fits) if costly else rng.choice(values)
    b = bytearray(data)
    b[offset:offset + 8] = struct.pack("<Q", value)
    return bytes(b), kind, f"{key}: count {count:,} -> {value:,}"


# ---------------------------------------------------------------------------------------------------
# tokenizer-code: regexes that backtrack past Oniguruma's limit, chat templates that do not end well

# (pattern, a text it backtracks on): each makes the tokenizers library panic ("retry-limit-in-match over")
BACKTRACKING = [
    ("(a+)+b", "a" * 40 + "c"),
    (r"(\w+\s?)*$", "word " * 200 + "!"),
    ("(x+x+)+y", "x" * 60),
    ("(a|aa)+$", "a" * 60 + "b"),
    (r"^(\d+)+$", "1" * 60 + "x"),
]
TEMPLATES = {  # kind → templates (how often each kind comes: TOKENIZER_KINDS, COSTLY)
    "template-alloc": ["{{ 'x' * 2000000000 }}", "{% set s = 'ab' * 1000000000 %}{{ s | length }}",
                       "{{ 'x' * 10 ** 12 }}", "{{ 'x' * 10 ** 20 }}", "{{ (range(100000) | list) * 100000 }}"],
    "template-double": ["{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s | length }}"],
    "template-recurse": ["{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"],
    "template-output": ["{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"],
    "template-escape": ["{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ messages.append(1) }}",
                        "{{ cycler.__init__.__globals__.os.system('true') }}"],
    "template-error": ["{{ raise_exception('refused') }}", "{% for %}", "{{ messages[10].content }}",
                       "{{ 1 / 0 }}"],
    "template-ok": ["{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
                    "{% if add_generation_prompt %}<|assistant|>{% endif %}"],
    "template-loop": ["{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                      "{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100000) %}"
                      "{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}{{ ns.n }}"],
}
# How often each kind comes: in each run of sum(weights) cases of the class, every kind its weight's number
# of times, interleaved (a backtracking regex takes ~70 ms to reach Oniguruma's retry limit, the others
# milliseconds). So every kind is in the default 300 cases, whatever the seed; the seed picks the variants.
# The costly kinds take the place of that schedule now and then, kind → (every, at): the class's cases
# number at, at + every, at + 2 * every, ….
# A looping template is cut after TEMPLATE_SECONDS (one in the default 300 cases); a doubling one takes
# ~0.6 s to reach gptconv's memory bound (none in 300 cases, one in 1,000); a GGUF array count that fits
# (see mutate_array_count) makes each of the two reads walk the rest of the file (one in 300).
TOKENIZER_KINDS = {"split-panic": 4, "normalizer-panic": 1, "decoder-panic": 1, "bad-regex": 2,
                   "template-alloc": 6, "template-recurse": 2, "template-output": 2, "template-escape": 3,
                   "template-error": 3, "template-ok": 3}
COSTLY = {"template-loop": (40, 20), "template-double": (80, 73), "fits": (40, 12)}
TOKENIZER_ORDER = [k for _, k in sorted(((i + 0.5) / w, k) for k, w in TOKENIZER_KINDS.items() for i in range(w))]


def costly(kind: str, index: int) -> bool:
    every, at = COSTLY[kind]
    return index % every == at


def hostile_tokenizer_json(base: str, kind: str, rng: random.Random) -> tuple[str, str, str]:
    """(tokenizer.json text, text to encode, description)."""
    spec = json.loads(base)
    if kind == "bad-regex":
        pattern, text = rng.choice(["(", "a{2,1}", "[z-a]", "(?<=a+)b", "\\"]), TEXT
    else:
        pattern, text = rng.choice(BACKTRACKING)
    regex = {"Regex": pattern}
    if kind in ("split-panic", "bad-regex"):
        split = {"type": "Split", "pattern": regex, "behavior": "Isolated", "invert": False}
        spec["pre_tokenizer"] = rng.choice([split, {"type": "Sequence", "pretokenizers": [
            split, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}])
    elif kind == "normalizer-panic":
        spec["normalizer"] = {"type": "Replace", "pattern": regex, "content": "z"}
    else:  # the decoder runs on decode(): the ids of the text decode to the text, which it backtracks on
        spec["decoder"] = {"type": "Sequence", "decoders": [spec["decoder"],
                                                            {"type": "Replace", "pattern": regex, "content": "z"}]}
    return json.dumps(spec), text, f"pattern {pattern!r} on {len(text)} characters"


def base_tokenizer_json(folder: Path) -> str:
    """The folder's GPT-2 vocabulary (vocab.json, merges.txt) as a tokenizer.json, the way HF saves one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    tk = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tk.add_special_tokens(["<|endoftext|>"])
    return tk.to_str()


def put_template(folder: Path, template: str, rng: random.Random) -> str:
    """``template`` where transformers looks for one: tokenizer_config.json (a string, or the default of
    a named list), else chat_template.jinja. Returns where."""
    where = rng.choice(["tokenizer_config", "tokenizer_config", "named-list", "chat_template.jinja"])
    if where == "chat_template.jinja":
        (folder / "chat_template.jinja").write_text(template)
        return where
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = template if where == "tokenizer_config" else [
        {"name": "tool_use", "template": "{{ 'unused' }}"}, {"name": "default", "template": template}]
    path.write_text(json.dumps(config))
    return where


# ---------------------------------------------------------------------------------------------------
# gguf-offsets: tensor tables llama.cpp refuses (gguf.cpp: each tensor's data right after the previous
# one's, padded to the alignment, in table order, inside the file), which must end in one error line:
# offsets near 2^64 (GGUFReader adds them to the data section's start in uint64, which wraps into the
# header), tensors given overlapping or swapped offsets, types relabelled so that the data no longer fits

TABLE_KINDS = ("offset-2^64", "offset-2^64", "overlap", "swap", "relabel", "relabel")


@dataclass
class TableEntry:
    name: str
    ggml_type: int
    dims: list[int]  # innermost first, as the file lists them
    type_pos: int  # byte positions of its type (u32) and data offset (u64) in the file
    offset_pos: int
    offset: int
    size: int  # bytes its data takes


@dataclass
class TensorTable:
    entries: list[TableEntry]
    data_start: int  # where the data section starts in the file
    data_size: int
    alignment: int


def _data_bytes(ggml_type: int, dims: list[int]) -> int | None:
    """Bytes a tensor of this type and shape takes; None where its rows are not whole blocks."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    if (dims[0] if dims else 1) % block:
        return None
    return math.prod(dims) // block * block_bytes


def tensor_table(path: Path) -> TensorTable:
    """The tensor table of the valid GGUF file ``path``, as gguf's reader sees it."""
    from gguf import GGUFReader
    reader = GGUFReader(path)
    entries = []
    for t in reader.tensors:
        pos, starts = t.field.offset, []
        for part in t.field.parts:
            starts.append(pos)
            pos += part.nbytes
        dims = [int(d) for d in t.shape]
        entries.append(TableEntry(t.name, int(t.tensor_type), dims, starts[-2], starts[-1],
                                  int(t.data_offset) - reader.data_offset, _data_bytes(int(t.tensor_type), dims)))
    return TensorTable(entries, reader.data_offset, len(reader.data) - reader.data_offset, int(reader.alignment))


def _pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def refused_types(table: TensorTable, i: int) -> list[int]:
    """The types that tensor ``i`` relabelled to makes a table llama.cpp refuses: rows that are not whole
    blocks, a padded size that moves where the next tensor must start, or (the last tensor) data that
    runs past the end of the file. A smaller last tensor is accepted by llama.cpp, so by us."""
    from gguf import GGML_QUANT_SIZES
    e, last = table.entries[i], i == len(table.entries) - 1
    out = []
    for ggml_type in sorted(int(t) for t in GGML_QUANT_SIZES):
        size = _data_bytes(ggml_type, e.dims)
        if size is None or (e.offset + size > table.data_size if last else
                            _pad(size, table.alignment) != _pad(e.size, table.alignment)):
            out.append(ggml_type)
    return out


def mutate_tensor_table(data: bytes, table: TensorTable, kind: str, rng: random.Random) -> tuple[bytes, str]:
    """``data`` (the file ``table`` describes) with one lie in its tensor table; a description."""
    from gguf import GGMLQuantizationType
    b = bytearray(data)
    entries, align = table.entries, table.alignment
    i = rng.randrange(len(entries))
    e = entries[i]
    if kind == "offset-2^64":
        wrap_to = rng.choice([0, 8, 24, rng.randrange(table.data_start // align) * align, table.data_start - align])
        value, what = rng.choice([
            (2**64 - table.data_start + wrap_to, f"wraps to file byte {wrap_to}"),
            (2**64 - align, "2^64 - alignment"), (2**64 - 1, "2^64 - 1"), (2**63, "2^63"),
            (2**64 - _pad(e.size, align), "offset + size wraps to 0")])
        struct.pack_into("<Q", b, e.offset_pos, value)
        return bytes(b), f"'{e.name}' offset {e.offset:,} -> {value:,} ({what})"
    j = rng.choice([k for k in range(len(entries)) if k != i])
    other = entries[j]
    if kind == "overlap":  # the start of another tensor's data, or a place inside it
        inside = rng.randrange(max(other.size // align, 1)) * align
        struct.pack_into("<Q", b, e.offset_pos, other.offset + inside)
        return bytes(b), f"'{e.name}' offset {e.offset:,} -> {other.offset + inside:,} (inside '{other.name}')"
    if kind == "swap":
        struct.pack_into("<Q", b, e.offset_pos, other.offset)
        struct.pack_into("<Q", b, other.offset_pos, e.offset)
        return bytes(b), f"'{e.name}' and '{other.name}' offsets swapped"
    # relabel: a tensor that is not the last unless a type makes it run past the end
    i = rng.choice([k for k in range(len(entries)) if refused_types(table, k)])
    e = entries[i]
    ggml_type = rng.choice(refused_types(table, i))
    struct.pack_into("<I", b, e.type_pos, ggml_type)
    return bytes(b), (f"'{e.name}' {GGMLQuantizationType(e.ggml_type).name} -> "
                      f"{GGMLQuantizationType(ggml_type).name}")


# key-table: a user's table for gptconv.state_dict(source, KeyMap), GPT-2's HF rows (Map, Drop, Tied) mutated.
# A row is a spec, (maker, args), built inside the case: building a bad one must fail as one line too.

# kind → whether the table stays valid: a valid one must load and give the reference's tensors (renamed);
# any other must end in a GptconvError (never a raw error, never a state dict with a tensor lost under a name)
KEY_TABLE_KINDS = {"shuffle": True, "rename": True, "extra-tied": True,
               "one-name-two-targets": False, "overlap": False, "field-one-side": False, "brace": False,
               "second-name": False, "bad-target": False, "bad-source": False, "bad-row": False,
               "tied-clash": False, "missing": False}
KEY_TABLE_ORDER = sorted(KEY_TABLE_KINDS)
Spec = tuple[str, list]  # (maker, its arguments): ("Map", [source, target, transform]), ("raw", [not a row])


def table_specs(rules: list) -> list[Spec]:
    """A table's rows as specs: ("Map", [source, target, transform]), ("Tied", [source, target]), ("Drop", [source])."""
    return [("Map", [r.source, r.target, r.transform]) if r.kind == "map" else
            ("Tied", [r.source, r.target]) if r.kind == "tied" else ("Drop", [r.source]) for r in rules]


def build_table(specs: list[Spec] | None) -> Any:
    """The KeyMap of ``specs`` (None: no rows at all), built as a user would: each row, then the table."""
    from gptconv.convert.keymap import Drop, KeyMap, Map, Rule, Tied
    makers = {"Map": Map, "Tied": Tied, "Drop": Drop, "Rule": Rule}
    rows = None if specs is None else [args[0] if maker == "raw" else makers[maker](*args) for maker, args in specs]
    return KeyMap("fuzz", rows)


def hostile_table(specs: list[Spec], kind: str, n_layers: int,
                  rng: random.Random) -> tuple[list[Spec] | None, Callable[[dict], dict] | None, str]:
    """``specs`` mutated as ``kind`` says: (the specs, for a valid kind how the reference state dict's names
    change (else None), a description)."""
    specs = [(maker, list(args)) for maker, args in specs]
    maps = [n for n, (maker, _) in enumerate(specs) if maker == "Map"]
    layered = [n for n in maps if "{i}" in specs[n][1][0]]
    literal = [n for n in maps if n not in layered]
    n = rng.choice(maps)
    source, target = specs[n][1][:2]
    same = lambda names: names  # noqa: E731
    if kind == "shuffle":
        rng.shuffle(specs)
        return specs, same, "rows in another order"
    if kind == "rename":  # a name of the user's own, its layer kept
        specs[n][1][0] = "fuzz." + source
        pattern = re.compile(re.escape(source).replace(re.escape("{i}"), r"\d+"))
        return specs, lambda names: {("fuzz." + k if pattern.fullmatch(k) else k): v for k, v in names.items()}, \
            f"{source!r} as 'fuzz.{source}'"
    if kind == "extra-tied":  # the embedding under one more name, as nanoGPT's lm_head
        specs.append(("Tied", ["fuzz.head.weight", "tok_emb.weight"]))
        return (specs, lambda names: {**names, "fuzz.head.weight": names["transformer.wte.weight"]},
                "Tied('fuzz.head.weight')")
    if kind == "one-name-two-targets":
        other = rng.choice([m for m in maps if m != n])
        specs[other][1][0] = source
        return specs, None, f"{source!r} for {target!r} and {specs[other][1][1]!r}"
    if kind == "overlap":  # a literal name that is also one layer's name of a templated row
        m, o = rng.choice(literal), rng.choice(layered)
        specs[m][1][0] = specs[o][1][0].replace("{i}", str(rng.randrange(n_layers)))
        return specs, None, f"{specs[m][1][0]!r} for {specs[m][1][1]!r}"
    if kind == "field-one-side":
        side = rng.randrange(2)
        name = specs[n][1][side]
        specs[n][1][side] = name.replace("{i}", "0") if "{i}" in name else name.replace(".", ".{j}.", 1)
        return specs, None, f"{name!r} as {specs[n][1][side]!r}"
    if kind == "brace":
        side = rng.randrange(2)
        name = specs[n][1][side]
        at = rng.randrange(len(name) + 1)
        specs[n][1][side] = name[:at] + rng.choice(["{", "}", "{0}", "{}", "{i}", "{i:02d}", "{j}"]) + name[at:]
        return specs, None, f"{name!r} as {specs[n][1][side]!r}"
    if kind == "second-name":
        specs.insert(rng.randrange(len(specs) + 1), ("Map", ["fuzz." + source, target]))
        return specs, None, f"{target!r} also as 'fuzz.{source}'"
    if kind == "bad-target":
        specs[n][1][1] = rng.choice([None, 7, target + "x", target.rsplit(".", 1)[0] + ".scale", ""])
        return specs, None, f"{target!r} as {specs[n][1][1]!r}"
    if kind == "bad-source":
        specs[n][1][0] = rng.choice([None, 7, source.encode(), ""])
        return specs, None, f"{source!r} as {specs[n][1][0]!r}"
    if kind == "bad-row":
        what = rng.choice(["str", "int", "none", "tuple", "kind", "transform", "no-rows"])
        if what == "no-rows":
            return None, None, "rows None"
        specs[n] = {"str": ("raw", [source]), "int": ("raw", [5]), "none": ("raw", [None]),
                    "tuple": ("raw", [(source, target)]), "kind": ("Rule", [source, target, specs[n][1][2], "bogus"]),
                    "transform": ("Map", [source, target, "transpose"])}[what]
        return specs, None, f"{source!r}: {what}"
    if kind == "tied-clash":  # a tied copy of the embedding under a name that holds another tensor
        m = rng.choice([m for m in literal if specs[m][1][1] != "tok_emb.weight"])
        specs.append(("Tied", [specs[m][1][0], "tok_emb.weight"]))
        return specs, None, f"Tied({specs[m][1][0]!r}, 'tok_emb.weight')"
    assert kind == "missing", kind
    del specs[n]
    return specs, None, f"no row for {target!r}"
