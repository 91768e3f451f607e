"""Servers on loopback for serving experiments: ours and llama.cpp's.

    with start_colibri(model="smollm2", n_threads=2, n_ctx=2048, n_slots=4) as srv:
        srv.base_url      # "http://127.0.0.1:PORT"
    with start_llama_cpp(model="smollm2", n_threads=2, n_ctx=2048) as srv: ...

Both start a child process on the same GGUF file (an alias is resolved to
the cached file here), with the same threads and context, bound to
127.0.0.1 on a free port, and wait until it answers.  llama.cpp's server is
llama-cpp-python's (`python -m llama_cpp.server`, the `anchors` extra); it
runs under the interpreter given as `python=`, else $COLIBRI_LAB_LLAMA_PYTHON,
else this one.  When that interpreter has no llama_cpp.server,
`llama_cpp_unavailable()` says why and start_llama_cpp raises
AnchorUnavailable with that reason (tests skip on it).

llama-cpp-python's server runs one request at a time and by default
*interrupts* a running stream when the next request arrives
(interrupt_requests); a load test would then measure interrupted streams,
so it is started with interrupt_requests off: requests queue, as they do
behind any one-sequence server.  On CPUs with AMX tiles its extra CPU
buffer types are off (llama_anchor: they crash it there).  Its context is one sequence of n_ctx
tokens; ours gets n_slots sequences of n_ctx each.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from colibri_lab import llama_anchor

LLAMA_PYTHON_ENV = "COLIBRI_LAB_LLAMA_PYTHON"


class AnchorUnavailable(RuntimeError):
    """The llama.cpp server cannot be started here; str(exc) says why."""


class ServerStartError(RuntimeError):
    """A server process exited or did not answer in time (the message holds its log's tail)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_model(model: str) -> Path:
    """An alias or a path -> the GGUF file (both servers must read the same file)."""
    from colibri_lab import models

    return Path(models.resolve(model)).resolve()


@dataclass
class ServerProcess:
    """A server child process on loopback."""

    kind: str                                   # "colibri" | "llama.cpp"
    cmd: list[str]
    base_url: str
    model_id: str
    model_path: str
    params: dict = field(default_factory=dict)  # threads, context, slots as started
    version: str = ""
    proc: subprocess.Popen | None = None
    log_path: str = ""

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return Path(self.log_path).read_text("utf-8", "replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self.proc = None

    def info(self) -> dict:
        """What this server was, for a result's metadata."""
        from colibri_lab.experiments.results import file_sha256

        d = {"kind": self.kind, "base_url": self.base_url, "model_id": self.model_id, "cmd": self.cmd,
             "params": dict(self.params), "version": self.version, "model_path": self.model_path}
        try:
            d["model_sha256"] = file_sha256(self.model_path)
        except OSError:
            d["model_sha256"] = ""
        return d

    def wait_ready(self, probe: str, timeout: float) -> None:
        from colibri_lab.experiments.loadgen import Target

        t = Target(self.base_url, self.model_id)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServerStartError(f"{self.kind} server exited with code {self.proc.returncode}: "
                                       f"{' '.join(self.cmd)}\n{self.log_tail()}")
            try:
                status, _ = t.get(probe, timeout=2.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerStartError(f"{self.kind} server did not answer {probe} within {timeout:.0f} s: "
                               f"{' '.join(self.cmd)}\n{self.log_tail()}")


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the thread that started
    it dies, so a crashed notebook kernel or Dask worker leaves no server behind."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))   # PR_SET_PDEATHSIG
    except Exception:
        pass


def share_scheduling_group(pid: int) -> bool:
    """Give process `pid` the CPU weight of this process's scheduling group.

    With autogroup scheduling (Linux, /proc/sys/kernel/sched_autogroup_enabled)
    every session is a group weighed like any other, whatever its processes'
    nice values; a child started in a session of its own (a server here, a
    Jupyter kernel) is then a group at nice 0 even when this one was given
    more weight (`echo -15 > /proc/self/autogroup` in a benchmark's session), and
    another session's nice-19 build takes a core from its threads.  Returns
    whether the weight was set (False where there is no autogroup)."""
    try:
        mine = Path("/proc/self/autogroup").read_text().split()
        nice = int(mine[mine.index("nice") + 1])
        Path(f"/proc/{int(pid)}/autogroup").write_text(str(nice))
        return True
    except (OSError, ValueError, IndexError):
        return False


def _spawn(srv: ServerProcess, env: dict | None = None) -> None:
    fd, srv.log_path = tempfile.mkstemp(prefix=f"colibri-{srv.kind}-server-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        # own session: a Ctrl-C meant for the notebook does not reach the server (stop() ends it)
        srv.proc = subprocess.Popen(srv.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True,
                                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    share_scheduling_group(srv.proc.pid)   # its own session, this one's CPU weight


def _package_env() -> dict:
    """This process's environment with the colibri_lab source on PYTHONPATH
    (so the child imports the same package, installed or not)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def start_colibri(model: str = "smollm2", n_threads: int = 0, n_ctx: int = 2048, n_slots: int = 4, *,
                  model_id: str | None = None, args: list[str] | None = None, port: int | None = None,
                  startup_timeout_s: float = 300.0, python: str | None = None, **engine) -> ServerProcess:
    """Start `python -m colibri_lab.serve` on loopback; returns when /health answers 200.
    Engine settings beyond threads/context/slots: simd (others are refused)."""
    import colibri_lab

    path = resolve_model(model)
    mid = model_id or (Path(str(model)).stem if os.sep in str(model) else str(model))
    port = port or free_port()
    cmd = [python or sys.executable, "-m", "colibri_lab.serve", "--model", str(path), "--host", "127.0.0.1",
           "--port", str(port), "--threads", str(int(n_threads)), "--ctx", str(int(n_ctx)),
           "--slots", str(int(n_slots)), "--model-id", mid]
    simd = engine.pop("simd", None)
    if simd:
        cmd += ["--simd", str(simd)]
    unknown = set(engine) - {"prefix_reuse"}
    if unknown:
        raise ValueError(f"engine setting(s) {', '.join(sorted(unknown))} cannot be passed to the server; "
                         "use serve.args for server flags")
    cmd += list(args or [])
    srv = ServerProcess("colibri", cmd, f"http://127.0.0.1:{port}", mid, str(path),
                        params={"n_threads": int(n_threads), "n_ctx": int(n_ctx), "n_slots": int(n_slots),
                                "simd": simd or "auto", "args": list(args or [])},
                        version=getattr(colibri_lab, "__version__", ""))
    _spawn(srv, _package_env())
    srv.wait_ready("/health", startup_timeout_s)
    try:   # the engine's actual params (threads resolved, SIMD path chosen)
        from colibri_lab.experiments.loadgen import Target

        status, body = Target(srv.base_url, mid).get("/health")
        if status == 200:
            srv.params["health"] = json.loads(body)
    except (OSError, ValueError):
        pass
    return srv


def llama_cpp_python(python: str | None = None) -> str:
    """The interpreter that runs llama.cpp's server: `python`, else
    $COLIBRI_LAB_LLAMA_PYTHON, else this one."""
    return python or os.environ.get(LLAMA_PYTHON_ENV) or sys.executable


def llama_cpp_unavailable(python: str | None = None) -> str:
    """"" when `python` can run llama-cpp-python's server, else the reason it cannot."""
    py = llama_cpp_python(python)
    if not Path(py).exists():
        return f"no interpreter at {py} (set {LLAMA_PYTHON_ENV} to a python with llama-cpp-python[server])"
    try:
        out = subprocess.run([py, "-c", "import llama_cpp, llama_cpp.server.app, uvicorn; print(llama_cpp.__version__)"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{py} cannot run: {exc}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return (f"llama.cpp's server is not installed for {py} ({last}); install the anchors extra "
                f"(pip install 'colibri-lab[anchors]') or set {LLAMA_PYTHON_ENV}")
    return ""


def llama_cpp_version(python: str | None = None) -> str:
    out = subprocess.run([llama_cpp_python(python), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


def start_llama_cpp(model: str = "smollm2", n_threads: int = 0, n_ctx: int = 2048, n_slots: int = 1, *,
                    model_id: str | None = None, args: list[str] | None = None, port: int | None = None,
                    startup_timeout_s: float = 300.0, python: str | None = None, **engine) -> ServerProcess:
    """Start llama-cpp-python's OpenAI-compatible server on loopback on the
    same GGUF file with the same threads (0 = all cores, as ours) and
    context; returns when /v1/models answers.  Raises AnchorUnavailable when
    the interpreter lacks it.  n_slots and the engine's other settings do
    not apply (it runs one sequence)."""
    py = llama_cpp_python(python)
    why = llama_cpp_unavailable(py)
    if why:
        raise AnchorUnavailable(why)
    path = resolve_model(model)
    mid = model_id or (Path(str(model)).stem if os.sep in str(model) else str(model))
    threads = int(n_threads) or (os.cpu_count() or 1)
    port = port or free_port()
    cmd = llama_anchor.server_command(py, [
        "--model", str(path), "--model_alias", mid, "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", str(int(n_ctx)),
        "--interrupt_requests", "False"] + list(args or []))
    srv = ServerProcess("llama.cpp", cmd, f"http://127.0.0.1:{port}", mid, str(path),
                        params={"n_threads": threads, "n_ctx": int(n_ctx), "n_slots": 1,
                                "interrupt_requests": False, "use_extra_bufts": llama_anchor.extra_bufts(),
                                "args": list(args or [])},
                        version="llama-cpp-python " + llama_cpp_version(py))
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)       # its own environment, not ours
    _spawn(srv, env)
    srv.wait_ready("/v1/models", startup_timeout_s)
    return srv


STARTERS = {"colibri": start_colibri, "llama.cpp": start_llama_cpp}
