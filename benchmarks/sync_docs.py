"""Keep the figures in README.md and docs/ equal to the committed outputs of the scripts that measure them.

A doc quotes a committed output between two markers:

    <!-- include: benchmarks/out/regret.txt -->
    ...the file's text, verbatim, in a fenced block...
    <!-- end include -->

`python benchmarks/sync_docs.py` rewrites every such block from its file (run it after re-running a
benchmark); `python benchmarks/sync_docs.py --check` exits 1 naming each stale block.
`tests/test_docs_figures.py` runs the check, so a figure in the docs cannot drift from its output.
Optional `lines=A-B` after the path quotes a line range (1-based, inclusive).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(
    r"(<!-- include: (?P<path>\S+)(?: lines=(?P<a>\d+)-(?P<b>\d+))? -->\n)"
    r"(?P<body>.*?)(<!-- end include -->)",
    re.S,
)


def quoted(path: str, a: str | None, b: str | None) -> str:
    text = (ROOT / path).read_text()
    if a is not None and b is not None:
        text = "".join(text.splitlines(keepends=True)[int(a) - 1 : int(b)])
    return "```text\n" + text.rstrip("\n") + "\n```\n"


def sync(doc: Path, check: bool) -> list[str]:
    text = doc.read_text()
    stale: list[str] = []

    def fill(m: re.Match[str]) -> str:
        want = quoted(m["path"], m["a"], m["b"])
        if m["body"] != want:
            stale.append(f"{doc.relative_to(ROOT)}: block of {m['path']} differs from the file")
        return m.group(1) + want + m.group(6)

    new = BLOCK.sub(fill, text)
    if not check and new != text:
        doc.write_text(new)
    return stale


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale blocks, change nothing")
    args = parser.parse_args()
    stale = [s for d in docs() for s in sync(d, args.check)]
    for s in stale:
        print(s)
    if args.check:
        return 1 if stale else 0
    print(f"synced {len(stale)} block(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
