"""Typed reading of an HF ``config.json``: every field checked, every unknown feature refused."""

from __future__ import annotations

import math
from typing import Any

from ..errors import GptconvError

_REQUIRED = object()


class ConfigFields:
    """Reads fields of one config.json and names the file in every error."""

    def __init__(self, data: dict[str, Any], origin: object) -> None:
        if not isinstance(data, dict):
            raise GptconvError(f"{origin}: config is not a JSON object")
        self.data, self.origin = data, origin

    def error(self, problem: str) -> GptconvError:
        return GptconvError(f"{self.origin}: {problem}")

    def _get(self, name: str, types: tuple[type, ...], default: Any) -> Any:
        if name not in self.data or (self.data[name] is None and default is not _REQUIRED):
            if default is _REQUIRED:
                raise self.error(f"missing field '{name}'")
            return default
        value = self.data[name]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            wanted = " or ".join(t.__name__ for t in types)
            raise self.error(f"field '{name}' is {value!r}, expected {wanted}")
        return value

    def int(self, name: str, default: Any = _REQUIRED) -> int:
        return self._get(name, (int,), default)

    def positive(self, name: str, default: Any) -> int:
        """An optional size: ``default`` when absent or null; 0 or less is an error (transformers would
        take a 0 as it is, not as "absent")."""
        value = self.int(name, None)
        if value is None:
            return default
        if value <= 0:
            raise self.error(f"field '{name}' is {value}; it must be at least 1 (or absent)")
        return value

    def positive_float(self, name: str, default: Any) -> float:
        """An optional positive number: ``default`` when absent or null; 0 or less is an error (never
        replaced by the default because it is falsy)."""
        value = self.float(name, None)
        if value is None:
            return default
        if not value > 0:
            raise self.error(f"field '{name}' is {value:g}; it must be positive (or absent)")
        return value

    def float(self, name: str, default: Any = _REQUIRED) -> float:
        """A number; NaN and the infinities (which Python's JSON reads) are no model's setting."""
        value = self._get(name, (int, float), default)
        if value is None:
            return None
        if not math.isfinite(value):
            raise self.error(f"field '{name}' is {value}; it must be a finite number")
        return float(value)

    def bool(self, name: str, default: Any = _REQUIRED) -> bool:
        return self._get(name, (bool,), default)

    def str(self, name: str, default: Any = _REQUIRED) -> str:
        return self._get(name, (str,), default)

    def dict(self, name: str, default: Any = _REQUIRED) -> dict:
        return self._get(name, (dict,), default)

    def token_id(self, name: str) -> int | None:
        """bos/eos ids: an int, or a list whose first entry we use (Llama 3 lists several eos ids)."""
        value = self.data.get(name)
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return value[0]
        return self.int(name, None)

    def common(self, **names: str) -> dict[str, Any]:
        """The fields every architecture has, read under this architecture's HF ``names`` for
        context_length, d_model, n_layers and n_heads (vocab_size and the special ids are named alike)."""
        return {"vocab_size": self.int("vocab_size"), **{ours: self.int(theirs) for ours, theirs in names.items()},
                "bos_token_id": self.token_id("bos_token_id"), "eos_token_id": self.token_id("eos_token_id")}

    def refuse(self, name: str, unsupported: Any, feature: str) -> None:
        """Error out when ``name`` is set to a value we do not implement (never ignore it)."""
        if self.data.get(name, None) == unsupported:
            raise self.error(f"'{name}': {unsupported!r} ({feature}) is not supported")


def build_config(cls: type, fields: ConfigFields, **values: Any) -> Any:
    """``cls(**values)``, turning a size the config class refuses into an error naming the file."""
    try:
        return cls(**values)
    except ValueError as e:
        raise fields.error(str(e)) from None
