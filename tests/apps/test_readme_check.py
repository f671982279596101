"""The README check's block parser, and the documents it checks (README and guides): every command block runs or
says why not."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("readme_check", ROOT / "scripts" / "readme_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_blocks_and_their_directives_are_read():
    check = _module()
    text = "\n".join([
        "intro", "<!-- readme-check: skip: needs a GPU -->", "```bash", "nvidia-smi", "```",
        '<!-- readme-check: expect "HEALTHY" "ok now" timeout=60 -->', "```bash", "serve status", "```",
        "```", "output, not a command", "```",
        "- a list item:", "", "  ```python", "  print('indented')", "  ```",
    ])
    skipped, expecting, indented = check.parse_blocks(text)
    assert (skipped.line, skipped.skip) == (3, "needs a GPU")
    assert (expecting.expect, expecting.timeout_s, expecting.code) == (["HEALTHY", "ok now"], 60.0, "serve status\n")
    assert (indented.lang, indented.code) == ("python", "print('indented')\n")
    with pytest.raises(ValueError, match="needs a reason"):
        check.parse_blocks("<!-- readme-check: skip -->\n```bash\nx\n```\n")
    with pytest.raises(ValueError, match="never closes"):
        check.parse_blocks("```bash\nx\n")


def test_every_readme_and_guide_block_runs_as_written_or_says_why_not():
    check = _module()
    names = check.documents()
    assert names[0] == "README.md" and "docs/getting-started.md" in names
    assert {"docs/guides/serve-deploy.md", "docs/guides/ray-job-submit.md", "docs/agent_lightning.md"} <= set(names)
    found = check.read_documents(names)
    run = [b for blocks in found.values() for b in blocks if not b.skip]
    assert len(run) >= 8
    for block in run:  # placeholders a reader would have to fill in cannot run as written
        assert "[...]" not in block.code and "<your" not in block.code, block.where


def test_only_names_readme_lines_or_a_documents_lines():
    check = _module()
    readme, guide = check.Block(23, "bash", "x\n"), check.Block(23, "bash", "x\n", file="docs/guides/gpu.md")
    assert check.selected(readme, ["23"]) and check.selected(readme, ["README.md:23"])
    assert not check.selected(guide, ["23"]) and check.selected(guide, ["docs/guides/gpu.md:23"])
    assert check.selected(guide, None)
