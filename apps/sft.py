"""SFT cold start CLI (apps layer: entry point).

    python -m apps.sft --config FILE [dotted.key=value ...]

Fine-tunes ``sft.base_model`` (default ``actor_rollout_ref.model.path``) on ``sft.train_files`` (jsonl rows with ``messages`` and
optional ``tools``), loss on assistant tokens only, on ``trainer.n_gpus_per_node × nnodes`` Ray Train
workers; full weights (``sft.full_finetune``) or a LoRA adapter merged at the end. Writes a full HF model
+ tokenizer to ``sft.output_dir``; point ``actor_rollout_ref.model.path`` there to start GRPO from it.
"""

from __future__ import annotations

import argparse

from configs import load_config
from trainers.sft import run_sft


def main(argv: list[str] | None = None) -> None:
    """Command line: run the config's SFT cold start and print each step's loss."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None, help="experiment YAML (defaults when omitted)")
    parser.add_argument("overrides", nargs="*", help="verl-style dotted overrides, e.g. sft.epochs=2")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    from orchestration.driver import connect_ray

    connect_ray(cfg)
    trainer = cfg.trainer
    model = cfg.actor_rollout_ref.model
    if cfg.sft.base_model:
        model = model.model_copy(update={"path": cfg.sft.base_model, "tokenizer_path": None})
    result = run_sft(
        cfg.sft, model, cfg.actor_rollout_ref.actor.fsdp_config,
        num_workers=trainer.n_gpus_per_node * trainer.nnodes, device=trainer.device, seed=trainer.seed,
        experiment_name=f"{trainer.experiment_name}-sft",
    )
    print(f"sft: {result.kept} transcripts ({result.dropped_too_long} dropped as longer than "
          f"sft.max_length={cfg.sft.max_length}), {len(result.steps)} steps")
    for row in result.steps:
        print(f"  step {row['step']:3d}  epoch {row['epoch']}  loss {row['sft_loss']:.4f}  tokens {row['tokens']}")
    print(f"model + tokenizer written to {result.output_dir}")


if __name__ == "__main__":
    main()
