"""The house rules a new family must not bend (docs/adding-a-family.md): no config dataclass over 25 fields
(a new option is a field of its part), the shared decoder names no family, and what the writers know of a
config is typed (``decoder.Feature``), not phrases."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import gptconv
from gptconv import families
from gptconv.layers.decoder import DecoderConfig, Feature, typed_features

MAX_FIELDS = 25


def dataclasses_of_gptconv() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(gptconv.__path__, "gptconv."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_no_config_dataclass_has_more_than_25_fields():
    classes = dataclasses_of_gptconv()
    assert "gptconv.layers.decoder.DecoderConfig" in classes and len(classes) > 20
    over = {name: len(dataclasses.fields(c)) for name, c in classes.items() if len(dataclasses.fields(c)) > MAX_FIELDS}
    assert not over, over


def test_the_shared_decoder_names_no_family():
    """layers/decoder.py chooses parts by their configs, never by a family's name."""
    text = (Path(gptconv.__file__).parent / "layers" / "decoder.py").read_text(encoding="utf-8")
    code = re.sub(r'""".*?"""|#[^\n]*', "", text, flags=re.S)  # docstrings and comments may name examples
    named = sorted(f for f in families.BY_NAME if f != "llama" and re.search(rf"['\"]{f}['\"]", code))
    assert not named, named
    assert DecoderConfig.__dataclass_fields__["family"].default == "llama"  # the one default: the plain decoder


def test_the_writers_take_features_not_phrases():
    assert typed_features({Feature.YARN}) == {Feature.YARN}
    with pytest.raises(TypeError, match="'yarn'"):
        typed_features({"yarn"})  # equal to Feature.YARN as a string: a typo would hide


@pytest.mark.parametrize("family", [f for f in families.FAMILIES if f.config_class is DecoderConfig],
                         ids=lambda f: f.name)
def test_every_decoder_familys_presets_pass_its_own_writers(family):
    """Each preset's features are ones its family's HF writer has a place for (typed, so that a phrase
    matched as a string cannot let one through)."""
    for name, preset in family.presets.items():
        family.config_to_hf(preset.config)


# the families tested before the battery existed, by the files that test them (each past every window, against
# transformers and llama.cpp's converter and runtime)
TESTED_ELSEWHERE = {"gpt2": "test_gpt2_parity.py", "llama": "test_llama_parity.py", "mistral": "test_families.py",
                    "mixtral": "test_families.py", "qwen2": "test_llama_parity.py", "qwen3": "test_families.py",
                    "phi3": "test_family_phi4_mini.py", "gemma3": "test_gemma3.py"}


@pytest.mark.parametrize("family", families.FAMILIES, ids=lambda f: f.name)
def test_every_registered_family_runs_the_battery(family):
    """The registry says which families there are; each has ``test_family_<name>.py`` running the battery on its
    checkpoint (docs/adding-a-family.md, step 5), or is one of the few tested before the battery, by name."""
    here = Path(__file__).parent
    own = here / f"test_family_{family.name}.py"
    if own.exists():
        assert "from family_battery import *" in own.read_text(encoding="utf-8"), own.name
        return
    assert family.name in TESTED_ELSEWHERE, f"{family.name}: no test_family_{family.name}.py"
    assert family.name in (here / TESTED_ELSEWHERE[family.name]).read_text(encoding="utf-8")
