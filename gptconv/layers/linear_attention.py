"""Linear attention with a gated delta rule (Qwen3.5/3.6, Qwen3-Next): a layer that mixes positions
through a fixed-size recurrent state instead of attending over a growing list of keys.

Per value head the state S is a (k_dim × v_dim) matrix, a memory from keys to values. At each token,
with its key k and query q L2-normalised (q also × k_dim^-½), its value v, a decay g ≤ 0 and a write
strength β ∈ (0, 1):

    S ← exp(g) · S                        forget a little of everything
    S ← S + k ⊗ β (v − Sᵀk)               write v at k, replacing what k recalled (the delta rule)
    o = Sᵀ q                              read at q

``recurrent_delta_rule`` runs that one token at a time (generation); ``chunked_delta_rule`` runs the
same recurrence over chunks of positions, inside each chunk in closed form (a unit lower-triangular
solve), which is what a prompt needs. They are equal up to rounding (a test holds them to it).

Around the rule (``GatedDeltaNet``, (B, T, d) → (B, T, d)): q, k, v come from one projection through a
short causal convolution (kernel ``conv_kernel``, SiLU), per value head β = sigmoid(b) and
g = −exp(A_log) · softplus(a + dt_bias) from two small projections, and the output is RMS-normed per head
and gated by SiLU(z) of a fourth projection before the output projection. Key heads may be fewer than
value heads: value head j reads key head j // (v_heads / k_heads). The layer's cache slot holds the
convolution's last inputs and S: constant in the sequence's length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config_checks import check_sizes
from .conv import CausalConv
from .kv_cache import RecurrentState
from .linear import Linear
from .norms import rms_norm

CHUNK = 64  # positions solved together in a prompt (transformers' torch fallback uses 64 too)
L2_EPS = 1e-6  # in q and k's L2 norm, as transformers (and the fla kernels) use


@dataclass(frozen=True)
class DeltaNetShape:
    """A gated delta-rule layer's sizes (HF: linear_num_key_heads, linear_num_value_heads,
    linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim)."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int = 4

    def __post_init__(self) -> None:
        check_sizes(self, {"k_heads": 1024, "v_heads": 1024, "k_dim": 4096, "v_dim": 4096, "conv_kernel": 64})
        if self.v_heads % self.k_heads:
            raise ValueError(f"linear attention: {self.v_heads} value heads are not a multiple of {self.k_heads} "
                             "key heads")

    @property
    def conv_channels(self) -> int:
        """q, k and v pass the convolution together: 2 · k_heads · k_dim + v_heads · v_dim channels."""
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    def state_bytes(self, dtype: torch.dtype) -> int:
        """One sequence's slot: the convolution's last inputs (in ``dtype``) and S (float32)."""
        conv = self.conv_channels * (self.conv_kernel - 1) * torch.tensor([], dtype=dtype).element_size()
        return conv + self.v_heads * self.k_dim * self.v_dim * 4


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / √(Σx² + eps) over the last dimension."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def recurrent_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule one position at a time. q, k: (B, H, T, dk); v: (B, H, T, dv); g, beta: (B, H, T);
    state S: (B, H, dk, dv). Returns the outputs (B, H, T, dv) and the state after the last position."""
    out = []
    for t in range(q.size(2)):
        state = state * g[:, :, t, None, None].exp()                              # forget
        k_t = k[:, :, t]                                                          # (B, H, dk)
        recalled = (k_t[..., None] * state).sum(-2)                               # Sᵀk: (B, H, dv)
        written = (v[:, :, t] - recalled) * beta[:, :, t, None]                   # β (v − Sᵀk)
        state = state + k_t[..., None] * written[..., None, :]                    # + k ⊗ written
        out.append((q[:, :, t, :, None] * state).sum(-2))                         # Sᵀq: (B, H, dv)
    return torch.stack(out, dim=2), state


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       state: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence, ``chunk`` positions at a time. Within a chunk, with Γ_i the running sum of g up
    to position i (so S after i is exp(Γ_i) S₀ plus the writes, each decayed by exp(Γ_i − Γ_j)):

        the writes u_j = β_j (v_j − (recalled at j)) solve (I + A) U = βV − diag(β·e^Γ) K S₀,
            A_jm = β_j e^(Γ_j − Γ_m) k_j·k_m for m < j (unit lower-triangular: one solve);
        outputs  o_i = e^(Γ_i) q_i S₀ + Σ_(j ≤ i) e^(Γ_i − Γ_j) (q_i·k_j) u_j;
        the state after the chunk  S = e^(Γ_L) S₀ + Σ_j e^(Γ_L − Γ_j) k_j ⊗ u_j.

    Shapes as ``recurrent_delta_rule``."""
    T, out = q.size(2), []
    for s in range(0, T, chunk):
        qc, kc, vc, gc, bc = (x[:, :, s:s + chunk] for x in (q, k, v, g, beta))   # (B, H, L, ·)
        L = qc.size(2)
        cum = gc.cumsum(-1)                                                       # Γ: (B, H, L)
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # (L, L)
        a = (bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)    # A: strictly lower
        rhs = torch.cat([vc * bc[..., None], kc * (bc * cum.exp())[..., None]], dim=-1)  # [βV | β e^Γ K]
        solved = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)  # (I + A)⁻¹ ·
        u = solved[..., :vc.size(-1)] - solved[..., vc.size(-1):] @ state         # U: (B, H, L, dv)
        out.append((qc * cum.exp()[..., None]) @ state + ((qc @ kc.transpose(-1, -2)) * decay) @ u)
        last = cum[..., -1:]                                                      # Γ_L: (B, H, 1)
        state = state * last[..., None].exp() + (kc * (last - cum).exp()[..., None]).transpose(-1, -2) @ u
    return torch.cat(out, dim=2), state


class GatedRMSNorm(nn.Module):
    """RMSNorm over each head's output, then × SiLU(z): rounded to the input's dtype after the weight
    (as ``rms_norm``), the gate applied in float32."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return (rms_norm(x, self.weight, self.eps) * F.silu(z.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """(B, T, d) → (B, T, d): the linear-attention layer (see the module's docstring)."""

    def __init__(self, d_model: int, shape: DeltaNetShape, norm_eps: float) -> None:
        super().__init__()
        s = self.shape = shape
        self.in_qkv = Linear(d_model, s.conv_channels, bias=False)       # q, k, v: all heads of each, in turn
        self.in_z = Linear(d_model, s.v_heads * s.v_dim, bias=False)      # the output gate
        self.in_b = Linear(d_model, s.v_heads, bias=False)                # β's logit, per value head
        self.in_a = Linear(d_model, s.v_heads, bias=False)                # the decay's input, per value head
        self.conv = CausalConv(s.conv_channels, s.conv_kernel)
        self.A_log = nn.Parameter(torch.zeros(s.v_heads))                 # decay rate: exp(A_log) > 0
        self.dt_bias = nn.Parameter(torch.ones(s.v_heads))
        self.norm = GatedRMSNorm(s.v_dim, norm_eps)
        self.out = Linear(s.v_heads * s.v_dim, d_model, bias=False)

    def make_state(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device,
                   reserve: int | None) -> RecurrentState:
        """This layer's cache slot: the convolution's last inputs and S, whatever the length."""
        s = self.shape
        return RecurrentState(batch, s.conv_channels, s.conv_kernel, dtype, device,
                              recurrent=(s.v_heads, s.k_dim, s.v_dim))

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:
        s, (B, T, _) = self.shape, x.shape
        slot = step.cache.slot(step.layer, T) if step.cache is not None else None
        real = None if step.pad is None else step.pad.key_mask[:, -T:]   # (B, T): False at pad tokens
        if real is not None:
            x = x * real[..., None].to(x.dtype)                           # a pad writes nothing
        qkv = F.silu(self.conv(self.in_qkv(x), slot))                     # (B, T, 2·hk·dk + hv·dv)
        q, k, v = qkv.split([s.k_heads * s.k_dim, s.k_heads * s.k_dim, s.v_heads * s.v_dim], dim=-1)
        step.tap("conv", qkv)
        beta = torch.sigmoid(self.in_b(x)).float()                        # (B, T, hv): write strength
        g = -self.A_log.float().exp() * F.softplus(self.in_a(x).float() + self.dt_bias.float())  # (B, T, hv): decay
        if real is not None:                                              # a pad neither forgets nor writes
            g, beta = g * real[..., None], beta * real[..., None]
        group = s.v_heads // s.k_heads                                    # value heads per key head

        def heads(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:    # (B, T, n·dim) → (B, hv, T, dim), f32
            t = t.reshape(B, T, n, dim).transpose(1, 2).float()
            return t.repeat_interleave(group, dim=1) if n != s.v_heads else t
        q = l2_normalize(heads(q, s.k_heads, s.k_dim)) * s.k_dim ** -0.5
        k = l2_normalize(heads(k, s.k_heads, s.k_dim))
        v = heads(v, s.v_heads, s.v_dim)
        g, beta = g.transpose(1, 2), beta.transpose(1, 2)                 # (B, hv, T)
        state = slot.recurrent if slot is not None else q.new_zeros(B, s.v_heads, s.k_dim, s.v_dim)
        rule = recurrent_delta_rule if T == 1 else chunked_delta_rule
        y, state = rule(q, k, v, g, beta, state)                          # (B, hv, T, dv), state (B, hv, dk, dv)
        if slot is not None:
            slot.recurrent = state
        y = y.transpose(1, 2).to(x.dtype)                                 # (B, T, hv, dv)
        step.tap("linear_attention", y)
        z = self.in_z(x).view(B, T, s.v_heads, s.v_dim)
        y = self.norm(y, z)                                               # per head: RMSNorm, × SiLU(z)
        step.tap("gated_norm", y)
        return self.out(y.reshape(B, T, s.v_heads * s.v_dim))
