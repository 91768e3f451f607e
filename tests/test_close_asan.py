"""Closing an engine while a long step runs is safe, checked under
AddressSanitizer: the extension is built again with -fsanitize=address into a
temporary package, and a subprocess with libasan preloaded closes (1) the core
from another thread while its step() runs and (2) an Engine whose scheduler
is inside a long prefill step.  Freeing under the running step would be a
heap-use-after-free that ASan reports."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]

SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from colibri_lab import _engine
    from colibri_lab.engine import Engine
    from colibri_lab.errors import ColibriError

    path = sys.argv[1]
    prompt = [(i * 7919) % 40000 + 100 for i in range(600)]

    # 1. the core: close() from another thread while step() is inside C
    core = _engine.Engine(_engine.Model(path), n_slots=1, n_ctx=1024, n_threads=1, n_batch=1024)
    core.submit(prompt, max_tokens=1)
    box = {}
    t = threading.Thread(target=lambda: box.update(ev=core.step()))
    t.start()
    time.sleep(0.3)
    core.close()                    # the step is still running: marks, does not free
    t.join()
    assert box["ev"] is not None
    try:
        core.step()
        raise SystemExit("a closed engine stepped")
    except ColibriError:
        pass

    # 2. Engine.close() while the scheduler's step runs longer than its timeout
    eng = Engine(path, n_threads=1, n_ctx=1024, n_batch=1024, n_chunk=1024)
    h = eng.scheduler.submit(prompt, max_tokens=4)
    time.sleep(0.3)
    eng.close(timeout=0.01)
    assert h.wait(120), "the request never ended"
    print("CLOSE-OK", h.error)
""")


def test_close_during_long_step_is_safe_under_asan(tmp_path, smollm2_path):
    cc = os.environ.get("CC", "cc")  # may carry a wrapper or flags ("ccache gcc"), as setuptools allows
    libasan = subprocess.run(shlex.split(cc) + ["-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    assert os.path.isabs(libasan) and os.path.exists(libasan), f"no libasan.so from {cc}: {libasan!r}"
    pkg = tmp_path / "pkg"
    shutil.copytree(ROOT / "colibri_lab", pkg / "colibri_lab",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "_engine.c"))
    env = dict(os.environ, CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g",
               LDFLAGS="-fsanitize=address")
    b = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(pkg),
                        "--build-temp", str(tmp_path / "build")], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1500)
    assert b.returncode == 0, b.stderr[-3000:]
    assert list((pkg / "colibri_lab").glob("_engine*.so"))
    env = dict(os.environ, LD_PRELOAD=libasan, PYTHONPATH=str(pkg),
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(smollm2_path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert "AddressSanitizer" not in r.stderr, r.stderr[-4000:]
    assert r.returncode == 0 and "CLOSE-OK" in r.stdout, (r.stdout[-2000:], r.stderr[-4000:])
