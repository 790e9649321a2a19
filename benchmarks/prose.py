"""How much of the code is prose: per folder, the share of comment and docstring lines among
the non-blank lines of its .py files, and the longest module docstring.

    python benchmarks/prose.py            # the table
    python benchmarks/prose.py --check    # exit 1 naming what is over the limits

Docstrings (module, class, function) are found with ``ast``, comments with ``tokenize``; a
line holding both code and a comment counts as prose; tool directives (``# noqa``) do not.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The installed package: rhhjax/ with kernels/ and configs/ (rhhjax.kernels, rhhjax.configs).
PACKAGE = ("rhhjax", "kernels", "configs")
# In the package but not yet counted: its prose would put rhhjax/ops over its share.
EXCLUDED = ()
# (folder, largest share of prose lines).
SHARE_LIMITS = (("kernels", 0.15), ("rhhjax/ops", 0.15), ("package", 0.12))
DOCSTRING_LIMIT = 12  # lines of a module docstring
# Comments for tools, not readers: not counted as prose.
DIRECTIVES = ("# fmt:", "# noqa", "# type:", "# pragma", "# pyright:")


@dataclass(frozen=True)
class Count:
    lines: int  # non-blank
    prose: int  # comment or docstring
    module_doc: int  # lines of the module docstring

    @property
    def share(self) -> float:
        return self.prose / self.lines if self.lines else 0.0


def _docstring_node(node: ast.AST) -> ast.Constant | None:
    body = getattr(node, "body", None)
    if not body or not isinstance(body[0], ast.Expr):
        return None
    value = body[0].value
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value
    return None


def count(source: str) -> Count:
    """Non-blank, prose and module-docstring line counts of one module's source."""
    lines = source.splitlines()
    nonblank = {i for i, line in enumerate(lines, 1) if line.strip()}
    prose: set[int] = set()
    tree = ast.parse(source)
    module_doc = 0
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = _docstring_node(node)
        if doc is None:
            continue
        span = range(doc.lineno, doc.end_lineno + 1)
        prose.update(span)
        if isinstance(node, ast.Module):
            module_doc = len(span)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and not token.string.startswith(DIRECTIVES):
            prose.add(token.start[0])
    return Count(len(nonblank), len(prose & nonblank), module_doc)


def files(folder: str, root: Path = ROOT) -> list[Path]:
    """The .py files under ``folder`` ("package": the installed package), less EXCLUDED."""
    folders = PACKAGE if folder == "package" else (folder,)
    found = []
    for name in folders:
        for path in sorted((root / name).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if "__pycache__" in path.parts or any(
                rel == e or rel.startswith(e + "/") for e in EXCLUDED
            ):
                continue
            found.append(path)
    return found


def total(paths: list[Path]) -> Count:
    counts = [count(p.read_text()) for p in paths]
    return Count(
        sum(c.lines for c in counts),
        sum(c.prose for c in counts),
        max((c.module_doc for c in counts), default=0),
    )


def offenders(root: Path = ROOT, folders=SHARE_LIMITS, limit: int = DOCSTRING_LIMIT):
    """What is over the limits: folders over their share, modules over the docstring limit."""
    found = []
    for folder, most in folders:
        c = total(files(folder, root))
        if c.share > most:
            found.append(f"{folder}: {c.share:.1%} prose lines > {most:.0%}")
    for path in files("package", root):
        n = count(path.read_text()).module_doc
        if n > limit:
            found.append(f"{path.relative_to(root)}: module docstring {n} lines > {limit}")
    return found


def table(root: Path = ROOT) -> str:
    rows = ["folder            files  lines  prose  share  longest module docstring"]
    for folder in ("kernels", "rhhjax/ops", "rhhjax/models", "rhhjax/analysis", "package"):
        paths = files(folder, root)
        c = total(paths)
        rows.append(
            f"{folder:<17} {len(paths):>5} {c.lines:>6} {c.prose:>6} {c.share:>6.1%}"
            f"  {c.module_doc:>3}"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if over the limits")
    args = parser.parse_args(argv)
    print(table())
    if args.check:
        bad = offenders()
        for line in bad:
            print("over:", line)
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
