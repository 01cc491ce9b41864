"""Rotary position embedding (RoPE), in Hugging Face's rotate-half layout.

A head vector x of size hd is read as two halves (x₁, x₂); position p rotates each pair
(x₁[j], x₂[j]) by the angle p · θ_j. HF checkpoints store Q/K projections for this layout, so
they load without permuting rows (llama.cpp's interleaved layout needs ``permute_qk``). With partial
rotary (Phi-4-mini) only the first ``rope_dim`` dimensions of each head are rotated, the rest pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config_checks import check_range, check_sizes


@dataclass(frozen=True)
class RopeScaling:
    """How the base frequencies are stretched for contexts longer than the pretraining one.

    kind "linear": every θ_j / factor. kind "llama3" (Llama 3.1+): long wavelengths / factor,
    short ones kept, the band between interpolated. kind "factors": θ_j / factors[j], as
    llama.cpp stores Llama 3.1 scaling in a GGUF (the ``rope_freqs`` tensor). kind "longrope" (Phi-3
    128k, Phi-4-mini): θ_j / short_factors[j] while a forward reaches no further than
    original_context_length positions, θ_j / long_factors[j] once it does (as transformers decides, per
    forward call), cos and sin × attention_factor either way. kind "yarn" (YaRN): frequencies that turn
    fewer than beta_slow times over the original context are divided by factor, those turning more than
    beta_fast times kept, a linear ramp between (over dimension indices, rounded out with ``truncate``);
    cos and sin × attention_factor.
    """

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context_length: int = 8192
    factors: tuple[float, ...] = ()
    long_factors: tuple[float, ...] = ()  # longrope: ``factors`` are the short ones
    attention_factor: float = 1.0  # longrope, yarn: cos and sin are scaled by it
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0
    truncate: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "llama3", "factors", "longrope", "yarn"):
            raise ValueError(f"rope scaling '{self.kind}' is not supported (only linear, llama3, longrope, yarn)")
        if self.kind == "yarn" and not (0 < self.beta_slow <= self.beta_fast < 1e6 and 0 < self.attention_factor < 100):
            raise ValueError(f"yarn beta_fast {self.beta_fast!r} / beta_slow {self.beta_slow!r} / attention_factor "
                             f"{self.attention_factor!r} out of range")
        if self.kind == "longrope":
            if len(self.factors) != len(self.long_factors) or not all(
                    isinstance(x, (int, float)) and 0 < x < 1e6 for x in self.factors + self.long_factors):
                raise ValueError("longrope needs as many short as long factors, each positive")
            if not 0 < self.attention_factor < 100:
                raise ValueError(f"longrope attention_factor {self.attention_factor!r} out of range")
        if not (0 < self.factor < 1e6) or self.original_context_length <= 0:
            raise ValueError(f"rope scaling factor {self.factor!r} / original context {self.original_context_length!r} "
                             "out of range")
        if self.kind == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor < 1e6:
            raise ValueError(f"llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor (they are "
                             f"{self.low_freq_factor!r} and {self.high_freq_factor!r})")


@dataclass(frozen=True)
class Rotary:
    """How a decoder rotates q and k: the base ``theta``, its ``scaling`` for long contexts, the part of each
    head rotated (``dim``: the first dim dimensions, partial rotary; 0 → the whole head), the sliding layers'
    own base (``local_theta``, unscaled: OLMo 3 leaves its full layers' YaRN out of them; None: every layer
    the same RoPE), and per layer whether it rotates at all (``layers``: False is a NoPE layer; () → all)."""

    theta: float = 10000.0
    scaling: RopeScaling | None = None
    dim: int = 0
    local_theta: float | None = None
    layers: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        try:
            check_range(self, ("theta",), 0.0, 1e12, low_open=True)
            if self.local_theta is not None:
                check_range(self, ("local_theta",), 0.0, 1e12, low_open=True)
            if self.dim:
                check_sizes(self, {"dim": 4096})
                if self.dim % 2:
                    raise ValueError(f"dim = {self.dim} is odd: RoPE rotates pairs")
        except ValueError as e:
            raise ValueError(f"RoPE: {e}") from None
        layers = tuple(self.layers)
        if any(type(v) is not bool for v in layers):
            raise ValueError("RoPE: layers must give True or False for each layer")
        object.__setattr__(self, "layers", () if all(layers) else layers)  # one spelling: () is every layer

    def at(self, layer: int) -> bool:
        """Whether layer ``layer`` rotates q and k (False: a NoPE layer)."""
        return not self.layers or self.layers[layer]

    def pairs(self, head_dim: int) -> int:
        """The frequencies of a head of ``head_dim`` (half its rotated dimensions)."""
        return (self.dim or head_dim) // 2


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None, long: bool = False) -> torch.Tensor:
    """θ_j = theta^(-2j / hd) for j < hd / 2, then scaled: (hd / 2,) float32. ``head_dim``: the dimensions
    rotated (the rope_dim of a partial rotary). ``long``: longrope's long factors (else its short ones)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "factors":
        return inv_freq / torch.tensor(scaling.factors, dtype=torch.float32)
    if scaling.kind == "longrope":
        factors = scaling.long_factors if long else scaling.factors
        if len(factors) != inv_freq.numel():
            raise ValueError(f"{len(factors)} RoPE factors for {inv_freq.numel()} frequencies")
        # as transformers: θ_j = 1 / (f_j · base^(2j/hd)), one float32 rounding
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) *
                      theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.kind == "yarn":
        return _yarn(inv_freq, head_dim, theta, scaling)
    # llama3: a wavelength beyond the original context is divided by factor, one shorter than
    # original / high_freq_factor is kept, and those between are blended smoothly.
    old = scaling.original_context_length
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / scaling.low_freq_factor, inv_freq / scaling.factor, inv_freq)
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= old / scaling.high_freq_factor) & (wavelen <= old / scaling.low_freq_factor)
    return torch.where(medium, blended, scaled)


def _yarn(inv_freq: torch.Tensor, dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """YaRN's blend of θ_j (extrapolated) and θ_j / factor (interpolated), as transformers computes it."""
    def dim_of(rotations: float) -> float:  # the dimension index whose frequency turns ``rotations`` times
        return dim * math.log(s.original_context_length / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp  # 1: the frequency kept
    base = theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)  # 1 / θ_j, rounded as transformers
    return 1.0 / (s.factor * base) * (1 - extrapolated) + 1.0 / base * extrapolated


def rope_angles(inv_freq: torch.Tensor, start: int, length: int, dtype: torch.dtype,
                positions: torch.Tensor | None = None, factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of p · θ (× ``factor``: longrope's attention factor), computed in float32: for positions
    start … start+length-1, each (T, hd); given each sequence's own ``positions`` (B, T) instead (a padded
    batch), each (B, 1, T, hd). hd here is the rotated dimensions (2 · len(inv_freq))."""
    if positions is None:
        positions = torch.arange(start, start + length, device=inv_freq.device)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (…, T, hd / 2)
    angles = torch.cat((angles, angles), dim=-1)                 # (…, T, hd): the same angle for both halves
    if angles.dim() == 3:
        angles = angles[:, None]                                 # (B, 1, T, hd): broadcast over heads
    if factor != 1.0:
        return (angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, h, T, hd) by the angles of its positions; with cos, sin of fewer dimensions (partial
    rotary) the first cos.size(-1) are rotated and the rest pass unchanged."""
    d = cos.size(-1)
    if d == x.size(-1):
        return x * cos + rotate_half(x) * sin
    rotated, passed = x[..., :d], x[..., d:]
    return torch.cat((rotated * cos + rotate_half(rotated) * sin, passed), dim=-1)


def llama3_from_factors(factors: tuple[float, ...], head_dim: int, theta: float) -> RopeScaling:
    """The llama3 scaling whose per-frequency factors are ``factors`` (what a GGUF's ``rope_freqs``
    stores), so that a config format without per-frequency factors (HF's) can carry it.

    The factors fix only the band edges as fractions of the original context, so low_freq_factor is
    taken as 1 (as in every Llama 3.1 / 3.2 release): from two or more factors inside the band the
    rest follows (the blend is linear in 1 / wavelength); with fewer, high_freq_factor is taken as 4.
    Raises ValueError when no llama3 scaling reproduces the factors to float32 precision.
    """
    f = torch.tensor(factors, dtype=torch.float64)
    base = rope_frequencies(head_dim, theta)
    if f.shape != base.shape:
        raise ValueError(f"{f.numel()} RoPE factors for {base.numel()} frequencies")
    wavelen = 2 * math.pi / base.double()
    factor = float(f.max())
    if not factor > 1.0:
        raise ValueError("no frequency is scaled down")
    ones, scaled = f <= 1 + 1e-6, f >= factor * (1 - 1e-6)
    band = ~ones & ~scaled
    # inside the band, 1/f = (1 - s)/factor + s with s = (old/wavelen - low) / (high - low)
    s = (1 / f[band] - 1 / factor) / (1 - 1 / factor)
    if band.sum() >= 2:
        a, b = torch.linalg.lstsq(torch.stack([1 / wavelen[band], -torch.ones_like(s)], 1), s[:, None]).solution[:, 0]
        high, old = 1 + 1 / float(b), float(a / b)
    elif band.sum() == 1:
        high, old = 4.0, float((3 * s[0] + 1) * wavelen[band][0])
    else:  # no frequency in the band: any original context between the two edges gives the factors
        high = 4.0
        low_edge = float(wavelen[ones].max()) * high if ones.any() else 0.0
        high_edge = float(wavelen[scaled].min())
        old = float(2 ** math.ceil(math.log2(max(low_edge, 1.0))))
        if not low_edge < old < high_edge:
            old = (low_edge + high_edge) / 2
    for high_try in (round(high, 4), high):
        try:
            candidate = RopeScaling("llama3", factor=factor, low_freq_factor=1.0, high_freq_factor=high_try,
                                    original_context_length=max(1, round(old)))
        except ValueError:
            continue
        again = base.double() / rope_frequencies(head_dim, theta, candidate).double()
        if torch.allclose(again, f, rtol=1e-5, atol=0):
            return candidate
    raise ValueError("the per-frequency RoPE factors are not those of any llama3 scaling")
