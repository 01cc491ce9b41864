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
}


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_preset_parameter_count(name):
    with torch.device("meta"):
        model = build(PRESETS[name])
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]


def test_every_preset_is_counted():
    assert set(PRESETS) == set(PARAMETERS)
