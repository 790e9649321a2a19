"""Which kernel source last passed its compiled tests on a GPU: a hash of `kernels/` and the
ops that call them (`rhhjax/ops/`), recorded in results/ beside the device, the date and the
autotune's winner, so that a GPU run whose kernels are unchanged skips the checks.

    python benchmarks/kernel_source.py hash                     # this tree's hash
    python benchmarks/kernel_source.py check results/gpu_tested.json   # exit 0: unchanged
    python benchmarks/kernel_source.py record results/gpu_tested.json --tests_log=tests.log \\
        --device="NVIDIA H200" --autotune=autotune.json          # after the compiled tests

``check`` prints one line: unchanged since the GPU run of DATE (DEVICE), or what changed
(exit 1; exit 2 for a missing or unreadable record). ``record`` writes only when the log
shows every test passed (pytest's closing line: passed, no failed or error)."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import sys
from pathlib import Path

from rhhjax.train.checksums import sha256

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kernels", "rhhjax/ops")  # the kernels and every op that calls them


def source_files(root: Path = ROOT) -> list[Path]:
    """The Python files the hash covers, sorted by their path from ``root``."""
    files = [p for folder in SOURCES for p in (root / folder).rglob("*.py")]
    return sorted((p for p in files if "__pycache__" not in p.parts), key=lambda p: p.as_posix())


def source_hash(root: Path = ROOT) -> dict[str, str]:
    """{"sha256": the whole source's hash, "files": {path: its own hash}}."""
    files = {p.relative_to(root).as_posix(): sha256(p) for p in source_files(root)}
    listing = "".join(f"{path}\0{digest}\n" for path, digest in files.items())
    return {"sha256": hashlib.sha256(listing.encode()).hexdigest(), "files": files}


def changed_files(record: dict, now: dict) -> list[str]:
    """The paths added, removed or changed since ``record``."""
    before, after = record.get("files", {}), now["files"]
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def check(record_path: Path, root: Path = ROOT) -> tuple[int, str]:
    """(exit code, one line): 0 when ``root``'s kernel source is the record's."""
    try:
        record = json.loads(record_path.read_text())
        recorded = record["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return 2, f"no GPU-tested kernel record in {record_path}: {error}"
    now = source_hash(root)
    when = f"the GPU run of {record.get('date', '?')} ({record.get('device', '?')})"
    if now["sha256"] == recorded:
        return 0, f"kernels unchanged since {when}: its checks stand"
    changed = changed_files(record, now)
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return 1, f"kernels changed since {when}: {shown or 'the file list'}"


CLOSING = re.compile(r"^=*\s*(.*\b(?:passed|failed|error|errors)\b.*?)\s*=*$")


def tests_passed(log: str) -> bool:
    """True when pytest's last closing line of ``log`` counts passes and no failure or error."""
    closing = [m.group(1) for line in log.splitlines() if (m := CLOSING.match(line.strip()))]
    if not closing:
        return False
    last = closing[-1]
    return " passed" in f" {last}" and not re.search(r"\b(failed|error|errors)\b", last)


def record(
    out: Path, tests_log: str, device: str, autotune: dict | None, root: Path = ROOT
) -> dict:
    """The record of ``root``'s kernel source as passing on ``device``, written to ``out``.
    ValueError (one line) when ``tests_log`` does not show every test passed."""
    if not tests_passed(tests_log):
        raise ValueError("the compiled tests did not all pass: nothing recorded")
    entry = {
        **source_hash(root),
        "date": datetime.date.today().isoformat(),
        "device": device,
        "autotune_winners": (autotune or {}).get("winners", {}),
    }
    out.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return entry


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("hash", help="print this tree's kernel source hash")
    check_parser = sub.add_parser("check", help="exit 0 when the record's source is this one")
    check_parser.add_argument("record", type=Path)
    record_parser = sub.add_parser("record", help="record this source as passing on a GPU")
    record_parser.add_argument("record", type=Path)
    record_parser.add_argument("--tests_log", type=Path, required=True)
    record_parser.add_argument("--device", required=True)
    record_parser.add_argument("--autotune", type=Path, help="autotune_persistent.py's JSON")
    args = parser.parse_args(argv)
    if args.command == "hash":
        print(source_hash()["sha256"])
        return 0
    if args.command == "check":
        code, line = check(args.record)
        print(line)
        return code
    try:
        autotune = json.loads(args.autotune.read_text()) if args.autotune else None
        entry = record(args.record, args.tests_log.read_text(), args.device, autotune)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"recorded {entry['sha256'][:12]} as passing on {args.device} in {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
