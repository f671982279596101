"""The README and the guides as a tested contract: run their command blocks in a fresh clone, as a reader meets them.

    python scripts/readme_check.py [--keep DIR] [--only N|FILE:N ...] [--file FILE ...] [--list]   (make readme-check)

The documents are README.md, then the docs site's "Getting started" page and every page under "Guides" in the
order of mkdocs.yml's nav. Every ```bash and ```python block of each runs, exactly as written, unless the line
before it says ``<!-- readme-check: skip: <why> -->``. A bash block runs with ``bash -e`` (its first failing
command fails it), a python block with the venv's python; each in the clone's root, one after another, with the
environment a reader's shell would have by then (``export`` lines and ``source .venv/bin/activate`` carry over
to later blocks of the same document, as in one terminal; each document starts from a fresh shell).
``<!-- readme-check: expect "text" ... -->`` lists output each block must print; ``timeout=S`` caps it (default
900 s). A block fails on a non-zero exit, a timeout or missing output. ``--only 23`` names README line 23,
``--only docs/guides/gpu.md:12`` a guide's block; ``--list`` prints, per document, the blocks that run and the
blocks skipped with their reasons, without running anything.

The clone is fresh (``git clone`` of HEAD) except for what ``make demo`` leaves, which the quick start's block
makes and the check does not redo: ``.venv``, ``.cache`` and ``runs/demo-cpu`` are linked from this checkout
(run ``make demo`` here first). At the end ``ray stop`` runs whatever happened, so no cluster outlives the check.
Prints one line per block (its document and line, exit code, seconds), each skipped block with its reason, and per
document the blocks run, passed and skipped, then a verdict.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"<!--\s*readme-check:(.*?)-->")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
LINKED = (".venv", ".cache", "runs/demo-cpu")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str = ""
    expect: list[str] = field(default_factory=list)
    timeout_s: float = 900.0
    file: str = "README.md"  # the document, relative to the repository root

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def documents(root: Path = ROOT) -> list[str]:
    """README.md, then "Getting started" and the pages under "Guides" in mkdocs.yml's nav order."""
    import yaml

    config = yaml.safe_load((root / "mkdocs.yml").read_text())
    docs_dir = config.get("docs_dir", "docs")
    pages: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, str):
            pages.append(f"{docs_dir}/{node}")
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    for entry in config.get("nav", []):
        for title, value in entry.items():
            if title in ("Getting started", "Guides"):
                walk(value)
    return ["README.md", *pages]


def parse_blocks(text: str, name: str = "README") -> list[Block]:
    """The bash and python blocks of a markdown text, with the directives of the comment line before each."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), None)
        if end is None:
            raise ValueError(f"{name} line {i + 1}: a code block that never closes")
        if fence.group(2) in ("bash", "python"):
            code = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"  # a block inside a list item is indented
            block = Block(i + 1, fence.group(2), code)
            previous = lines[i - 1] if i else ""
            mark = MARK.search(previous)
            if mark:
                _directives(block, mark.group(1).strip(), name)
            blocks.append(block)
        i = end + 1
    return blocks


def _directives(block: Block, text: str, name: str = "README") -> None:
    if text.startswith("skip"):
        block.skip = text.removeprefix("skip").lstrip(": ").strip() or "no reason given"
        if block.skip == "no reason given":
            raise ValueError(f"{name} line {block.line}: readme-check skip needs a reason")
        return
    for word in shlex.split(text):
        if word.startswith("timeout="):
            block.timeout_s = float(word.removeprefix("timeout="))
        elif word == "expect":
            continue
        else:
            block.expect.append(word)


def fresh_clone(where: Path) -> Path:
    clone = where / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    # A clone's files are newer than the linked venv's install stamp; make would reinstall the clone into that venv.
    for name in ("setup.cfg", "pyproject.toml"):
        os.utime(clone / name, (0, 0))
    for name in LINKED:
        source = ROOT / name
        if not source.exists():
            raise SystemExit(f"error: {source} is missing: run `make demo` in {ROOT} first (the check links what it "
                             "leaves instead of redoing the quick start)")
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        (clone / name).symlink_to(source)
    return clone


def run_block(block: Block, clone: Path, state: Path, log: Path) -> tuple[int, float, str]:
    """Run one block in the clone; the shell state (exports, venv activation) is carried in ``state``."""
    if block.lang == "python":
        script = f"source {state}\ncd {clone}\npython - <<'README_PY'\n{block.code}README_PY\n"
    else:
        # the shell state is kept even when the block fails: a reader's terminal keeps its exports and venv too
        script = f"source {state}\ncd {clone}\ntrap 'export -p > {state}.next' EXIT\nset -e\n{block.code}\n"
    started = time.perf_counter()
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=block.timeout_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the block's whole process group (a job, a server it started)
        output, _ = proc.communicate()
        code = 124
    seconds = time.perf_counter() - started
    log.write_text(output)
    next_state = Path(f"{state}.next")
    if next_state.is_file():
        next_state.replace(state)
    return code, seconds, output


def read_documents(names: list[str]) -> dict[str, list[Block]]:
    """Each document's blocks, tagged with its path."""
    found = {}
    for name in names:
        blocks = parse_blocks((ROOT / name).read_text(), name)
        for block in blocks:
            block.file = name
        found[name] = blocks
    return found


def selected(block: Block, only: list[str] | None) -> bool:
    """``--only``: a bare number is a README line (as before guides were checked), ``FILE:N`` any document's."""
    if only is None:
        return True
    return any(item == block.where or (block.file == "README.md" and item == str(block.line)) for item in only)


def list_blocks(found: dict[str, list[Block]]) -> None:
    for name, blocks in found.items():
        runs = [b for b in blocks if not b.skip]
        print(f"{name}: {len(runs)} run, {len(blocks) - len(runs)} skipped")
        for block in blocks:
            first = block.code.strip().splitlines()[0] if block.code.strip() else ""
            what = f"skip: {block.skip}" if block.skip else f"run:  {first[:90]}"
            expect = f"  (expects {', '.join(map(repr, block.expect))})" if block.expect and not block.skip else ""
            print(f"  line {block.line:4d} {block.lang:6s} {what}{expect}")
    total = [b for blocks in found.values() for b in blocks]
    print(f"{len(found)} documents: {sum(not b.skip for b in total)} blocks run, {sum(bool(b.skip) for b in total)} skipped")


def fresh_state(state: Path) -> None:
    env_keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TERM", "USER", "TMPDIR")}
    state.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env_keep.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, default=None, help="work here and keep the clone and logs")
    parser.add_argument("--only", nargs="*", default=None,
                        help="blocks to run: README lines (23) or FILE:LINE (docs/guides/gpu.md:12)")
    parser.add_argument("--file", nargs="*", default=None, help="check only these documents (default: all)")
    parser.add_argument("--list", action="store_true", help="list the blocks that run and those skipped, and exit")
    args = parser.parse_args(argv)
    found = read_documents(args.file or documents())
    if args.list:
        list_blocks(found)
        return 0
    work = args.keep or Path(tempfile.mkdtemp(prefix="readme_check_"))
    work.mkdir(parents=True, exist_ok=True)
    clone = fresh_clone(work)
    state = work / "shell_state.sh"
    print(f"docs check in {clone} (linked from {ROOT}: {', '.join(LINKED)})", flush=True)
    failures, started, tally = 0, time.perf_counter(), {}
    try:
        for name, blocks in found.items():
            fresh_state(state)  # each document is read from a new terminal
            ran = passed = 0
            print(f"== {name}", flush=True)
            for block in blocks:
                if block.skip:
                    print(f"line {block.line:4d}  skipped: {block.skip}", flush=True)
                    continue
                if not selected(block, args.only):
                    continue
                log = work / f"block_{name.replace('/', '_')}_{block.line}.log"
                code, seconds, output = run_block(block, clone, state, log)
                missing = [text for text in block.expect if text not in output]
                ok = code == 0 and not missing
                ran, passed, failures = ran + 1, passed + ok, failures + (not ok)
                why = "" if ok else f"  FAILED ({'exit ' + str(code) if code else 'missing ' + ', '.join(map(repr, missing))}; log {log})"
                print(f"line {block.line:4d}  exit {code:3d}  {seconds:6.0f}s  {block.code.strip().splitlines()[0][:70]}{why}",
                      flush=True)
                if not ok:
                    print("    " + "\n    ".join(output.strip().splitlines()[-15:]), flush=True)
            tally[name] = (ran, passed, sum(bool(b.skip) for b in blocks))
            # a cluster a document started (and did not stop) is not the next document's
            subprocess.run(["bash", "-c", f"source {state}; cd {clone}; ray stop >/dev/null 2>&1 || true"], check=False)
    finally:
        subprocess.run(["bash", "-c", f"source {state}; cd {clone}; ray stop >/dev/null 2>&1 || true"], check=False)
    for name, (ran, passed, skipped) in tally.items():
        print(f"{name}: {passed}/{ran} blocks passed, {skipped} skipped")
    ran = sum(t[0] for t in tally.values())
    verdict = "PASS" if failures == 0 else "FAIL"
    print(f"README check: {ran - failures}/{ran} blocks passed in {time.perf_counter() - started:.0f}s {verdict}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
