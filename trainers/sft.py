"""SFT cold start on the same Ray Train pool and model builder as GRPO (trainers layer).

Transcripts (jsonl rows ``{"messages": [...], "tools": [...]}``) are rendered with the tokenizer's chat
template once; the loss covers assistant tokens only. The assistant mask comes from rendering the
template incrementally: assistant message ``i`` starts where the render of ``messages[:i]`` with the
generation prompt ends (so ``<|im_start|>assistant\\n`` is not learned) and ends with the end-of-turn token
(``eos_token``, which stops generation, is learned). Ends are found in the full render because templates
such as Qwen3's render the *last* assistant turn differently (an empty think block) than earlier ones.
Characters map to tokens through the fast tokenizer's offsets: the transcript is tokenized once, whole.

Training reuses GRPO's plumbing: a transcript is a ``Sample`` whose "response" is everything after a
shared head, with the assistant mask as its loss mask. The head is the token prefix every transcript
starts with (in a tool-calling set: the system prompt with the tool schemas, most of each transcript's
tokens), laid out once per micro-batch in GRPO's shared-prompt layout (``trainers.prefix``): every token
sees exactly what it sees alone, so losses and gradients are unchanged, and a batch of 8 demo transcripts
runs ~1,000 token positions instead of ~2,500. Without a shared head (or with a flash-attention model,
which takes no dense mask) micro-batches are token-budget packed. Full fine-tuning or LoRA (merged at the
end); either way a full HF model + tokenizer lands in ``output_dir``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.distributed as dist

from configs.actor import FSDPConfig, ModelConfig
from configs.sections import SFTConfig
from trainers.batching import Sample, collate, filler, plan_step
from trainers.model import cpu_autocast, load_base_model, response_logprobs, shard_model
from trainers.prefix import collate_shared

log = logging.getLogger(__name__)

GRAD_CLIP = 1.0  # sft has no grad_clip field yet


@dataclass(frozen=True)
class Transcript:
    """One tokenized transcript: ``loss_mask[t] = 1`` where token ``t`` was said by the assistant."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]

    def as_sample(self, index: int, head: int = 1) -> Sample:
        """The transcript as a training sample whose "prompt" is its first ``head`` tokens (no loss there)."""
        if not 1 <= head < len(self.input_ids) or any(self.loss_mask[:head]):
            raise ValueError(f"transcript {index}: a {head}-token head must be loss-free and leave a token to learn")
        n = len(self.input_ids) - head
        return Sample(prompt_ids=self.input_ids[:head], response_ids=self.input_ids[head:],
                      response_mask=self.loss_mask[head:], rollout_logprobs=(0.0,) * n, advantage=0.0,
                      group_id=f"t{index}")


def shared_head(transcripts: Sequence[Transcript]) -> int:
    """Length of the token prefix all transcripts share, up to their first loss token (at least 1)."""
    first = transcripts[0]
    limit = min(min(len(t.input_ids) for t in transcripts) - 1,
                min(t.loss_mask.index(1) if 1 in t.loss_mask else len(t.loss_mask) for t in transcripts))
    head = 0
    while head < limit and all(t.input_ids[head] == first.input_ids[head] for t in transcripts):
        head += 1
    return max(head, 1)


def _render(tokenizer, messages: list[dict], tools: list[dict] | None, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=generation_prompt)


def assistant_spans(
    tokenizer, messages: list[dict], tools: list[dict] | None, where: str
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered transcript and the character spans of assistant turns: from after the generation prompt
    (the render of the earlier messages with ``add_generation_prompt``) through the end-of-turn token."""
    text = _render(tokenizer, messages, tools)
    end_of_turn = tokenizer.eos_token
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        if i == 0:
            raise ValueError(f"{where}: the transcript starts with an assistant message; nothing prompts it")
        header = _render(tokenizer, messages[:i], tools, generation_prompt=True)
        if not text.startswith(header):
            raise ValueError(f"{where}: the chat template renders the turns before message {i} differently "
                             "once the conversation goes on; cannot locate that assistant turn")
        end = text.find(end_of_turn, len(header)) if end_of_turn else -1
        if end < 0:
            raise ValueError(f"{where}: assistant message {i} has no end-of-turn token {end_of_turn!r} after it")
        spans.append((len(header), end + len(end_of_turn)))
    return text, spans


def tokenize_transcript(tokenizer, row: dict[str, Any], where: str) -> Transcript:
    """Tokenize one row once, mark tokens whose characters start inside an assistant span."""
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list")
    text, spans = assistant_spans(tokenizer, messages, row.get("tools"), where)
    if not spans:
        raise ValueError(f"{where}: no assistant message to learn from")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a <= start < b for a, b in spans)) for start, _end in enc["offset_mapping"]]
    return Transcript(tuple(enc["input_ids"]), tuple(mask))


def load_transcripts(paths: Sequence[str], tokenizer, max_length: int) -> tuple[list[Transcript], int]:
    """All rows of the jsonl files; rows longer than ``max_length`` tokens are dropped and counted."""
    kept, dropped = [], 0
    for path in paths:
        for line_no, line in enumerate(Path(path).read_text().splitlines(), start=1):
            if not line.strip():
                continue
            transcript = tokenize_transcript(tokenizer, json.loads(line), f"{path}:{line_no}")
            if len(transcript.input_ids) > max_length:
                dropped += 1
            else:
                kept.append(transcript)
    return kept, dropped


@dataclass(frozen=True)
class SFTResult:
    """Per-step metrics (``step``, ``epoch``, ``sft_loss``, ``tokens``) and what happened to the rows."""

    steps: list[dict[str, float]]
    kept: int
    dropped_too_long: int
    output_dir: str


@dataclass(frozen=True)
class SFTSpec:
    """What each SFT train worker gets (``config["spec"]`` of ``sft_loop_per_worker``): its config sections and the
    transcripts."""

    sft: SFTConfig
    model: ModelConfig
    fsdp: FSDPConfig
    device: str
    seed: int
    transcripts: list[Transcript]
    num_threads: int = 1


def _sft_step(model, optimizer, samples: list[Sample], plan, device, share: bool, autocast: bool = False) -> float:
    """One optimizer step over one batch; returns this rank's share of the global token-mean NLL."""
    total = 0.0
    for indices in plan.micro_batches:
        items = [samples[i] for i in indices] or [filler(samples[plan.filler_index])]
        mb = collate_shared(items) if share else collate(items, packed=True)
        # only the assistant tokens carry loss: the LM head runs on their positions alone (a transcript's
        # prompt, with the tool schemas, is most of its tokens)
        mb = replace(mb, valid=mb.valid & (mb.response_mask > 0))
        log_prob, _ = response_logprobs(model, mb, device, temperature=1.0, with_entropy=False,
                                        autocast=autocast)  # [B, R]
        mask = mb.response_mask.to(device)
        # verl's sft_loss normalisation: sum over the global batch's tokens, × dp_size (FSDP averages ranks).
        loss = -(log_prob * mask).sum() / plan.info.batch_num_tokens * plan.info.dp_size
        loss.backward()
        total += float(loss.detach()) / plan.info.dp_size
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def sft_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train entry point; ``config["spec"]`` is an ``SFTSpec``. Rank 0 saves the merged model."""
    import ray.train

    from trainers.model import resolve_device

    from trainers.worker import quiet_report_lines

    quiet_report_lines()
    spec: SFTSpec = config["spec"]
    if spec.num_threads > 1:
        torch.set_num_threads(spec.num_threads)
    device = resolve_device(spec.device)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(spec.seed)
    model = shard_model(load_base_model(spec.model, lora=not spec.sft.full_finetune), spec.fsdp, device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.sft.lr, weight_decay=0.0)
    head = shared_head(spec.transcripts)
    share = head > 1 and spec.model.override_config.get("attn_implementation", "sdpa") in ("sdpa", "eager")
    samples = [t.as_sample(i, head if share else 1) for i, t in enumerate(spec.transcripts)]
    if rank == 0:
        log.info("sft: %d-token head shared by every transcript%s", head, "" if share else " (not shared)")
    step = 0
    for epoch in range(spec.sft.epochs):
        plans = plan_step(samples, rank=rank, world_size=world, groups_per_mini_batch=spec.sft.batch_size,
                          use_dynamic_bsz=True, micro_batch_size=1, max_token_len=max(spec.sft.max_length, 4096),
                          share_prompts=share, shuffle_seed=spec.seed + epoch)
        for plan in plans:
            step += 1
            loss = torch.tensor([_sft_step(model, optimizer, samples, plan, device, share,
                                          cpu_autocast(spec.fsdp, device))], dtype=torch.float64)
            dist.all_reduce(loss)
            metrics = {"step": step, "epoch": epoch, "sft_loss": loss.item(), "tokens": plan.info.batch_num_tokens}
            if rank == 0:
                with (Path(spec.sft.output_dir) / "sft_metrics.jsonl").open("a") as fh:
                    fh.write(json.dumps(metrics) + "\n")
            # A Ray Train report costs a round trip to the controller: once per epoch is enough here
            # (every step's loss is in sft_metrics.jsonl).
            if plan is plans[-1]:
                ray.train.report(metrics)
    save_full_model(model, spec)


def save_full_model(model, spec: SFTSpec) -> None:
    """Gather the full weights to rank 0, merge LoRA if any, save HF model + tokenizer (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoTokenizer

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return
    plain = load_base_model(spec.model.model_copy(update={"enable_gradient_checkpointing": False}),
                            lora=not spec.sft.full_finetune)
    plain.load_state_dict(state)
    if not spec.sft.full_finetune:
        plain = plain.merge_and_unload()
    out = Path(spec.sft.output_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(spec.model.tokenizer_path or spec.model.path).save_pretrained(tmp)
    for name in ("sft_metrics.jsonl",):
        if (out / name).exists():
            shutil.copy(out / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def run_sft(sft: SFTConfig, model: ModelConfig, fsdp: FSDPConfig, *, num_workers: int, device: str, seed: int,
            experiment_name: str = "sft") -> SFTResult:
    """Tokenize on the driver, train on ``num_workers`` Ray Train workers, return per-step metrics."""
    from ray.train import LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from transformers import AutoTokenizer

    if not sft.train_files:
        raise ValueError("sft.train_files is not set")
    if not sft.full_finetune and model.lora_rank == 0:
        raise ValueError("sft.full_finetune=false needs actor_rollout_ref.model.lora_rank > 0")
    tokenizer = AutoTokenizer.from_pretrained(model.tokenizer_path or model.path)
    paths = [sft.train_files] if isinstance(sft.train_files, str) else list(sft.train_files)
    transcripts, dropped = load_transcripts(paths, tokenizer, sft.max_length)
    if not transcripts:
        raise ValueError(f"sft: no transcript of at most sft.max_length={sft.max_length} tokens in {paths}")
    log.info("sft: %d transcripts, %d dropped as longer than %d tokens", len(transcripts), dropped, sft.max_length)
    out = Path(sft.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "sft_metrics.jsonl").unlink(missing_ok=True)
    sft = sft.model_copy(update={"output_dir": str(out)})
    use_gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    # On CPU the cold start runs alone (before any rollout replica): each worker computes with its share of the
    # cores, although it reserves one CPU (Ray would otherwise pin it to one thread through OMP_NUM_THREADS).
    threads = 1 if use_gpu else max(1, (os.cpu_count() or 1) // num_workers)
    trainer = TorchTrainer(
        sft_loop_per_worker,
        train_loop_config={"spec": SFTSpec(sft, model, fsdp, device, seed, transcripts, num_threads=threads)},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
        run_config=RunConfig(name=experiment_name, storage_path=str(out.parent / f"{out.name}.ray_train"),
                             logging_config=LoggingConfig(log_level="WARNING")),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    lines = (out / "sft_metrics.jsonl").read_text().splitlines()
    return SFTResult([json.loads(line) for line in lines], len(transcripts), dropped, str(out))
