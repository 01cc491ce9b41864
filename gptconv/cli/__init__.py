"""The ``gptconv`` command line: thin click commands over ``gptconv.api``."""

from .main import cli, main

__all__ = ["cli", "main"]
