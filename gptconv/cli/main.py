"""Each command parses its arguments, calls one library function, and prints its result.

Exit status: 0 success; 1 a parity check failed; 2 bad input or usage (one line on stderr,
``--debug`` for the traceback); 3 an error gptconv did not expect, which is a bug (one line too);
130 interrupted, 143 terminated; a reader that leaves a pipe early (``| head``) ends it quietly, 0.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from ..errors import GptconvError, first_line
from ..output import Terminated, note_interrupts, signalled
from ..writers.tensors import DTYPE_SYNONYMS, EXPORT_DTYPES, LLAMA_QUANTS
from . import render
from .envelope import envelope


BUG = 3  # exit status of an exception we did not expect: 2 means bad input, and this is not known to be


class Signalled(BaseException):
    """A command stopped by a signal, whatever exception the interrupted code raised for it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            try:
                return super().invoke(ctx)
            except Exception as e:  # an interrupted read may surface as any error: it is still the signal
                if signalled() is not None and not isinstance(e, (click.exceptions.Exit, click.ClickException)):
                    raise Signalled(signalled()) from e
                raise
        except Signalled as e:
            fail(ctx, "interrupted", code=130) if e.signum == signal.SIGINT else fail(ctx, "terminated", code=143)
        except GptconvError as e:
            fail(ctx, str(e))
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            fail(ctx, "interrupted", code=130)
        except Terminated:
            fail(ctx, "terminated", code=143)
        except BrokenPipeError:  # `gptconv inspect … | head`: the reader left; say nothing more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except OSError as e:  # the system refused a file operation: a path or the machine, not a bug
            fail(ctx, f"{e.filename}: {e.strerror}" if e.filename and e.strerror else f"{type(e).__name__}: {first_line(e)}")
        except MemoryError:
            fail(ctx, "out of memory")
        except RuntimeError as e:  # torch reports a failed allocation as a RuntimeError
            if "can't allocate memory" not in str(e) and "not enough memory" not in str(e):
                fail(ctx, f"internal error, a bug in gptconv: RuntimeError: {first_line(e)} "
                          "(rerun with --debug for the traceback)", code=BUG)
            fail(ctx, f"out of memory ({first_line(e)})")
        except BaseException as e:  # a bug (a Rust panic is a BaseException too): one line, its own status
            if isinstance(e, (SystemExit, GeneratorExit)):
                raise
            fail(ctx, f"internal error, a bug in gptconv: {type(e).__name__}: {first_line(e)} "
                      "(rerun with --debug for the traceback)", code=BUG)


class FiniteFloat(click.FloatRange):
    """A FloatRange that refuses NaN (every comparison with NaN is false, so a plain range lets it in)."""

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        if value != value:
            self.fail("nan is not a number", param, ctx)
        return value


class ByteSize(click.ParamType):
    """'5GB', '500MB', '2GiB', '1000000' → bytes."""

    name = "size"
    UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "KI": 2**10, "MI": 2**20, "GI": 2**30,
             "TI": 2**40}

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        m = re.fullmatch(r"\s*(\d{1,15}(?:\.\d{1,15})?)\s*([KMGT]i?)?B?\s*", str(value), re.IGNORECASE)
        if not m:
            self.fail(f"'{str(value)[:40]}': expected a size like 5GB, 500MB or 2GiB", param, ctx)
        size = int(float(m.group(1)) * self.UNITS[(m.group(2) or "").upper()])
        if size <= 0:
            self.fail(f"'{value}' must be positive", param, ctx)
        return size


SEED = click.IntRange(0, 2**63 - 1)  # torch.Generator.manual_seed's range



def fail(ctx: click.Context, message: str, code: int = 2) -> None:
    if ctx.obj and ctx.obj.get("debug"):
        traceback.print_exc()
    say(message)
    if ctx.obj and ctx.obj.get("json"):  # a consumer's json.load works on every exit, a failure included
        kind = {2: "input", 130: "interrupted", 143: "terminated", BUG: "internal"}.get(code, "error")
        click.echo(json.dumps({"command": ctx.obj["json"], "error": {"kind": kind, "message": message, "exit": code}}))
    sys.exit(code)


def _note_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """--json given: a failure is written as JSON on stdout too (see ``fail``)."""
    root = ctx.find_root()
    if value and isinstance(root.obj, dict):
        root.obj["json"] = ctx.info_name
    return value


def say(message: str) -> None:
    """One error line on stderr; bytes of a file name that are not UTF-8 shown as \\xNN."""
    try:
        message = message.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate from elsewhere (a JSON string)
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    click.echo(f"gptconv: error: {' '.join(message.splitlines())}", err=True)


EXIT_STATUSES = """\b
Exit status: 0 done; 1 a parity check failed (verify); 2 bad input or usage, one line on stderr;
3 an error gptconv did not expect (a bug; --debug shows the traceback); 130 interrupted; 143 terminated.
SOURCE: a Hub repo id (owner/name), an alias (`gptconv aliases`), an HF folder, or a .gguf/.safetensors file.
--json (pull, verify, export, perplexity, inspect): {command, versions, source: {name, repo, revision,
commit, path, files: [{name, bytes, sha256}]}, seconds, result}."""


def _print_version(ctx: click.Context, _param, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from .envelope import versions
        found = versions()
        others = (f"{name} {found[name] or 'not installed'}" for name in ("torch", "transformers", "llama-cpp-python", "gguf"))
        click.echo(f"gptconv {found['gptconv']} ({', '.join(others)})")
        ctx.exit()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_STATUSES)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print gptconv's version and those of torch and the references, then exit.")
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """gptconv: pretrained GPT-2 and Llama weights in clean PyTorch, proven right."""
    ctx.obj = {"debug": debug}


def example(*lines: str) -> str:
    """A command's help epilog: its examples, kept as written."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


@cli.command(epilog=example("gptconv aliases", "gptconv aliases --json"))
@click.option("--json", "as_json", is_flag=True, callback=_note_json, help="Print the table as JSON.")
def aliases(as_json: bool) -> None:
    """The short names SOURCE accepts, and the Hub repo each stands for."""
    from ..sources.hub import aliases as known
    table = known()
    if as_json:
        click.echo(json.dumps(table, indent=2))
        return
    width = max(map(len, table))
    for name, repo in table.items():
        click.echo(f"{name:<{width}}  {repo}")


class DType(click.ParamType):
    """One set of dtype names everywhere — f32, f16, bf16 (and export's q8_0, q4_k_m …) — with float32,
    float16 and bfloat16 (fp32, fp16) taken as synonyms. ``long``: give the library torch's names."""

    name = "dtype"
    SYNONYMS = DTYPE_SYNONYMS
    LONG = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}

    def __init__(self, choices: list[str], long: bool = False) -> None:
        self.choices, self.long = choices, long

    def convert(self, value, param, ctx):
        name = self.SYNONYMS.get(str(value).lower(), str(value).lower())
        if name not in self.choices:
            self.fail(f"'{value}': choose {', '.join(self.choices)} (float32, float16, bfloat16 are f32, f16, bf16)",
                      param, ctx)
        return self.LONG.get(name, name) if self.long else name

    def get_metavar(self, param, ctx=None) -> str:
        return "[" + "|".join(self.choices) + "]"


source_arg = click.argument("source")
revision_opt = click.option("--revision", default=None, help="Hub branch, tag or commit.")
device_opt = click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda[:N]|mps|auto",
                          help="Where the model runs (auto: cuda, else mps, else cpu).")
dtype_opt = click.option("--dtype", default="f32", show_default=True, type=DType(["f32", "bf16", "f16"], long=True),
                         help="The dtype the model computes in (float32, bfloat16, float16 are synonyms).")


@cli.command(epilog=example('gptconv pull gpt2', 'gptconv pull HuggingFaceTB/SmolLM2-135M --revision main'))
@source_arg
@click.option("--json", "as_json", is_flag=True, callback=_note_json, help="Print the summary as JSON (see `gptconv --help`).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars (they show on a terminal only anyway).")
@revision_opt
def pull(source: str, as_json: bool, quiet: bool, revision: str | None) -> None:
    """Download (or find) SOURCE, map and check every tensor, print a summary."""
    from ..api import pull as pull_
    if as_json or quiet:  # huggingface-hub's download bars (shown on a terminal only in any case)
        from huggingface_hub.utils import disable_progress_bars
        disable_progress_bars()
    start = time.perf_counter()
    summary = pull_(source, revision)
    if as_json:
        click.echo(envelope("pull", summary, time.perf_counter() - start, source, revision))
    else:
        render.pull_summary(summary)


@cli.command(epilog=example('gptconv trace gpt2 "The capital of France is"', 'gptconv trace model.gguf --ids 464,3139,286'))
@source_arg
@click.argument("text", required=False)
@click.option("--ids", default=None, help="Token ids instead of TEXT, e.g. '464,3139,286'.")
@dtype_opt
@click.option("--stream/--no-stream", default=None,
              help="Read the model one block at a time as it runs [default: when it would not fit in memory whole].")
@device_opt
@revision_opt
def trace(source: str, text: str | None, ids: str | None, dtype: str, stream: bool | None, device: str,
          revision: str | None) -> None:
    """Print each named step of the forward pass on TEXT, with its shape and statistics."""
    from ..api import trace as trace_
    render.trace(trace_(source, text, ids, dtype, revision, device, stream))


@cli.command(epilog=example('gptconv generate gpt2 "Once upon a time" -n 40', 'gptconv generate smollm2-135m "Hi" --temperature 0.8 --top-p 0.95 --seed 0 --stop "\\\\n\\\\n"'))
@source_arg
@click.argument("prompt")
@click.option("--max-new-tokens", "-n", default=32, show_default=True, type=click.IntRange(1, 1 << 20))
@click.option("--temperature", default=0.0, show_default=True, type=FiniteFloat(0, 100),
              help="0 is greedy.")
@click.option("--top-k", default=None, type=click.IntRange(1), help="Sample from the k most likely tokens.")
@click.option("--top-p", default=None, type=FiniteFloat(0, 1),
              help="Sample from the fewest most likely tokens whose probabilities reach p.")
@click.option("--stop", multiple=True, help="Stop once the new text holds this string (repeatable); it is not printed.")
@click.option("--seed", default=None, type=SEED, help="Seed for sampling.")
@click.option("--chat", is_flag=True, help="Wrap PROMPT as a user message in the model's chat template.")
@dtype_opt
@device_opt
@revision_opt
def generate(source: str, prompt: str, max_new_tokens: int, temperature: float, top_k: int | None,
             top_p: float | None, stop: tuple[str, ...], seed: int | None, chat: bool, dtype: str, device: str,
             revision: str | None) -> None:
    """Continue PROMPT, token by token with the KV cache (greedy by default)."""
    from ..api import generate as generate_
    result = generate_(source, prompt, max_new_tokens, chat=chat, temperature=temperature, top_k=top_k, top_p=top_p,
                       stop=list(stop), seed=seed, dtype=dtype, revision=revision, device=device,
                       on_text=lambda piece: click.echo(piece, nl=False))
    click.echo()
    if result.stopped_at_context:
        click.echo(f"gptconv: note: stopped after {len(result.ids)} of {max_new_tokens} tokens: the model's context "
                   f"holds {len(result.prompt_ids) + len(result.ids):,} positions", err=True)


@cli.command(epilog=example('gptconv verify gpt2', 'gptconv verify llama-3.2-1b --dtype bf16', 'gptconv verify model.gguf --against llama.cpp'))
@source_arg
@dtype_opt
@click.option("--length", default=None, type=click.IntRange(1), help="Random-input length [full context, ≤ 1024].")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the random input ids.")
@click.option("--reference", "reference_file", type=click.Path(path_type=Path), default=None,
              help="Compare with a file from `gptconv reference` instead of running transformers.")
@click.option("--stream/--no-stream", default=None,
              help="Run the models one block at a time, for checkpoints too large to hold beside the reference "
                   "[default: when they would not fit in memory side by side].")
@click.option("--against", default="transformers", show_default=True, type=click.Choice(["transformers", "llama.cpp"]),
              help="The reference: transformers, or llama.cpp (llama-cpp-python) for a GGUF file.")
@click.option("--json", "as_json", is_flag=True, callback=_note_json, help="Print the report as JSON.")
@device_opt
@click.option("--quiet", "-q", is_flag=True, help="No progress bars (they show on a terminal only anyway).")
@revision_opt
def verify(source: str, dtype: str, length: int | None, seed: int, reference_file: Path | None, stream: bool | None,
           against: str, as_json: bool, device: str, quiet: bool, revision: str | None) -> None:
    """Check our logits against a reference, step by step; exit 1 if parity fails.

    Against transformers, at every dtype, the reference runs in float64 (the truth) and in our dtype,
    and ours passes when it is as close to the truth as the reference's own run (within a factor of 2).
    """
    from ..api import verify as verify_
    start = time.perf_counter()
    with progress_bar(as_json or quiet, "verify", "step") as progress:
        report = verify_(source, dtype, length, seed, reference_file, revision, stream, against, device, progress)
    if as_json:
        click.echo(envelope("verify", report, time.perf_counter() - start, source, revision))
    else:
        render.verify_report(report)
    sys.exit(0 if report.passed else 1)


@cli.command(epilog=example('gptconv reference gpt2 -o gpt2.ref.safetensors', 'gptconv verify gpt2 --reference gpt2.ref.safetensors'))
@source_arg
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--length", default=None, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--dtype", default="f32", show_default=True, type=DType(["f32", "bf16", "f16"], long=True),
              help="Also record the reference's own run in this dtype, for `verify --dtype` of the same.")
@revision_opt
@click.option("--force", is_flag=True, help="Replace an existing output.")
def reference(source: str, output: Path, length: int | None, seed: int, dtype: str, revision: str | None,
              force: bool) -> None:
    """Record transformers' outputs on the fixed inputs (in float64, float32 and --dtype), for `verify --reference`."""
    from ..api import record_reference
    path = record_reference(source, output, length, seed, revision, dtype, force)
    click.echo(f"wrote {path} ({path.stat().st_size:,} bytes)")


@cli.command(epilog=example('gptconv export gpt2 --format safetensors -o gpt2-hf', 'gptconv export smollm2-135m --format gguf --dtype q4_k_m -o s.gguf --check alice.txt'))
@source_arg
@click.option("--format", "fmt", required=True, type=click.Choice(["safetensors", "gguf"]))
@click.option("--dtype", default="f32", show_default=True, metavar="DTYPE",
              type=DType([*EXPORT_DTYPES, *LLAMA_QUANTS]),
              help="f32, f16, bf16, q8_0; GGUF also q4_0 q4_1 q5_0 q5_1 q2_k q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m "
                   "q5_k_s q5_k_m q6_k, made by llama.cpp's own quantizer (gptconv[llama-cpp]) by its rules.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
@click.option("--max-shard-size", "max_shard_bytes", default="5GB", show_default=True, type=ByteSize(),
              help="safetensors shard limit, e.g. 500MB.")
@click.option("--force", is_flag=True, help="Replace an existing output.")
@click.option("--clamp", is_flag=True, help="Clip values beyond the float16 range instead of refusing.")
@click.option("--check", "check_text", default=None, type=click.Path(path_type=Path), metavar="TEXT_FILE",
              help="Then measure what the export cost on TEXT_FILE: the written model against SOURCE "
                   "(perplexity, Δppl, KL divergence, same top), as `gptconv perplexity OUT TEXT_FILE --against SOURCE`.")
@click.option("--check-ctx", default=None, type=click.IntRange(4), help="--check's window; 512 or the model's context.")
@click.option("--against", "engine", default="gptconv", show_default=True, type=click.Choice(["gptconv", "llama.cpp"]),
              help="What runs the written file for --check: gptconv (dequantized) or llama.cpp (a GGUF as stored).")
@click.option("--json", "as_json", is_flag=True, callback=_note_json, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars (they show on a terminal only anyway).")
@revision_opt
def export(source: str, fmt: str, dtype: str, output: Path, max_shard_bytes: int, force: bool, clamp: bool,
           check_text: Path | None, check_ctx: int | None, engine: str, as_json: bool, quiet: bool,
           revision: str | None) -> None:
    """Write SOURCE as an HF-layout safetensors folder or a GGUF file llama.cpp runs."""
    from ..api import export as export_
    _refuse_ignored(fmt, check_text)
    start = time.perf_counter()
    with progress_bar(as_json or quiet, "tensors", "tensor") as tensors, \
            progress_bar(as_json or quiet or check_text is None) as windows:
        summary = export_(source, output, fmt, dtype, max_shard_bytes, force, clamp, revision,
                          check=check_text, check_ctx=check_ctx, check_in=engine, on_window=windows, on_tensor=tensors)
    if as_json:
        click.echo(envelope("export", summary, time.perf_counter() - start, source, revision))
    else:
        render.export_summary(summary)
        if summary.check is not None:
            render.perplexity(summary.check)


def _refuse_ignored(fmt: str, check_text: Path | None) -> None:
    """A flag that would change nothing is refused before anything is written: the user meant it to."""
    ctx = click.get_current_context()
    given = lambda name: ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT  # noqa: E731
    if fmt == "gguf" and given("max_shard_bytes"):
        raise click.UsageError("--max-shard-size: a GGUF file is written whole; it applies to --format safetensors")
    for name, flag in (("check_ctx", "--check-ctx"), ("engine", "--against")):
        if check_text is None and given(name):
            raise click.UsageError(f"{flag}: it applies to --check TEXT_FILE, which is not given")


@cli.command(epilog=example('gptconv perplexity gpt2 wiki.txt --ctx 512', 'gptconv perplexity s.q4_k_m.gguf wiki.txt --against smollm2-135m --in llama.cpp'))
@source_arg
@click.argument("text_file", type=click.Path(path_type=Path))
@click.option("--ctx", default=512, show_default=True, type=click.IntRange(4), help="Window length in tokens.")
@click.option("--against", default=None, metavar="BASE",
              help="A base model (same tokenizer): also its perplexity, KL divergence, same top, Δppl.")
@click.option("--in", "engine", default="gptconv", show_default=True, type=click.Choice(["gptconv", "llama.cpp"]),
              help="What runs SOURCE: gptconv (dequantized weights, --dtype), or llama.cpp (a GGUF file as "
                   "stored, its kernels and tokenizer; gptconv[llama-cpp]).")
@dtype_opt
@device_opt
@click.option("--json", "as_json", is_flag=True, callback=_note_json, help="Print the result as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars (they show on a terminal only anyway).")
@revision_opt
def perplexity(source: str, text_file: Path, ctx: int, against: str | None, engine: str, dtype: str, device: str,
               as_json: bool, quiet: bool, revision: str | None) -> None:
    """Perplexity on TEXT_FILE as llama.cpp's llama-perplexity scores it: windows of --ctx tokens, the
    second half of each scored."""
    from ..api import perplexity as perplexity_
    start = time.perf_counter()
    with progress_bar(as_json or quiet) as progress:
        result = perplexity_(source, text_file, ctx, against, dtype, revision, progress, engine, device)
    if as_json:
        click.echo(envelope("perplexity", result, time.perf_counter() - start, source, revision))
    else:
        render.perplexity(result)


@contextlib.contextmanager
def progress_bar(quiet: bool, desc: str = "windows", unit: str = "window") -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr, on a terminal only, never with --json or --quiet: ``progress(done, total)``."""
    from tqdm import tqdm
    with tqdm(desc=desc, unit=unit, disable=quiet or not sys.stderr.isatty(), file=sys.stderr, leave=False) as bar:
        def progress(n: int, total: int) -> None:
            bar.total = total
            bar.update(n - bar.n)
        yield progress


@cli.command(epilog=example('gptconv inspect model.gguf', 'gptconv inspect ./gpt2-hf --json'))
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, callback=_note_json)
def inspect(path: Path, as_json: bool) -> None:
    """List the tensors (name, dtype, shape), metadata and config of a file or folder."""
    from ..api import inspect as inspect_
    start = time.perf_counter()
    result = inspect_(path)
    if as_json:  # a NaN or Inf a config holds is a string: strict JSON
        click.echo(envelope("inspect", result, time.perf_counter() - start, path))
    else:
        render.inspection(result)


def main() -> None:
    """The command line; a usage error (a bad flag, a missing argument) is one line too, exit 2."""
    note_interrupts()
    try:
        code = cli.main(prog_name="gptconv", standalone_mode=False)
    except click.exceptions.UsageError as e:
        where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        message = f"{' '.join(e.format_message().split())}{where}"
        say(message)
        obj = e.ctx.find_root().obj if e.ctx is not None else None
        if isinstance(obj, dict) and obj.get("json"):
            click.echo(json.dumps({"command": obj["json"], "error": {"kind": "usage", "message": message, "exit": 2}}))
        sys.exit(2)
    except click.ClickException as e:
        say(e.format_message())
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        say("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
