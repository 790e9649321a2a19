"""`benchmarks/prose.py`: the counting of comment and docstring lines on synthetic sources,
the limits on a synthetic tree, and the limits on this repository's kernels, ops and package."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from benchmark_scripts import load

prose = load("prose")
ROOT = Path(__file__).resolve().parents[1]


def synthetic(rng: random.Random) -> tuple[str, int, int, int]:
    """A module of random code, comment, docstring and blank lines: (source, non-blank
    lines, prose lines, module docstring lines)."""
    doc = rng.randint(0, 5)
    lines = ['"""Module.'] + ["text"] * max(doc - 2, 0) + ['"""'] if doc > 1 else []
    if doc == 1:
        lines = ['"""Module."""']
    lines.append("import os")
    code, prose_lines = len(lines) - doc, doc
    for _ in range(rng.randint(0, 6)):
        lines.append("")
        lines.append("def f():")
        code += 1
        fdoc = rng.randint(0, 3)
        if fdoc == 1:
            lines.append('    """One line."""')
        elif fdoc > 1:
            lines += ['    """Several.'] + ["    more"] * (fdoc - 2) + ['    """']
        prose_lines += fdoc
        for _ in range(rng.randint(1, 5)):
            kind = rng.choice(["code", "comment", "trailing", "blank", "directive"])
            if kind == "code":
                lines.append("    x = 1")
                code += 1
            elif kind == "comment":
                lines.append("    # why")
                prose_lines += 1
            elif kind == "trailing":
                lines.append("    y = 2  # what")
                prose_lines += 1
            elif kind == "directive":
                lines.append("    z = 3  # noqa: E731")
                code += 1
            else:
                lines.append("")
        lines.append("    return None")
        code += 1
    return "\n".join(lines) + "\n", code + prose_lines, prose_lines, doc


@pytest.mark.parametrize("seed", range(40))
def test_known_prose_lines_give_the_known_share(seed):
    source, lines, prose_lines, doc = synthetic(random.Random(seed))
    count = prose.count(source)
    assert (count.lines, count.prose, count.module_doc) == (lines, prose_lines, doc)
    assert count.share == pytest.approx(prose_lines / lines)


def test_a_string_that_is_not_a_docstring_is_code():
    source = 'x = """not\na docstring"""\n\n\ndef f():\n    return "# not a comment"\n'
    assert prose.count(source) == prose.Count(lines=4, prose=0, module_doc=0)


def test_the_check_names_a_folder_over_its_share_and_a_long_module_docstring(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("# a\n# b\nx = 1\n")
    (tmp_path / "rhhjax").mkdir()
    long_doc = '"""Doc.\n' + "line\n" * 12 + '"""\n' + "x = 1\n" * 200
    (tmp_path / "rhhjax" / "m.py").write_text(long_doc)
    found = prose.offenders(tmp_path, folders=(("kernels", 0.15),))
    assert found[0].startswith("kernels: 66.7% prose lines")
    assert found[1] == "rhhjax/m.py: module docstring 14 lines > 12"
    assert len(found) == 2


def test_the_excluded_paths_are_not_counted(tmp_path):
    for name in prose.EXCLUDED:
        path = tmp_path / name
        path = path if path.suffix == ".py" else path / "x.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# only prose\n")
    assert prose.files("package", tmp_path) == []


@pytest.mark.parametrize("folder", [folder for folder, _ in prose.SHARE_LIMITS])
def test_the_kernels_the_ops_and_the_package_are_within_their_share(folder):
    limit = dict(prose.SHARE_LIMITS)[folder]
    count = prose.total(prose.files(folder))
    assert count.share <= limit, f"{folder}: {count.share:.1%} prose lines > {limit:.0%}"


# The modules whose docstrings have been cut to the limit: the kernels, the op layer, the
# models, the analysis and the rest of the library but the corpora and the config files.
OWNED = [
    *prose.files("kernels"),
    *prose.files("rhhjax/ops"),
    *(p for p in prose.files("rhhjax/models") if p.name != "config.py"),
    *(p for p in prose.files("rhhjax/analysis") if p.name != "subjects.py"),
    *(
        ROOT / "rhhjax" / name
        for name in ("evaluation.py", "sampling.py", "outputs.py", "parallel.py", "errors.py")
    ),
    ROOT / "rhhjax" / "config_fields.py",
    # the training, the tools, the data but its corpora, the CLI and the configs' package
    *prose.files("rhhjax/train"),
    *prose.files("rhhjax/tools"),
    *(p for p in prose.files("rhhjax/data") if p.name not in ("ptb.py", "text.py")),
    *(ROOT / "rhhjax" / name for name in ("cli.py", "memory.py", "config_files.py", "__init__.py")),
    ROOT / "configs" / "__init__.py",
    ROOT / "configs" / "hutter.py",
]


@pytest.mark.parametrize("path", OWNED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_module_docstrings_are_short(path):
    lines = prose.count(path.read_text()).module_doc
    assert lines <= prose.DOCSTRING_LIMIT, f"{path.relative_to(ROOT)}: {lines} lines"
