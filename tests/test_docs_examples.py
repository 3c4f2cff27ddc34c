"""The documentation's complete examples run as written: the extending guide's whole suite is registered,
made into a real env and played to a reward of 1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _titled_block(page: Path, title: str) -> str:
    text = page.read_text(encoding="utf-8")
    match = re.search(rf'```python title="{re.escape(title)}"\n(.*?)```', text, flags=re.S)
    assert match, f"{page} has no python block titled {title}"
    lines = match.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


def test_extending_guide_suite_runs(tmp_path):
    script = tmp_path / "counter_suite.py"
    script.write_text(_titled_block(ROOT / "docs" / "guides" / "extending.md", "counter_suite.py"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
