"""Turn ``actor_rollout_ref.model.path`` into a local folder (deployments layer: plumbing).

A model path is either a local Hugging Face folder (``python -m apps.make_tiny_model --out DIR`` makes
one) or a hub id such as ``Qwen/Qwen2.5-Coder-1.5B-Instruct``. Local folders need no network; a hub id
is looked up in the local hub cache first and downloaded only if it is not there.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from huggingface_hub.utils import validate_repo_id

MODEL_FILES = ("config.json",)


def _local_folder(path: Path) -> str:
    missing = [name for name in MODEL_FILES if not (path / name).is_file()]
    if missing:
        raise FileNotFoundError(f"model path {str(path)!r} is a folder but has no {', '.join(missing)}")
    return str(path.resolve())


def resolve_model_path(path_or_hub_id: str | Path) -> str:
    """The absolute local folder for a model path or hub id; errors name the path."""
    text = str(path_or_hub_id)
    path = Path(text).expanduser()
    if path.is_dir():
        return _local_folder(path)
    try:
        validate_repo_id(text)
    except HFValidationError:
        raise FileNotFoundError(f"model path {text!r} is neither a local folder nor a hub id") from None
    try:
        return snapshot_download(text, local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    try:
        return snapshot_download(text)
    except Exception as exc:  # fault boundary: any network/hub failure becomes one clear message
        raise FileNotFoundError(
            f"model path {text!r}: not a local folder and the hub download failed "
            f"({type(exc).__name__}: {exc}); offline, build a local model with "
            "`python -m apps.make_tiny_model --out DIR`"
        ) from exc
