"""The fault table's harness (`benchmarks/faults.py`): the checkout's context, a case's
command run in a subprocess and summarised, and the damage the cases do (read-only copies, a
full disk, damaged checkpoints, edited configs)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = Path(
    os.environ.get(
        "RHHJAX_SHAKESPEARE", ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
    )
)
MEMORY_LIMIT = 8 * 10**9  # RLIMIT_AS of the memory cases (bytes)


class Context:
    """Paths and the environment every case shares."""

    def __init__(self, checkout: Path, tmp: Path):
        self.checkout = checkout.resolve()
        self.tmp = tmp
        self.python = sys.executable
        self.text = tmp / "shake.txt"
        self.text.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:30_000], encoding="utf-8")
        self.env = {
            **os.environ,
            "PYTHONPATH": str(self.checkout),
            "JAX_COMPILATION_CACHE_DIR": str(tmp / "jax_cache"),
            "PYTHONUNBUFFERED": "1",
        }
        self.base: Path | None = None
        self.install: Path | None = None

    def config(self, variant: str = "tiny") -> str:
        return f"--config={self.checkout / 'configs' / 'ptb.py'}:{variant}"

    def data(self, text: Path | str | None = None, holdout: bool = True) -> list[str]:
        """The flags of a text corpus: ``text`` (default the tiny one), with ``holdout`` 3,000
        characters each of valid and test."""
        flags = ["--config.data.format=text", f"--config.data.text_files={text or self.text}"]
        return flags + (["--config.data.hutter_holdout=3000"] if holdout else [])

    def train(
        self, *extra: str, workdir: Path | None = None, variant: str = "tiny",
        text: Path | str | None = None, holdout: bool = True,
    ) -> list[str]:  # fmt: skip
        """train.py on a text corpus (default the tiny one: 30,000 characters, 3,000 each
        valid and test)."""
        args = [self.python, str(self.checkout / "train.py"), self.config(variant)]
        args += [*self.data(text, holdout), *extra]
        return args + ([f"--workdir={workdir}"] if workdir else [])

    def tool(self, name: str, *args: str) -> list[str]:
        return [self.python, "-m", f"rhhjax.tools.{name}", *args]

    def workdir(self, name: str) -> Path:
        """A fresh copy of the trained tiny workdir (checkpoints 3 and 6, best 6)."""
        if self.base is None:
            self.base = self.tmp / "base"
            run(self.train(workdir=self.base), self)
        copy = self.fresh(name)
        shutil.copytree(self.base, copy)
        return copy

    def fresh(self, name: str) -> Path:
        """``tmp/name``, removed if it was there (a case's own workdir or folder)."""
        path = self.tmp / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    def installed(self) -> Path:
        """The checkout installed with ``pip install --no-deps --no-build-isolation --target``."""
        if self.install is None:
            self.install = self.tmp / "installed"
            subprocess.run(
                [self.python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                 "--target", str(self.install), str(self.checkout)],
                check=True, capture_output=True,
            )  # fmt: skip
        return self.install


def run(
    args: list[str],
    ctx: Context,
    cwd: Path | None = None,
    env: dict | None = None,
    memory_limit: int | None = None,
    stop_after: float | None = None,
    pick: str | None = None,
) -> dict:
    """Run one command; ``stop_after``: SIGTERM after that many seconds (a run that trains);
    ``pick``: the line that matters is the first printed line matching this regex."""
    limit = None
    if memory_limit:

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    start = time.time()
    proc = subprocess.Popen(
        args,
        cwd=cwd or ctx.tmp,
        env=env or ctx.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    try:
        out, err = proc.communicate(timeout=stop_after or 900)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
    result = summarize(proc.returncode, out, err, time.time() - start)
    if pick:
        picked = [line for line in (out + err).splitlines() if re.search(pick, line)]
        result["line"] = picked[0][:600] if picked else f"(no line matches {pick!r})"
    return result


def summarize(code: int, out: str, err: str, seconds: float) -> dict:
    """Exit status, stderr size, traceback lines and the line that matters."""
    err_lines = [line for line in err.splitlines() if line.strip()]
    out_lines = [line for line in out.splitlines() if line.strip()]
    traceback = 0
    for i, line in enumerate(err_lines):
        if line.startswith("Traceback (most recent call last)"):
            traceback = len(err_lines) - i
            break
    said = [line for line in err_lines if line.startswith(("error:", "warning:"))]
    raised = [line for line in err_lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b", line)]
    if said:
        line = " / ".join(said)
    elif traceback and raised:
        line = raised[-1]
    elif err_lines:
        line = err_lines[-1]
    else:
        line = out_lines[-1] if out_lines else ""
    return {
        "exit": code,
        "stderr_lines": len(err_lines),
        "traceback_lines": traceback,
        "line": line[:600],
        "stdout_tail": out_lines[-3:],
        "seconds": round(seconds, 1),
    }


@contextlib.contextmanager
def read_only_copy(source: Path, name: str, ctx: Context) -> Iterator[Path]:
    """``source`` seen through a read-only bind mount (root only)."""
    target = ctx.tmp / name
    target.mkdir(exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], check=True)
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@contextlib.contextmanager
def full_disk(name: str, ctx: Context, free: int = 0) -> Iterator[Path]:
    """A 1 MB tmpfs filled to the last byte, then ``free`` bytes freed (root only)."""
    target = ctx.tmp / name
    target.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target)], check=True)
    try:
        filler = target / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        os.truncate(filler, max(filler.stat().st_size - free, 0))
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def damage(workdir: Path, folder: str) -> Path:
    """Truncate the largest params file of ``workdir/folder`` to 10 bytes; returns it."""
    files = sorted((workdir / folder / "params").rglob("*"), key=lambda p: p.stat().st_size)
    victim = [p for p in files if p.is_file()][-1]
    os.truncate(victim, 10)
    return victim


def edit_config(workdir: Path, how: str) -> None:
    path = workdir / "config.json"
    if how == "edited":
        config = json.loads(path.read_text())
        config["model"]["hidden"] = 32
        path.write_text(json.dumps(config, indent=2))
    elif how == "garbled":
        path.write_text(path.read_text()[:200])
    else:
        path.unlink()
