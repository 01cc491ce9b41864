"""verify of models larger than any this machine holds, on paper: the peak from the planner's own
formula (``gptconv.memory.verify_need``), the time from the rates the 8B verify measured.

``python -m gptconv.bench.paper [--rates FILE]``: ``FILE`` is the JSON one 8B verify's bench worker
printed (its ``where``, ``seconds`` and ``read_bytes``); without one, the rates this file was last
written with (the README's run).
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch

from .. import memory
from ..families import for_hf

# the published config.json of each (as the Hub serves them), the parts the planner reads
MODELS = {
    "llama-3-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                       tie_word_embeddings=False),
    "llama-3-70b": dict(model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                        tie_word_embeddings=False),
    "qwen3-32b": dict(model_type="qwen3", vocab_size=151936, hidden_size=5120, intermediate_size=25600,
                      num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                      tie_word_embeddings=False),
}
# what verify's default inputs are at these models' contexts: the three prompts (tokenized, about this
# long) and 1,024 random ids
LENGTHS = [6, 30, 24, 1024]
# the rates of the synthetic Llama-3-8B's HF-folder verify (bf16 files), this machine: seconds per
# parameter-position of each run, and bytes read per second; see README (Benchmark) for the run
# (2026-12-07: truth 280 s, own 127 s, ours 120 s, comparing 4 s, reading 42 s over 1,084 positions)
_P, _T = 8_030_261_248, sum(LENGTHS)
RATES = {"truth": 280 / (_P * _T), "own": 127 / (_P * _T), "ours": 120 / (_P * _T), "comparing": 4 / (_P * _T),
         "reading": 42 / _P}


def config_of(name: str) -> object:
    data = MODELS[name]
    family = for_hf(data["model_type"], name)
    return family.config_from_hf(dict(data), name)


def rates_from(run: dict, name: str = "llama-3-8b") -> dict[str, float]:
    """Seconds per parameter-position (compute) and per parameter (reading) of each part of a verify."""
    s = memory.Shape.of(config_of(name))
    positions = sum(run["inputs"].values())
    out = {k: v / (s.params * positions) for k, v in run["where"].items() if k != "reading"}
    out["reading"] = run["where"].get("reading", 0.0) / s.params
    return out


def predict(name: str, rates: dict[str, float], stored: int = 2) -> dict:
    """Peak (GB) and time (minutes) of a streamed fp32 verify of ``name`` from a bf16 folder."""
    s = memory.Shape.of(config_of(name))
    need = memory.verify_need(name, s, LENGTHS, torch.float32, stored, True)
    positions = sum(LENGTHS)
    seconds = {k: rate * s.params * (positions if k != "reading" else 1) for k, rate in rates.items()}
    return {"params": s.params, "stored": s.params * stored, "peak": need.peak, "phase": need.largest()[0],
            "largest block float64": s.block * 8, "seconds": seconds, "minutes": sum(seconds.values()) / 60,
            "fits": need.peak <= 24 * 2**30}


@click.command()
@click.option("--rates", "rates_file", type=click.Path(path_type=Path), default=None)
def main(rates_file: Path | None) -> None:
    rates = rates_from(json.loads(rates_file.read_text())) if rates_file else RATES
    for name in MODELS:
        p = predict(name, rates)
        where = ", ".join(f"{k} {v / 60:.0f} min" for k, v in p["seconds"].items() if v >= 30)
        click.echo(f"{name}: {p['params'] / 1e9:.2f}B parameters ({p['stored'] / 1e9:.0f} GB bf16); predicted peak "
                   f"{p['peak'] / 1e9:.1f} GB at {p['phase']} (a float64 block is {p['largest block float64'] / 1e9:.2f} "
                   f"GB); {p['minutes']:.0f} min ({where}); {'fits' if p['fits'] else 'does not fit'} in 24 GiB")


if __name__ == "__main__":
    main()
