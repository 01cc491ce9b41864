"""The shared parts every family's model is built from (``gptconv/families/``), each step of the trace:

- ``linear``: the one matmul (its one-row product for generation);
- ``norms``: ``rms_norm`` and the (1 + w) form ``offset_rms_norm``;
- ``rope``: RoPE frequencies (default, linear, llama3, per-frequency factors) and the rotation;
- ``attention``: causal attention with GQA, windows, padding; ``kv_cache``: the per-layer K/V state;
- ``mlp``: gated MLPs (SwiGLU, GeGLU) and routed experts (MoE);
- ``decoder``: the decoder (config, model, block, attention) most families are;
- ``tap``: how a model hands each step's output to ``trace`` and ``verify``;
- ``config_checks``: the size and range checks every config runs.
"""
