"""Execute every notebook in notebooks/ with nbclient (fresh kernel each, small
sizes via COLIBRI_LAB_SMALL=1) and fail on any error - the notebooks assert
what they show, so a failed claim fails here.

Uses the real SmolLM2 model (fixture smollm2_path).  COLIBRI_LAB_SIMD and
COLIBRI_LAB_THREADS pass through to the notebooks (e.g. COLIBRI_LAB_SIMD=scalar
while a SIMD path is unavailable); COLIBRI_LAB_NB_TIMEOUT sets the per-cell
timeout in seconds (default 900).
"""
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"tour.ipynb", "batching_latency.ipynb", "prefix_hit_ratio.ipynb"} <= names


@pytest.mark.smollm2
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, smollm2_path, monkeypatch):
    monkeypatch.setenv("COLIBRI_LAB_SMALL", "1")
    monkeypatch.setenv("COLIBRI_LAB_SMOLLM2", smollm2_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MPLBACKEND", "agg")
    nb = nbformat.read(path, as_version=4)
    assert nb.cells and "COLIBRI_LAB_SMALL" in nb.cells[1].source, "the first code cell holds the parameters"
    client = nbclient.NotebookClient(nb, timeout=int(os.environ.get("COLIBRI_LAB_NB_TIMEOUT", "900")),
                                     kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()   # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
