"""Where a model comes from, read as untrusted input: each gives ``gptconv.loader`` tensors (listed,
read only when loaded) and the raw metadata that ``gptconv.convert`` turns into a config.

- ``hub``: the Hugging Face Hub (huggingface-hub, resumable weight downloads, checked answers);
- ``hf_folder``: a local HF folder (config.json, safetensors single or sharded, .bin);
- ``gguf_file``: a GGUF file (gguf's reader, with the hostile-file checks);
- ``files``: side files read only if they are regular files of a size their kind can have.
"""
