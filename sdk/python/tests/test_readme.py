"""Every example of the SDK's README, copied and run as a program against the live gateway."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_every_readme_example_runs_as_written(gateway, tmp_path):
    assert len(BLOCKS) >= 2
    for number, block in enumerate(BLOCKS):
        program = tmp_path / f"example_{number}.py"
        program.write_text(block)
        env = {
            **os.environ,
            "EAI_BASE_URL": gateway["base_url"],
            "EAI_API_KEY": gateway["keys"]["agent"],
            "PYTHONPATH": str(README.parent),
        }
        done = subprocess.run(
            [sys.executable, str(program)], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"example {number} failed:\n{done.stdout}\n{done.stderr}"
        assert "succeeded" in done.stdout
    first = subprocess.run(
        [sys.executable, str(tmp_path / "example_0.py")],
        env={**env},
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "policy_denied" in first and "tool_not_found" in first
