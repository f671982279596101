"""Tables of where a test session's time went, from the file ``TANDEM_TEST_PROFILE`` named (tests/profile_plugin.py).

    TANDEM_TEST_PROFILE=/tmp/prof.jsonl make test    # two xdist workers: /tmp/prof.jsonl.gw0 and .gw1
    python scripts/test_profile.py /tmp/prof.jsonl* [--top 20] [--before /tmp/old.jsonl*]

Per test file: tests, setup / body / teardown wall seconds, their total, and the machine's busy CPU seconds over the
same time (2 cores: up to twice the wall). Then the slowest fixture set-ups. With ``--before`` each file's total
from an earlier profile stands beside it.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

PHASES = ("setup", "call", "teardown")


def by_file(paths: list[Path]) -> tuple[dict[str, dict[str, float]], list[dict], float]:
    """Per-file sums, fixture records, and the longest session (workers run side by side) of one or more files."""
    files: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    fixtures, session = [], 0.0
    lines = [line for path in paths for line in path.read_text().splitlines()]
    for line in lines:
        record = json.loads(line)
        if record["kind"] == "phase":
            row = files[record["nodeid"].split("::")[0]]
            row[record["when"]] += record["wall_s"]
            row["cpu"] += record["cpu_s"]
            row["tests"] += record["when"] == "call"
        elif record["kind"] == "fixture":
            fixtures.append(record)
        else:
            session = max(session, record["wall_s"])
    return files, fixtures, session


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, nargs="+", help="one file, or one per xdist worker")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--before", type=Path, nargs="+", help="an earlier profile, for a before/after column")
    args = parser.parse_args(argv)
    files, fixtures, session = by_file(args.profile)
    before = by_file(args.before)[0] if args.before else {}
    total = {key: sum(row[key] for row in files.values()) for key in (*PHASES, "cpu")}
    wall = sum(total[p] for p in PHASES)
    print(f"session {session:.0f} s; in tests {wall:.0f} s (setup {total['setup']:.0f}, body {total['call']:.0f}, "
          f"teardown {total['teardown']:.0f}); machine busy {total['cpu']:.0f} CPU-s = {total['cpu'] / max(wall, 1):.2f}"
          " cores on average" + (" (workers side by side each count the whole machine)" if len(args.profile) > 1 else ""))
    head = f"{'file':58} {'tests':>5} {'setup':>7} {'body':>7} {'tear':>6} {'total':>7} {'CPU-s':>7}"
    print(head + (f" {'before':>7}" if before else ""))
    ranked = sorted(files.items(), key=lambda kv: -sum(kv[1][p] for p in PHASES))
    for name, row in ranked[:args.top]:
        line = (f"{name:58} {int(row['tests']):5d} {row['setup']:7.1f} {row['call']:7.1f} {row['teardown']:6.1f} "
                f"{sum(row[p] for p in PHASES):7.1f} {row['cpu']:7.1f}")
        if before:
            line += f" {sum(before[name][p] for p in PHASES) if name in before else 0:7.1f}"
        print(line)
    print(f"\nslowest fixture set-ups (of {len(fixtures)})")
    for record in sorted(fixtures, key=lambda r: -r["wall_s"])[:args.top]:
        print(f"{record['wall_s']:7.1f} s  {record['name']:28} {record['scope']:8} first for {record['nodeid']}")


if __name__ == "__main__":
    main()
