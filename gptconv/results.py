"""What every public function returns: a dataclass whose ``to_dict()`` is plain, strict JSON."""

from __future__ import annotations

import math
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path


class Result:
    """Mixed into the result dataclasses (``PullSummary``, ``Trace``, ``Generation``, ``Report``,
    ``ExportSummary``, ``Inspection``): ``to_dict()`` for ``--json`` and for scripts."""

    def to_dict(self) -> dict:
        assert is_dataclass(self)
        return json_safe({f.name: getattr(self, f.name) for f in fields(self)})


def json_safe(value):
    """``value`` as JSON: NaN / Inf as the strings "nan" / "inf" / "-inf" (JSON has neither), paths
    as strings, dataclasses as objects, tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if is_dataclass(value) and not isinstance(value, type):
        return json_safe(asdict(value))
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
