"""The one error type a user sees: a failure they caused or can fix, reported as one line."""


class GptconvError(Exception):
    """Bad input or usage: a corrupt file, a missing key, a wrong shape, a bad flag.

    The CLI prints ``str(error)`` on one line and exits 2; ``--debug`` adds the traceback.
    Messages name the file (or key) first and then the problem.
    """


class NoTokenizer(GptconvError):
    """The checkpoint carries no tokenizer at all (not: one that cannot be read)."""


def first_line(e: BaseException) -> str:
    """An exception's message as one line (its first, at most 300 characters), or its type's name."""
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__


def where(path: object, problem: str) -> GptconvError:
    """An error about one file or folder: ``"<path>: <problem>"``."""
    return GptconvError(f"{path}: {problem}")
