"""The tiny Llama for tests and demos, built on demand from source kept in this folder.

The model is not committed: `build.py` makes it deterministically (same bytes every time, ~5 s)
from `corpus.txt` (authored text shipped here), so the repository carries the recipe, not a binary.
`ensure_tiny_model(root)` builds it once into `root/tiny-llama-<hash>` where the hash covers the
build script and the corpus; a changed recipe therefore gets a fresh directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.py"
CORPUS = HERE / "corpus.txt"
SERVED_NAME = "tiny-llama"


class ModelBuildError(RuntimeError):
    """The tiny model could not be built (the message carries the build's output)."""


def recipe_hash() -> str:
    digest = hashlib.sha256()
    for path in (BUILD_SCRIPT, CORPUS):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def ensure_tiny_model(root: Path, python: str) -> Path:
    """The tiny model's directory under `root`, built with `python` (needs torch/transformers) if absent."""
    target = Path(root) / f"tiny-llama-{recipe_hash()}"
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    try:
        result = subprocess.run(
            [python, str(BUILD_SCRIPT), str(staging)], capture_output=True, text=True, env=env, timeout=600
        )
        if result.returncode != 0:
            raise ModelBuildError(f"building the tiny model failed:\n{result.stdout}\n{result.stderr}")
        try:
            staging.rename(target)
        except OSError:
            if not (target / "model.safetensors").exists():  # lost a race to another builder: fine
                raise
    except FileNotFoundError as exc:
        raise ModelBuildError(f"cannot run {python!r} to build the tiny model: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
