"""Tool-call parser accuracy, measured: hermes vs qwen25_coder vs qwen3_xml on the golden corpus.

    python -m benchmarks.parser_accuracy        (or: python benchmarks/parser_accuracy.py)

For every output in tests/agents/parsers/golden_corpus.py (Qwen-style SQL-agent and GSM8K traffic in
every call variant, hard negatives, malformed calls) a parser is exact when its calls, content and
error count all equal the hand-written target. Prints, side by side per parser: the exact-match rate
per variant and overall, the share of intended calls recovered, calls invented (not in the target),
and mean parse time per output.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

# The corpus lives under tests/, which is not an installed package; run as a file, import it from here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.parsers import PARSERS  # noqa: E402
from tests.agents.parsers.golden_corpus import CORPUS, VARIANTS, GoldenCase  # noqa: E402

FORMATS = ("hermes", "qwen25_coder", "qwen3_xml")
TIMING_ROUNDS = 20


def is_exact(fmt: str, case: GoldenCase) -> bool:
    parsed = PARSERS[fmt](case.text)
    calls = tuple((call.name, call.arguments) for call in parsed.calls)
    return (calls, parsed.content, len(parsed.errors)) == (case.calls, case.content, case.errors)


def call_counts(fmt: str) -> tuple[int, int, int]:
    """(intended calls recovered, intended calls, calls not in the target)."""
    recovered = intended = invented = 0
    for case in CORPUS:
        got = [(call.name, call.arguments) for call in PARSERS[fmt](case.text).calls]
        intended += len(case.calls)
        recovered += sum(1 for call in case.calls if call in got)
        invented += sum(1 for call in got if call not in case.calls)
    return recovered, intended, invented


def mean_parse_us(fmt: str) -> float:
    start = time.perf_counter()
    for _ in range(TIMING_ROUNDS):
        for case in CORPUS:
            PARSERS[fmt](case.text)
    return (time.perf_counter() - start) / (TIMING_ROUNDS * len(CORPUS)) * 1e6


def main() -> None:
    logging.disable(logging.WARNING)  # malformed corpus entries would log on every round
    width = max(len(v) for v in VARIANTS) + 2
    print(f"golden corpus: {len(CORPUS)} outputs, {sum(len(c.calls) for c in CORPUS)} intended calls")
    print(f"{'variant':<{width}}{'n':>4}" + "".join(f"{fmt:>16}" for fmt in FORMATS))
    for variant in VARIANTS:
        cases = [case for case in CORPUS if case.variant == variant]
        rates = [sum(is_exact(fmt, case) for case in cases) / len(cases) for fmt in FORMATS]
        print(f"{variant:<{width}}{len(cases):>4}" + "".join(f"{rate:>16.0%}" for rate in rates))
    overall = [sum(is_exact(fmt, case) for case in CORPUS) for fmt in FORMATS]
    exact = [f"{n / len(CORPUS):.1%} ({n}/{len(CORPUS)})" for n in overall]
    print(f"{'EXACT MATCH (all)':<{width}}{len(CORPUS):>4}" + "".join(f"{cell:>16}" for cell in exact))
    counts = [call_counts(fmt) for fmt in FORMATS]
    print(f"{'calls recovered':<{width + 4}}" + "".join(f"{f'{r}/{n}':>16}" for r, n, _ in counts))
    print(f"{'calls invented':<{width + 4}}" + "".join(f"{inv:>16}" for _, _, inv in counts))
    print(f"{'mean parse (us)':<{width + 4}}" + "".join(f"{mean_parse_us(fmt):>16.1f}" for fmt in FORMATS))


if __name__ == "__main__":
    main()
