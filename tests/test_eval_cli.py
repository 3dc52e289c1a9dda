"""The evaluation's command line (benchmarks/eval/run.py) refuses what it cannot use before running any task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent.parent / "benchmarks" / "eval" / "run.py"


@pytest.mark.parametrize("setting", ["fresh_context", "=true", "two words=1"])
def test_a_verify_setting_without_field_and_value_is_refused(setting):
    args = [sys.executable, str(RUN), "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--verify", setting]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"--verify {setting!r}: expected FIELD=VALUE, e.g. fresh_context=true" in result.stderr
    assert "Traceback" not in result.stderr
