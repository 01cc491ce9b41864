"""The README's Python examples run as written, against a loopback Hub serving the test checkpoints
under the names the README uses."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hub_server import FakeHub

README = Path(__file__).parents[1] / "README.md"
BLOCKS = re.findall(r"<!-- runs as a test: parity_tests/test_readme.py -->\n```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_marks_its_examples():
    assert len(BLOCKS) == 4


@pytest.mark.parametrize("n", range(len(BLOCKS)))
def test_readme_example_runs(ckpts, tmp_path, n):
    repo = tmp_path / "repo"
    shutil.copytree(ckpts["tiny"], repo)
    work = tmp_path / "work"
    work.mkdir()
    with FakeHub() as hub:
        hub.repos["openai-community/gpt2"] = repo
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"),
               "PYTHONPATH": str(README.parent / "examples")}  # the README's custom module is examples/nanogpt.py
        env.pop("HF_TOKEN", None)
        env.pop("HF_HUB_OFFLINE", None)
        r = subprocess.run([sys.executable, "-c", BLOCKS[n]], cwd=work, env=env, capture_output=True, text=True,
                           timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
