"""Execute experiment notebooks at full size with nbclient, as the recorded runs are made.

    flock /tmp/bench.lock python scripts/run_notebook.py notebooks/tour.ipynb [more.ipynb ...]
        [--model qwen2.5-coder-1.5b] [--threads 2] [--llama-python /work/venv-anchors/bin/python]

The benchmark's CPU weight: run it in a session of its own whose scheduling group has
more weight than the other sessions' (with autogroup scheduling nice 19 does not yield to
another session), e.g. `setsid flock /tmp/bench.lock sh -c 'echo -15 > /proc/self/autogroup;
exec python scripts/run_notebook.py ...'`; the kernel, and the servers it starts, get that
weight too (colibri_lab.experiments.servers.share_scheduling_group).

Each notebook runs in a fresh kernel from notebooks/ with COLIBRI_LAB_SMALL=0 (so it
saves its results under experiments/results/ and records its claims there), the model in
COLIBRI_LAB_MODEL and the threads in COLIBRI_LAB_THREADS.  The text and Markdown its cells
print (the verdicts among them) is echoed here; a failing cell (an assertion of the
notebook's claims) fails the run with the cell's error.  The executed notebook is not
written back: the saved results are the record.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this tree's package, as the kernels get it (PYTHONPATH below)


def run_one(path: Path, timeout: int) -> int:
    import nbclient
    import nbformat

    from colibri_lab.experiments.servers import share_scheduling_group

    class Client(nbclient.NotebookClient):
        async def async_start_new_kernel(self, **kw):
            await super().async_start_new_kernel(**kw)
            # jupyter_client starts the kernel in a session of its own: give it this run's CPU weight
            share_scheduling_group(self.km.provisioner.process.pid)

    nb = nbformat.read(path, as_version=4)
    client = Client(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    t0 = time.monotonic()
    rc = 0
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        print(f"{path.name}: a cell failed:\n{exc}", file=sys.stderr)
        rc = 1
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for o in cell.get("outputs", []):
            if o.output_type == "stream":
                print(o.text, end="")
            elif o.output_type in ("execute_result", "display_data"):
                data = o.get("data", {})
                if "text/markdown" in data:
                    print(data["text/markdown"])
    print(f"{path.name}: {'ok' if rc == 0 else 'FAILED'} in {time.monotonic() - t0:.0f} s", flush=True)
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="+")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="alias or GGUF path (COLIBRI_LAB_MODEL)")
    ap.add_argument("--threads", type=int, default=2, help="COLIBRI_LAB_THREADS")
    ap.add_argument("--llama-python", default="", help="a python with llama-cpp-python[server] (serving notebook)")
    ap.add_argument("--timeout", type=int, default=1800, help="per cell, seconds")
    a = ap.parse_args(argv)
    os.environ.update({"COLIBRI_LAB_SMALL": "0", "COLIBRI_LAB_MODEL": a.model, "COLIBRI_LAB_THREADS": str(a.threads),
                       "MPLBACKEND": "agg",
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    if a.llama_python:
        os.environ["COLIBRI_LAB_LLAMA_PYTHON"] = a.llama_python
    rc = 0
    for nb in a.notebooks:
        rc |= run_one(Path(nb).resolve(), a.timeout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
