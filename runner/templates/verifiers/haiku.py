"""Acceptance check for the haiku goal: the file exists and holds exactly three non-empty lines."""

import sys
from pathlib import Path

path = Path(sys.argv[1] if len(sys.argv) > 1 else "haiku.txt")
if not path.is_file():
    sys.exit(f"{path} does not exist")
lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
if len(lines) != 3:
    sys.exit(f"{path} has {len(lines)} non-empty lines; a haiku has exactly 3")
print(f"{path}: 3 lines")
