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
    "qwen2.5-0.5b": 494_032_768,
    "gemma-3-270m": 268_098_176,
    "gemma-3-1b": 999_885_952,
    "gemma-3-4b": 3_880_263_168,  # the text model: not published, see test_gemma3.py
}


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_preset_parameter_count(name):
    with torch.device("meta"):
        model = build(PRESETS[name])
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]


def test_every_preset_is_counted():
    assert set(PRESETS) == set(PARAMETERS)


def test_every_preset_has_an_alias():
    from gptconv.sources.hub import ALIASES
    assert set(PRESETS) <= set(ALIASES)
