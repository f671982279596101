"""Run every benchmark, one after another, and end with one table: benchmark, ratio, goal, verdict (``make bench``).

    python -m benchmarks.run_all [--only NAME ...] [--skip NAME ...]

Each benchmark runs as ``python -m benchmarks.<name>`` with its own output shown as it goes. Its last line is
its result: the first ``N.NNx`` ratio there is the ratio column, and ``PASS`` / ``FAIL`` there is the verdict,
which the benchmark computes from its numbers (this script never decides one). A benchmark without a goal has
no verdict (``-``); one that exits non-zero without a verdict is ``ERROR``. The goal column comes from the
benchmark module's ``GOAL`` string. Exit status 1 when any verdict is FAIL or ERROR.

The same rows go to a machine-readable file (``--results``, default ``runs/bench/results.json``) with the machine,
the git commit and the date, so the docs' benchmarks page is rendered from a run instead of typed by hand.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RATIO = re.compile(r"(\d+(?:\.\d+)?)x\b")  # "0.52x", not the "5x" of "5xx 0"
VERDICT = re.compile(r"\b(PASS|FAIL)\b")


def benchmarks() -> list[str]:
    """The modules with a ``main``: plumbing beside them (an engine process, a locust user class) is not run."""
    return sorted(p.stem for p in HERE.glob("*.py")
                  if p.stem not in ("__init__", "run_all") and "\ndef main(" in p.read_text())


def goal_of(name: str) -> str:
    """The module's ``GOAL = "..."`` string, read without importing it (imports are heavy)."""
    path = HERE / f"{name}.py"
    if not path.is_file():
        return "-"
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "GOAL" for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
    return "-"


def summarize(name: str, lines: list[str], returncode: int, seconds: float) -> dict[str, str]:
    """One table row from a benchmark's output lines."""
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    ratio = RATIO.search(last)
    verdict = VERDICT.search(last)
    if verdict is None:
        verdict_text = "ERROR" if returncode != 0 else "-"
    else:
        verdict_text = verdict.group(1)
    ratio_text = f"{ratio.group(1)}x" if ratio and verdict_text != "ERROR" else "-"  # an error's last line is no result
    return {"benchmark": name, "ratio": ratio_text, "goal": goal_of(name),
            "verdict": verdict_text, "time": f"{seconds:.0f}s", "last line": last[:140]}


def run_one(name: str) -> dict[str, str]:
    print(f"== benchmarks/{name}.py", flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", f"benchmarks.{name}"], cwd=HERE.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    return summarize(name, lines, proc.wait(), time.perf_counter() - started)


def table(rows: list[dict[str, str]]) -> str:
    cols = ("benchmark", "ratio", "goal", "verdict", "time")
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    out = ["  ".join(c.ljust(widths[c]) for c in cols)]
    out += ["  ".join(r[c].ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(out)


def machine() -> dict[str, object]:
    """What the numbers were measured on: CPU model and count, memory, GPUs (nvidia-smi, when present), OS, Python."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or platform.machine())
    mem_kb = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal:")), 0)
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        gpus = []
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1),
            "gpus": [g.strip() for g in gpus if g.strip()], "os": platform.platform(),
            "python": platform.python_version()}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def git_commit() -> dict[str, object]:
    """The commit the benchmarks ran at, and whether the work tree had uncommitted changes."""
    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else ""
    return {"commit": git("rev-parse", "HEAD") or "unknown", "dirty": bool(git("status", "--porcelain"))}


def write_results(path: Path, rows: list[dict[str, str]], seconds: list[float], started: datetime.datetime,
                  selection: dict[str, object]) -> None:
    results = {
        "date": started.isoformat(timespec="seconds"),
        "machine": machine(),
        **git_commit(),
        "selection": selection,
        "benchmarks": [{"name": r["benchmark"], "ratio": r["ratio"], "goal": r["goal"], "verdict": r["verdict"],
                        "seconds": round(s, 1), "last_line": r["last line"]} for r, s in zip(rows, seconds)],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--skip", nargs="*", default=[])
    parser.add_argument("--results", type=Path, default=HERE.parent / "runs" / "bench" / "results.json",
                        help="where the machine-readable results go (the docs' benchmarks page reads them)")
    args = parser.parse_args(argv)
    names = [n for n in benchmarks() if (args.only is None or n in args.only) and n not in args.skip]
    started = datetime.datetime.now(datetime.timezone.utc)
    rows, seconds = [], []
    for name in names:
        began = time.perf_counter()
        rows.append(run_one(name))
        seconds.append(time.perf_counter() - began)
    print("\n" + table(rows))
    write_results(args.results, rows, seconds, started, {"only": args.only, "skip": args.skip})
    return 1 if any(r["verdict"] in ("FAIL", "ERROR") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
