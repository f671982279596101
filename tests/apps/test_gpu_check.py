"""The prepared GPU check (scripts/gpu_check.py) runs on the CPU as it would on the lent GPU machine: without Ray,
importing only what that machine has plus what scripts/gpu_check.sh carries there as wheels."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The GPU machine's Python packages, as the device tool's KINDS.md lists them (nvidia-h200, read 2026-11-17).
GPU_MACHINE_HAS = ["absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio", "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake", "colorama", "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x", "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock", "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py", "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig", "interface-meta", "jax", "jaxlib", "jaxtyping", "jinja2", "joblib", "kiwisolver", "lazy-loader", "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml", "markdown", "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict", "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja", "numba", "numba-cuda", "numpy", "numpyro", "nvidia-ml-py", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless", "optax", "opt-einsum", "opt-einsum-fx", "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec", "patsy", "peft", "pillow", "pip", "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf", "psutil", "pyarrow", "pybind11", "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions", "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil", "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core", "scikit-image", "scikit-learn", "scipy", "seaborn", "sentencepiece", "sentence-transformers", "setuptools", "shellingham", "simplejson", "six", "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard", "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers", "toolz", "torch", "torchaudio", "torchdiffeq", "torch-geometric", "torchmetrics", "torchvision", "tqdm", "transformers", "treescope", "triton", "typer", "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig", "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp"]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried() -> list[str]:
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    return re.search(r'CARRIED="([^"]*)"', text).group(1).split()


def machine_view(folder: Path, allowed: set[str]) -> Path:
    """A site-packages folder holding only the allowed distributions installed here (links to their files)."""
    import importlib.metadata

    site = folder / "site-packages"
    site.mkdir()
    for dist in importlib.metadata.distributions():
        if _normal(dist.metadata["Name"]) not in allowed:
            continue
        for top in {Path(f).parts[0] for f in dist.files or () if not Path(f).parts[0].startswith("..")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    return site


@pytest.mark.integration
@pytest.mark.slow
def test_gpu_check_runs_on_cpu_with_only_what_the_gpu_machine_has(tmp_path):
    # The interpreter without its site-packages (-S), given only the GPU machine's packages and the carried ones:
    # a module from anything else, Ray included, fails to import as it would there.
    site = machine_view(tmp_path, {_normal(n) for n in GPU_MACHINE_HAS + carried()})
    assert not (site / "ray").exists() and (site / "verl").exists() and (site / "torch").exists()
    args = ["--device", "cpu", "--shape", "tiny", "--groups", "2", "--n", "4", "--prompt-len", "24",
            "--response-len", "16", "--steps", "2", "--requests", "4", "--gen-tokens", "8"]
    run = f"import sys; sys.path.insert(0, {str(site)!r}); sys.argv = ['gpu_check.py', *sys.argv[1:]]; " \
          "import runpy; runpy.run_path('scripts/gpu_check.py', run_name='__main__')"
    proc = subprocess.run([sys.executable, "-S", "-c", run, *args], cwd=ROOT, capture_output=True, text=True, check=False,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "Ray absent: stand-in module registered" in out
    assert re.search(r"train step: median [\d.]+ s over 2 steps, [\d,]+ tokens/s", out), out[-2000:]
    assert re.search(r"HFEngine \(float32\): 1 request [\d,.]+ tokens/s; 4 concurrent", out), out[-2000:]
    assert re.search(r"LoRA tensors changed (\d+)/\1, .* PASS$", proc.stdout.strip().splitlines()[-1]), out[-2000:]


@pytest.mark.unit
def test_a_bad_size_is_refused_before_anything_loads():
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--n", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--n must be >= 2" in proc.stderr


@pytest.mark.unit
def test_every_carried_distribution_is_pinned_from_the_project_venv():
    # the wheels half pins each name to the installed version: every name must be an installed distribution
    import importlib.metadata

    for name in carried():
        assert importlib.metadata.version(name), name
