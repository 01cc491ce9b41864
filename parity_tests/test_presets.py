"""Every preset builds on the meta device with the published parameter count."""

from __future__ import annotations

import pytest
import torch

from gptconv.models import PRESETS, build

# Published counts (tied head counted once, position embeddings included).
PARAMETERS = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "distilgpt2": 81_912_576,  # the Hub's count for distilbert/distilgpt2 ("82M")
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "tinyllama-1.1b": 1_100_048_384,
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "mistral-7b": 7_241_732_096,
    "mistral-7b-v0.1": 7_241_732_096,
    "qwen2.5-0.5b": 494_032_768,
    "mixtral-8x7b": 46_702_792_704,  # the Hub's safetensors count for Mixtral-8x7B-v0.1
    "phi-3-mini": 3_821_079_552,  # the Hub's count for Phi-3-mini-4k-instruct ("3.8B")
    # Qwen3's model cards give rounded totals and non-embedding counts; both are checked below
    "qwen3-0.6b": 596_049_920,
    "qwen3-1.7b": 1_720_574_976,
    "qwen3-4b": 4_022_468_096,
    "qwen3-8b": 8_190_735_360,
    "gemma-3-270m": 268_098_176,
    "gemma-3-1b": 999_885_952,
    "gemma-3-4b": 3_880_263_168,  # the text model: not published, see test_gemma3.py
}
# (total, non-embedding) in billions, as Qwen3's model cards round them
QWEN3_CARDS = {"qwen3-0.6b": (0.6, 0.44), "qwen3-1.7b": (1.7, 1.4), "qwen3-4b": (4.0, 3.6), "qwen3-8b": (8.2, 6.95)}


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_preset_parameter_count(name):
    with torch.device("meta"):
        model = build(PRESETS[name])
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]


@pytest.mark.parametrize("name", sorted(QWEN3_CARDS))
def test_qwen3_counts_round_to_the_model_cards(name):
    total, non_embedding = QWEN3_CARDS[name]
    c = PRESETS[name]
    embeddings = c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    digits = len(str(non_embedding).split(".")[1])
    assert round(PARAMETERS[name] / 1e9, 1) == total
    assert round((PARAMETERS[name] - embeddings) / 1e9, digits) == non_embedding


def test_every_preset_is_counted():
    """Here, or in the PRESETS of its family's test file (test_family_*.py)."""
    import importlib
    from pathlib import Path
    counted = set(PARAMETERS)
    for path in Path(__file__).parent.glob("test_family_*.py"):
        counted |= set(importlib.import_module(path.stem).PRESETS)
    assert set(PRESETS) == counted


def test_every_preset_is_an_alias_of_its_repo():
    """One table: each preset's name is the alias ``pull`` takes for its Hub repo."""
    from gptconv.families import PRESETS as FAMILY_PRESETS
    from gptconv.sources.hub import repo_id_for
    for name, preset in FAMILY_PRESETS.items():
        assert repo_id_for(name) == preset.repo and repo_id_for(preset.repo) == preset.repo, name
