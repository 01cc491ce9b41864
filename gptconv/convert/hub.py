"""Fetching checkpoints from the Hugging Face Hub with huggingface-hub.

Files land in the standard HF cache (``HF_HOME``, ``HF_HUB_CACHE``); ``HF_TOKEN``,
``HF_HUB_OFFLINE`` and ``HF_ENDPOINT`` are honoured by huggingface-hub itself. Only what a
load needs is fetched: config, tokenizer files, and one weight format (safetensors if the repo
has it, else PyTorch .bin).

Weight files resume across runs: huggingface-hub (2.x) resumes within one download but drops
its partial file when the download fails, so a pull killed at 15 of 16 GB would start again. We
download each plain-HTTP weight file ourselves, with huggingface-hub's own ``http_get`` (Range
requests, retries, Hub errors), into ``blobs/<etag>.gptconv-partial`` in the standard cache,
check its size and sha256, and move it to ``blobs/<etag>``, where ``snapshot_download`` finds
it and only links it. Xet-stored files are left to huggingface-hub and hf_xet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
from huggingface_hub import (HfApi, constants, get_hf_file_metadata, hf_hub_url, snapshot_download,
                             try_to_load_from_cache)
from huggingface_hub.file_download import http_get, repo_folder_name
from huggingface_hub.utils import WeakFileLock, build_hf_headers
from huggingface_hub.utils._runtime import is_xet_available
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from ..errors import GptconvError
from .export import sha256_file

# Short names a user types → the Hub repo that holds the weights.
ALIASES: dict[str, str] = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "tinyllama-1.1b": "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
}

SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
              "chat_template.jinja", "chat_template.json")
_REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")
_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")


def repo_id_for(source: str) -> str | None:
    """The Hub repo id ``source`` names (an alias or ``owner/name``), or None."""
    if source in ALIASES:
        return ALIASES[source]
    return source if _REPO_ID.fullmatch(source) else None


def files_to_fetch(repo_files: list[str]) -> list[str]:
    """From a repo's file list, the top-level files a load needs, one weight format only."""
    top = set(f for f in repo_files if "/" not in f)
    for index, single, ext in (("model.safetensors.index.json", "model.safetensors", "safetensors"),
                               ("pytorch_model.bin.index.json", "pytorch_model.bin", "bin")):
        if index in top:
            weights = [index] + sorted(f for f in top if _SHARD.fullmatch(f) and f.endswith(ext))
            break
        if single in top:
            weights = [single]
            break
    else:
        raise GptconvError("the repo has no model.safetensors or pytorch_model.bin at its top level")
    return [f for f in SIDE_FILES if f in top] + weights


def fetch(repo_id: str, revision: str | None = None, prefer_cache: bool = False) -> Path:
    """Download (or find in the cache) what a load of ``repo_id`` needs; return the snapshot folder.

    ``prefer_cache``: use a cached snapshot without asking the Hub (what ``load`` does, so a
    pulled model loads offline); ``pull`` asks the Hub so the snapshot is refreshed.
    """
    label = repo_id + (f"@{revision}" if revision else "")
    if prefer_cache or constants.HF_HUB_OFFLINE:
        # The snapshot a pull left: its config.json's folder (the weights are checked on open).
        cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
        if isinstance(cached, str):
            return Path(cached).parent
        if constants.HF_HUB_OFFLINE:
            raise GptconvError(f"{label}: HF_HUB_OFFLINE is set and the model is not in the cache "
                               f"({constants.HF_HUB_CACHE}); run `gptconv pull {repo_id}` online first")
    try:
        info = HfApi().model_info(repo_id, revision=revision)
        names = files_to_fetch([s.rfilename for s in info.siblings or []])
        for name in names:
            if _SHARD.fullmatch(name) or name in ("model.safetensors", "pytorch_model.bin"):
                fetch_blob_resumable(repo_id, name, info.sha or revision)
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=names)  # records refs/<revision>
        return Path(folder)
    except GptconvError as e:
        raise GptconvError(f"{label}: {e}") from None
    except GatedRepoError:
        raise GptconvError(f"{label}: the repo is gated: request access on its Hub page, then set HF_TOKEN "
                           "or run `hf auth login`") from None
    except RevisionNotFoundError:
        raise GptconvError(f"{label}: the repo has no revision '{revision}'") from None
    except RepositoryNotFoundError:
        raise GptconvError(f"{label}: no such model on the Hub (if it is private, set HF_TOKEN)") from None
    except HfHubHTTPError as e:
        raise GptconvError(f"{label}: the Hub answered {_status(e)}") from None
    except (OfflineModeIsEnabled, LocalEntryNotFoundError, httpx2.HTTPError, OSError) as e:
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
        if isinstance(cached, str):  # as huggingface-hub itself falls back to the cache
            logging.getLogger("gptconv").warning(
                f"gptconv: {label}: the Hub at {constants.ENDPOINT} cannot be reached ({reason}); "
                f"using the snapshot in the cache, {Path(cached).parent}")
            return Path(cached).parent
        raise GptconvError(f"{label}: cannot reach the Hub at {constants.ENDPOINT} and the model is not in "
                           f"the cache ({reason})") from None


def fetch_blob_resumable(repo_id: str, filename: str, revision: str | None) -> None:
    """Put ``filename``'s blob in the HF cache, resuming from the bytes an earlier, failed pull left."""
    meta = get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision))
    if meta.etag is None or meta.size is None or (meta.xet_file_data is not None and is_xet_available()
                                                  and not constants.HF_HUB_DISABLE_XET):
        return  # no content id to key a partial file by, or a Xet file: huggingface-hub downloads it
    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    blob = storage / "blobs" / meta.etag
    if blob.exists():
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    partial = blob.with_name(blob.name + ".gptconv-partial")
    lock = Path(constants.HF_HUB_CACHE) / ".locks" / storage.name / f"{meta.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):  # the lock huggingface-hub takes for this blob: one writer at a time
        if blob.exists():
            return
        with open(partial, "ab") as f:
            have = f.tell()
            if have > meta.size:  # not a prefix of this file: start again
                f.truncate(0)
                have = 0
            try:
                with _quiet(http_get):  # its retry warnings would precede our one-line error
                    http_get(meta.location, f, resume_size=have, headers=build_hf_headers(),
                             expected_size=meta.size, displayed_filename=filename)
            except (httpx2.HTTPError, OSError) as e:
                f.flush()
                raise GptconvError(f"{filename}: the download was cut off at {f.tell():,} of {meta.size:,} bytes "
                                   f"({type(e).__name__}); pull again to resume from there") from None
        if re.fullmatch(r"[0-9a-f]{64}", meta.etag) and sha256_file(partial) != meta.etag:  # LFS: etag = sha256
            partial.unlink()
            raise GptconvError(f"{filename}: the downloaded bytes do not match the Hub's sha256 "
                               f"{meta.etag}; the partial file was removed, pull again")
        os.replace(partial, blob)


@contextlib.contextmanager
def _quiet(function) -> Iterator[None]:
    """Raise the level of the logger of ``function``'s module to ERROR for a while."""
    logger = logging.getLogger(function.__module__)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _status(e: HfHubHTTPError) -> str:
    response = getattr(e, "response", None)
    code = getattr(response, "status_code", None)
    return f"HTTP {code}" if code else str(e).splitlines()[0]
