"""tandem-rl as an Agent Lightning 0.3.x algorithm: ``agl.Trainer(algorithm=TandemRL(config), ...)`` in place of
``agl.VERL(config)``; the agent, its ``LitAgent`` / ``@agl.rollout`` code and ``trainer.fit(...)`` stay as they are.

What happens in ``Trainer.fit``: Agent Lightning forks its runners and serves its store over HTTP, then awaits
``TandemRL.run(train_dataset, val_dataset)``, which

1. writes both datasets as tandem-rl rows (each item kept whole in ``extra_info.agl_task``, the rollout's input);
2. adds the resource ``main_llm``: a ``ProxyLLM`` on tandem-rl's OpenAI ingress, so each rollout's base URL is
   ``http://<host>:<serve_port>/rollout/{rollout_id}/attempt/{attempt_id}/v1`` and the ingress records its calls
   token-exactly under that attempt;
3. runs ``python -m apps.train`` with tandem-rl's interpreter on the config (a tandem-rl/verl YAML file, or the
   dict you gave ``agl.VERL``), the rows, ``default_agent_loop=agent_lightning`` and ``agent_lightning.store_url``
   set to this store. tandem-rl enqueues ``rollout.n`` rollouts per row, reads each attempt's reward spans
   (a float returned by the agent or ``emit_reward``) and recorded calls, and trains GRPO + LoRA on them;
4. returns when that run ends (Agent Lightning then stops its runners); a failed run raises.

Only ``agentlightning`` and the standard library are imported here: this package goes into Agent Lightning's
environment, tandem-rl stays in its own (``python``: its interpreter, default ``$TANDEM_RL_PYTHON``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import agentlightning as agl

__all__ = ["TandemRL", "write_rows"]

DATA_SOURCE = "agent_lightning"


def _row(item: Any, index: int, split: str, where: str) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        raise TypeError(f"{where} item {index}: a task must be a JSON object (a dict), got {type(item).__name__}")
    try:
        text = json.dumps(item, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where} item {index}: the task is not JSON-serializable ({exc})") from None
    source = item.get("data_source") if isinstance(item.get("data_source"), str) and item.get("data_source") else DATA_SOURCE
    return {
        "data_source": source,
        # a label for tandem-rl's logs (its length counts against data.max_prompt_length): the agent receives
        # agl_task, never this prompt, and its own prompts are what is trained
        "prompt": [{"role": "user", "content": f"Agent Lightning task {index}"}],
        "ability": "agent",
        "reward_model": {"style": "rule", "ground_truth": ""},
        "extra_info": {"index": index, "question": text, "answer": "", "split": split, "agl_task": dict(item)},
        "agent_name": "agent_lightning",
    }


def write_rows(items: Iterable[Any], path: Path, split: str, where: str) -> int:
    """A dataset given to ``Trainer.fit`` as tandem-rl rows (JSON lines); returns how many. A task that is not a
    JSON object is refused, naming its index."""
    rows = [_row(item, i, split, where) for i, item in enumerate(items)]
    if not rows:
        raise ValueError(f"{where} is empty: nothing to train or validate on")
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


class TandemRL(agl.Algorithm):
    """GRPO + LoRA with tandem-rl (see the module docstring).

    ``config``: a tandem-rl (or verl) YAML file, or a dict of verl's keys (what ``agl.VERL`` takes); ``overrides``:
    ``dotted.key=value`` strings on top. ``python``: tandem-rl's interpreter (default ``$TANDEM_RL_PYTHON``);
    ``cwd``: where ``apps.train`` runs, which relative paths in the config are read from (default: here).
    ``host`` / ``serve_port``: where the agents reach tandem-rl's ingress (``serve.port`` is set to it).
    ``model_name``: the model name agents are given (any name is served). ``workdir``: where the rows and the
    written config go (default: a temporary folder, removed afterwards).
    """

    def __init__(self, config: str | os.PathLike[str] | Mapping[str, Any], overrides: Sequence[str] = (), *,
                 python: str | None = None, cwd: str | os.PathLike[str] | None = None, host: str = "127.0.0.1",
                 serve_port: int = 8000, model_name: str = "tandem-policy", workdir: str | os.PathLike[str] | None = None,
                 temperature: float | None = None):
        super().__init__()
        self.config = config if isinstance(config, Mapping) else Path(config)
        if isinstance(self.config, Path) and not self.config.is_file():
            raise FileNotFoundError(f"TandemRL: config {self.config} does not exist")
        self.overrides = [str(o) for o in overrides]
        bad = [o for o in self.overrides if "=" not in o]
        if bad:
            raise ValueError(f"TandemRL: overrides must be dotted.key=value, got {bad}")
        self.python = python or os.environ.get("TANDEM_RL_PYTHON")
        if not self.python:
            raise ValueError("TandemRL: pass python= (tandem-rl's interpreter, e.g. /path/to/tandem-rl/.venv/bin/python) "
                             "or set TANDEM_RL_PYTHON: tandem-rl runs in its own environment")
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.host, self.serve_port, self.model_name = host, int(serve_port), model_name
        self.workdir = Path(workdir) if workdir is not None else None
        self.temperature = temperature
        self.returncode: int | None = None

    def _temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        if isinstance(self.config, Mapping):
            rollout = (self.config.get("actor_rollout_ref") or {}).get("rollout") or {}
            if "temperature" in rollout:
                return float(rollout["temperature"])
        for override in self.overrides:
            key, _, value = override.partition("=")
            if key == "actor_rollout_ref.rollout.temperature":
                return float(value)
        return 1.0

    def command(self, folder: Path, train_rows: Path, val_rows: Path | None, store_url: str) -> list[str]:
        """The ``apps.train`` command this algorithm runs."""
        if isinstance(self.config, Mapping):
            config = folder / "config.yaml"
            config.write_text(json.dumps(self.config, indent=1), encoding="utf-8")  # JSON is YAML
        else:
            config = self.config.resolve()
        return [
            self.python, "-m", "apps.train", "--config", str(config), *self.overrides,
            f"data.train_files={train_rows}", f"data.val_files={val_rows if val_rows else 'null'}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=agent_lightning",
            f"agent_lightning.store_url={store_url}", f"serve.port={self.serve_port}",
        ]

    async def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
        store = self.get_store()
        store_url = getattr(store, "endpoint", None)
        if not store_url:
            raise RuntimeError(f"TandemRL: the store ({type(store).__name__}) is not served over HTTP; tandem-rl reaches "
                               "it from another process. Use the Trainer's default strategy (client-server).")
        if train_dataset is None:
            raise ValueError("TandemRL: Trainer.fit needs a train_dataset")
        with tempfile.TemporaryDirectory(prefix="tandem-rl-agl-") as tmp:
            folder = self.workdir or Path(tmp)
            folder.mkdir(parents=True, exist_ok=True)
            train_rows = folder / "train.jsonl"
            write_rows(train_dataset, train_rows, "train", "train_dataset")
            val_rows = None
            if val_dataset is not None:
                val_rows = folder / "val.jsonl"
                write_rows(val_dataset, val_rows, "val", "val_dataset")
            llm = agl.ProxyLLM(endpoint=f"http://{self.host}:{self.serve_port}/v1", model=self.model_name,
                               sampling_parameters={"temperature": self._temperature()})
            await store.add_resources({"main_llm": llm})
            cmd = self.command(folder, train_rows, val_rows, store_url)
            print("TandemRL:", " ".join(cmd), flush=True)
            proc = await asyncio.create_subprocess_exec(*cmd, cwd=self.cwd)  # its output goes where ours does
            try:
                self.returncode = await proc.wait()
            except asyncio.CancelledError:  # Ctrl-C / the trainer stopping: tandem-rl stops gracefully on SIGTERM
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        await asyncio.wait_for(proc.wait(), 60)
                    except asyncio.TimeoutError:
                        proc.kill()
                raise
        if self.returncode != 0:
            raise RuntimeError(f"TandemRL: apps.train exited with {self.returncode} (its output is above)")
