"""Build a tiny Qwen2-style Hugging Face model folder offline (apps layer: entry point).

    python -m apps.make_tiny_model --out DIR [--seed 0]

No model hub is reachable here, so tests and the CPU demo use a model made on the spot:
a byte-level BPE tokenizer trained with ``tokenizers`` on ``agents.data.tiny_corpus``, with Qwen's
normalizer / pre-tokenizer / decoder (transformers 5 rebuilds a ``qwen2`` tokenizer's pipeline from
Qwen's regex on load, so any other pipeline would tokenize differently after a reload), the ChatML and
tool tokens added whole, the Qwen2.5-style chat template of ``agents.data.chat_template``, and a
randomly initialised ``Qwen2ForCausalLM`` whose weights depend only on ``seed``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from agents.data.chat_template import CHAT_TEMPLATE
from agents.data.tiny_corpus import tiny_corpus

# Qwen2's pre-tokenizer split (contractions, letter runs, single digits, punctuation runs, newlines).
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Not "special": they must survive decode(skip_special_tokens=True) so parsers see them (as in Qwen).
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TinyModelSpec:
    """Sizes of the tiny model; the defaults give ~1M parameters (a few MB in float32)."""

    vocab_size: int = 3000
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 32768


def train_tokenizer(vocab_size: int, seed: int = 0) -> Tokenizer:
    """A byte-level BPE over the tiny corpus with Qwen's pipeline and the ChatML/tool tokens added."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        # All 256 byte symbols, so any input encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(tiny_corpus(seed=seed), trainer=trainer)
    # Added after training, as in Qwen: ids follow the BPE vocabulary and never take part in merges.
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHATML_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """The trained tokenizer as a transformers tokenizer, with the EOS and pad tokens and the chat template."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=TinyModelSpec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def random_model(spec: TinyModelSpec, vocab_size: int, eos_id: int, pad_id: int, seed: int) -> Qwen2ForCausalLM:
    """A randomly initialised ``Qwen2ForCausalLM`` of ``spec``'s size; the same ``seed`` gives the same weights."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    # Initialisation draws from torch's global generator: seeding it makes the weights a function of seed.
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    return model.eval()


def build_tiny_model(out_dir: str | Path, seed: int = 0, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write tokenizer + chat template + random weights to ``out_dir`` and return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = wrap_tokenizer(train_tokenizer(spec.vocab_size, seed=seed))
    eos_id, pad_id = tokenizer.convert_tokens_to_ids([EOS_TOKEN, PAD_TOKEN])
    model = random_model(spec, len(tokenizer), eos_id, pad_id, seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: write the tiny model to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="seed for the weights (same seed, same model)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = build_tiny_model(args.out, seed=args.seed)
    n_bytes = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"tiny model written to {out} ({n_bytes / 1e6:.1f} MB) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
