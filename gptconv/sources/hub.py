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

What the Hub answers becomes paths in the cache: the commit names the snapshot folder, each file's
ETag its blob. A hostile or intercepted endpoint answering an ETag ``"../../x"`` would choose where
the bytes land (huggingface-hub builds its blob paths from the ETag as it comes), so every commit and
ETag is checked to be a content hash (git's 40 hex digits, or LFS's sha256) for every file, before
anything is written, and again as huggingface-hub uses them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
from huggingface_hub import (HfApi, constants, file_download, get_hf_file_metadata, get_token, hf_hub_url,
                             snapshot_download, try_to_load_from_cache)
from huggingface_hub._revision import ResolvedRevision
from huggingface_hub.file_download import http_get, repo_folder_name
from huggingface_hub.utils import WeakFileLock, build_hf_headers
from huggingface_hub.utils._runtime import is_xet_available
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from ..errors import GptconvError
from ..output import sha256_file



def aliases() -> dict[str, str]:
    """Short names a user types (the presets, ``gptconv/families/``) → the Hub repo that holds the weights."""
    from ..families import PRESETS
    return {name: preset.repo for name, preset in PRESETS.items()}


SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
              "chat_template.jinja", "chat_template.json")
_REPO_ID = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")  # as the Hub allows
_CONTENT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git object id, or an LFS file's sha256
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")


def repo_id_for(source: str) -> str | None:
    """The Hub repo id ``source`` names (an alias or ``owner/name``), or None."""
    known = aliases()
    if source in known:
        return known[source]
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
    if revision is not None and (not revision or revision.startswith("/")
                                 or any(part in ("", ".", "..") for part in revision.split("/"))):
        raise GptconvError(f"{label}: '{revision}' is not a revision name")
    try:
        with _progress_only_on_a_terminal():
            return _fetch(repo_id, revision)
    except GptconvError as e:
        raise GptconvError(f"{label}: {e}") from None
    except GatedRepoError:
        if get_token() is not None:  # a token was sent and the Hub still refused: its account has no access
            raise GptconvError(f"{label}: the repo is gated and the token in use ({_token_origin()}) has no "
                               "access to it: request access on its Hub page with that account") from None
        raise GptconvError(f"{label}: the repo is gated: request access on its Hub page, then set HF_TOKEN "
                           "or run `hf auth login`") from None
    except RevisionNotFoundError:
        raise GptconvError(f"{label}: the repo has no revision '{revision}'") from None
    except HFValidationError as e:
        raise GptconvError(f"{label}: not a Hub repo id ({str(e).splitlines()[0]})") from None
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


def _fetch(repo_id: str, revision: str | None) -> Path:
    info = HfApi().model_info(repo_id, revision=revision)
    commit = checked_id(info.sha, "commit", "the repo", _COMMIT)
    names = files_to_fetch([s.rfilename for s in info.siblings or []])
    metas = {name: get_hf_file_metadata(hf_hub_url(repo_id, name, revision=commit)) for name in names}
    for name, meta in metas.items():  # all of them, before any byte is written
        checked_id(meta.etag, "ETag", name)
        checked_id(meta.commit_hash, "commit", name, _COMMIT)
    for name in names:
        if _SHARD.fullmatch(name) or name in ("model.safetensors", "pytorch_model.bin"):
            fetch_blob_resumable(repo_id, name, metas[name])
    with _checked_answers():  # snapshot_download asks again per file: its answers are checked too
        folder = snapshot_download(repo_id, revision=ResolvedRevision(commit, revision, repo_id),
                                   allow_patterns=names)
    _record_ref(repo_id, revision or constants.DEFAULT_REVISION, commit)
    return Path(folder)


def checked_id(value: object, what: str, name: str, form: re.Pattern = _CONTENT_ID) -> str:
    """``value`` if it is a content hash the cache may name a path by; a GptconvError otherwise."""
    if not isinstance(value, str) or not form.fullmatch(value):
        raise GptconvError(f"{name}: the Hub at {constants.ENDPOINT} answered the {what} {str(value)[:80]!r}, "
                           "which is not a content hash; refusing to write anything by that name")
    return value


@contextlib.contextmanager
def _checked_answers() -> Iterator[None]:
    """huggingface-hub's per-file metadata (from a HEAD or its cached tree listing), checked as it
    comes, so an endpoint that changes its answer between our check and its download is caught too."""
    original = getattr(file_download, "_get_metadata_or_catch_error", None)
    if original is None:  # another huggingface-hub layout: the check before the download still stands
        yield
        return

    def checked(*args, **kwargs):
        answer = original(*args, **kwargs)
        name = kwargs.get("filename", "a file")
        if answer[1] is not None:
            checked_id(answer[1], "ETag", name)
        if answer[2] is not None:
            checked_id(answer[2], "commit", name, _COMMIT)
        return answer

    file_download._get_metadata_or_catch_error = checked
    try:
        yield
    finally:
        file_download._get_metadata_or_catch_error = original


def _record_ref(repo_id: str, revision: str, commit: str) -> None:
    """refs/<revision> → commit, as huggingface-hub records it (a later offline load reads it)."""
    if revision == commit:
        return
    refs = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model") / "refs"
    ref = refs / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if ref.is_file() and ref.read_text() == commit:
        return
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(commit)
    os.replace(tmp, ref)


def fetch_blob_resumable(repo_id: str, filename: str, meta) -> None:
    """Put ``filename``'s blob in the HF cache, resuming from the bytes an earlier, failed pull left.
    ``meta``: its checked metadata."""
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
def _progress_only_on_a_terminal() -> Iterator[None]:
    """huggingface-hub's progress bars on a terminal only: in a pipe or a log they are lines of noise
    before the one-line result (or error)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    if sys.stderr.isatty() or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()

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


def _token_origin() -> str:
    return "HF_TOKEN" if os.environ.get("HF_TOKEN") else f"the one `hf auth login` saved in {constants.HF_TOKEN_PATH}"


def _status(e: HfHubHTTPError) -> str:
    response = getattr(e, "response", None)
    code = getattr(response, "status_code", None)
    return f"HTTP {code}" if code else str(e).splitlines()[0]
