"""verify, and everything it is made of (the public function is ``gptconv.verify``; a package cannot
share its name, since ``import gptconv.verify.x`` would rebind it):

- ``run.py``: the orchestration — which reference, which dtype, streamed or not — and the inputs both
  sides run; ``record_reference`` writes a reference's outputs for a later verify;
- ``compare.py``: the rule (ours as close to the float64 truth as the reference is, per step),
  tolerances, the comparison and the report;
- ``hf_reference.py``: transformers as the reference, built for a source, and its step outputs;
- ``recorded.py``: references recorded to a file, read back and checked;
- ``llama_cpp_reference.py``: llama.cpp as the reference for a GGUF file;
- ``streaming.py``: a model filled one block at a time, for models too large to hold twice.
"""
