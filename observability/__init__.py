"""Where a run's numbers and traces go (observability layer): ``tracking`` (metrics.jsonl, mlflow, tensorboard, wandb,
Ray gauges, the reward curve) and ``tracing`` (mlflow traces of agent loops)."""
