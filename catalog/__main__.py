"""`python -m catalog` (make generate): write every file derived from the declarations. `--check`: write nothing,
list the files that differ from what they must be, and exit 1 if any does."""
from __future__ import annotations

import sys

from catalog import REPO
from catalog.docs import MissingMarkers
from catalog.outputs import outputs


def stale() -> list[str]:
    """The derived files whose committed text is not what the declarations make."""
    return sorted(path for path, text in outputs().items()
                  if not (REPO / path).is_file() or (REPO / path).read_text() != text)


def main(argv: list[str]) -> int:
    try:
        return _run(argv)
    except MissingMarkers as missing:
        print(f"make generate: {missing}", file=sys.stderr)
        return 1


def _run(argv: list[str]) -> int:
    if "--check" in argv:
        differ = stale()
        for path in differ:
            print(f"{path} differs from its declaration: run make generate", file=sys.stderr)
        return 1 if differ else 0
    for path, text in outputs().items():
        target = REPO / path
        if not target.is_file() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
