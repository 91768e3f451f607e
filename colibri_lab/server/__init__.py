"""The stdlib-only HTTP server: OpenAI- and Anthropic-compatible endpoints over an Engine.

    from colibri_lab.server import Server
    srv = Server(engine, port=0).start(); print(srv.url); srv.stop()

`python -m colibri_lab.serve` is the command-line entry (see colibri_lab/serve.py).
"""
from .http import Server, ServerConfigError, is_loopback  # noqa: F401

__all__ = ["Server", "ServerConfigError", "is_loopback"]
