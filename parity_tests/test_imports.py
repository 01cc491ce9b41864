"""The package's layers import downwards only: no import cycle between gptconv's modules, counting
the imports inside functions too (a lazy import that dodges a cycle at load time still ties the two
modules together), and the public functions stay functions whatever is imported."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gptconv

PACKAGE = Path(gptconv.__file__).parent


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["gptconv", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its text."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            # ``from .pkg import sub`` imports the submodule ``pkg.sub`` when there is one
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_no_import_cycles():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert graph["gptconv.api"] and graph["gptconv.loader"]  # the check sees imports at all
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "\n".join(" → ".join(c) for c in cycles)


def test_the_checker_finds_a_cycle(tmp_path):
    """The check itself can fail: two modules importing each other (one lazily) are a cycle."""
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def x():\n    from .a import y\n")
    known = {"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"}
    assert imports_of("p.a", known["p.a"], known) == {"p.b"}
    assert imports_of("p.b", known["p.b"], known) == {"p.a"}


def test_public_functions_stay_functions_after_every_submodule_is_imported():
    """``import gptconv.x`` binds ``gptconv.x`` to the module: no module may be named like a public function."""
    names = ["load", "load_tokenizer", "pull", "trace", "generate", "verify", "export", "inspect", "record_reference"]
    code = ("import importlib, inspect, pkgutil, gptconv\n"
            "for m in pkgutil.walk_packages(gptconv.__path__, 'gptconv.'):\n"
            "    if not m.name.startswith(('gptconv.bench.', 'gptconv.__main__')):\n"
            "        importlib.import_module(m.name)\n"
            f"bad = [n for n in {names!r} if not inspect.isfunction(getattr(gptconv, n))]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
