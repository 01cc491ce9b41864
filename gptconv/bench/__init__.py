"""The benchmark: gptconv beside its peers, measured in the same run, printed as ratios.

``python -m gptconv.bench`` (see ``__main__``). Every measurement runs in a fresh process
(``worker``), so one case's imports, caches and memory never flatter the next; peers alternate,
each case is repeated, and the medians are compared. The checkpoints are made locally, once
(``checkpoints``). It needs the test extras (transformers, accelerate, llama-cpp-python): ``make bench``.
"""
