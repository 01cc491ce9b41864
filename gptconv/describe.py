"""What ``trace`` says of a decoder model beyond its steps: how position enters, and what else its config
turns on (a family with a model of its own says its lines in its file)."""

from __future__ import annotations

from .layers.decoder import DecoderConfig, Feature


def describe_decoder(cfg: DecoderConfig) -> list[str]:
    """``trace``'s lines on how position enters, and what else the config turns on."""
    scaling = f", {cfg.rope.scaling.kind} scaling" if cfg.rope.scaling else ""
    local = (f"; sliding layers: theta = {cfg.rope.local_theta:g} unscaled" if cfg.rope.local_theta is not None
             else "")
    lines = [f"position: no position embedding; RoPE (theta = {cfg.rope.theta:g}{scaling}{local}) rotates Q and K "
             f"inside every attention layer; GQA: {cfg.n_heads} query heads share {cfg.n_kv_heads} K/V heads"]
    n = cfg.n_layers
    linear = [i for i in range(n) if cfg.linear_at(i)]
    if linear:
        s = cfg.linear_attention
        full = [i for i in range(n) if not cfg.linear_at(i)]
        lines.append(f"mixing positions: attention in layers {', '.join(map(str, full)) or 'none'}; linear attention "
                     f"(a gated delta rule, no position signal but order) in {len(linear)} layers "
                     f"({', '.join(map(str, linear))}): each keeps a state of {s.v_heads} heads × {s.k_dim} × {s.v_dim} "
                     f"and a {s.conv_kernel}-tap convolution, the same size at any length")
    conv = [i for i in range(n) if cfg.conv_at(i)]
    if conv:
        k = cfg.short_conv.kernel
        full = [i for i in range(n) if not cfg.conv_at(i)]
        lines.append(f"mixing positions: attention in layers {', '.join(map(str, full)) or 'none'}; a gated short "
                     f"convolution (out(C ⊙ conv(B ⊙ x)): each position sees its last {k}, order by the taps) in "
                     f"{len(conv)} layers ({', '.join(map(str, conv))}): each keeps its last {k - 1} inputs")
    sliding = sum(cfg.window(i) is not None for i in range(n))
    nope = [i for i in range(n) if not cfg.rope_at(i)]
    extras = []
    if sliding:
        which = "each layer" if sliding == n else f"{sliding} of {n} layers (the others see every position)"
        extras.append(f"{which}: each position sees the last {cfg.attention.window} only (sliding window)")
    if nope:
        extras.append(f"NoPE layers (no RoPE: order only through the causal mask): {', '.join(map(str, nope))}")
    if cfg.rope.dim:
        extras.append(f"partial rotary: RoPE on the first {cfg.rope.dim} of {cfg.head_dim} dimensions of each head")
    if cfg.rope.scaling is not None and cfg.rope.scaling.kind == "longrope":
        extras.append(f"longrope: long factors past {cfg.rope.scaling.original_context_length} positions, "
                      f"cos and sin × {cfg.rope.scaling.attention_factor:.4g}")
    if cfg.attention.qk_norm:
        extras.append("q and k " + ("RMS-normed over the whole projection" if cfg.attention.qk_norm_over == "all"
                                    else "heads RMS-normed") + " before RoPE")
    if cfg.norms.place in ("post", "sandwich"):
        extras.append({"post": "norms after each sublayer, on its output, before the residual add (none before)",
                       "sandwich": "norms before and after each sublayer"}[cfg.norms.place])
    if cfg.norms.parallel:
        extras.append("parallel residual: attention and MLP both read the block's input, each through its own "
                      "norm, x + attn(norm1(x)) + mlp(norm2(x))")
    if cfg.norms.kind == "layer":
        extras.append("LayerNorm (x − mean) / std · w + b for RMSNorm")
    if not cfg.mlp.gated:
        extras.append(f"MLP: down({cfg.mlp.act}(up(x))), ungated" + (", with biases" if cfg.mlp.bias else ""))
    if Feature.MUP in cfg.features():
        m = cfg.multipliers
        scale = "head_dim^-½" if m.attention is None else f"{m.attention:g}"
        extras.append(f"µP: token_embedding × {m.embedding:g}, each sublayer's output × "
                      f"{m.residual:g}, attention scores × {scale}, logits ÷ {m.logits:g}")
    if (e := cfg.experts) is not None:
        dense = n - sum(cfg.experts_at(i) for i in range(n))
        extras.append(f"MLP: {e.used} of {e.count} experts per token"
                      + ("" if e.renormalise else " (weights not renormalised)")
                      + (f"; {dense} dense layers" if dense else "")
                      + (f"; a shared expert of {e.shared_d_ff} on every token" if e.shared_d_ff else ""))
    if cfg.attention.gate:
        extras.append("attention's output × sigmoid(gate(x)) before its projection")
    if cfg.norms.offset:
        extras.append("RMSNorms scale by 1 + w")
    if cfg.mtp_layers:
        extras.append(f"{cfg.mtp_layers} multi-token-prediction layer(s) (a draft head) held for export, not run")
    return lines + (["also: " + "; ".join(extras)] if extras else [])
