"""Where Ray Train keeps a run's checkpoints (trainers layer).

``trainer.storage_path`` follows Ray Train's ``RunConfig.storage_path`` rules: a folder on this node (the
default, ``<run dir>/ray_train``) is right for one node; on a cluster of several nodes the train workers write
checkpoints from wherever they run, so it must be a URI every node reaches (``s3://``, ``gs://``, or
``file://`` on shared storage such as NFS). A ``file://`` URI and a plain folder are read directly here; other
URIs through ``pyarrow.fs`` (the filesystem layer Ray Train itself uses).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from configs.sections import TrainerConfig


def is_uri(path: str) -> bool:
    """Whether ``path`` is a URI (``s3://``, ``gs://``, ``file://``) rather than a folder on this node."""
    return "://" in path


def checkpoint_root(trainer: TrainerConfig) -> str:
    """Ray Train's ``storage_path`` for this run: ``trainer.storage_path`` or ``<run dir>/ray_train``."""
    if trainer.storage_path:
        return trainer.storage_path if is_uri(trainer.storage_path) else str(Path(trainer.storage_path).resolve())
    return str(Path(trainer.run_dir).resolve() / "ray_train")


def local_folder(root: str) -> Path | None:
    """The folder ``root`` names on this node (a path or a ``file://`` URI); None for remote storage."""
    if not is_uri(root):
        return Path(root)
    parsed = urlparse(root)
    return Path(parsed.path) if parsed.scheme == "file" else None


def read_bytes(root: str, relative: str) -> bytes | None:
    """The file at ``root``/``relative`` (None when it does not exist), from a folder or any pyarrow filesystem."""
    folder = local_folder(root)
    if folder is not None:
        path = folder / relative
        return path.read_bytes() if path.is_file() else None
    import pyarrow.fs

    fs, base = pyarrow.fs.FileSystem.from_uri(root)
    path = f"{base.rstrip('/')}/{relative}"
    if fs.get_file_info(path).type != pyarrow.fs.FileType.File:
        return None
    with fs.open_input_stream(path) as stream:
        return stream.read()


def newest_checkpoint_on_disk(storage: str, experiment_name: str) -> Path | None:
    """The newest ``step_*`` checkpoint folder under the run's Ray Train storage whose ``state.pt`` loads (None
    for remote storage: only Ray Train's registered checkpoints count there).

    Ray Train registers a reported checkpoint only when its controller next polls the worker; a worker killed in
    between leaves a complete checkpoint on disk that ``ray.train.get_checkpoint()`` does not know."""
    root = local_folder(storage)
    if root is None:
        return None
    folder = root / experiment_name
    import torch  # the driver imports it anyway (Ray Train); kept out of this module's import for the CLIs

    for candidate in sorted(folder.glob("step_*"), key=lambda p: p.name, reverse=True):
        try:
            torch.load(candidate / "state.pt", map_location="cpu", weights_only=False)["progress"]
        except Exception:  # noqa: BLE001 - partly written or foreign: try the next older one
            continue
        return candidate
    return None
