"""colibri-lab: measure LLM inference optimizations on a fast C engine.

    >>> from colibri_lab import Engine
    >>> eng = Engine("smollm2")
    >>> eng.generate("The capital of France is", max_tokens=8).text
"""
from colibri_lab.errors import (  # noqa: F401
    ColibriError,
    ContextLengthExceededError,
    EngineError,
    InvalidRequestError,
    ModelLoadError,
    ModelNotFoundError,
    QueueFullError,
    UnsupportedModelError,
)

__version__ = "0.1.0"


def __getattr__(name):
    # Import the engine lazily so that pure-Python parts (models, chat,
    # tokenizer, plots) work without the compiled extension.
    if name in ("Engine", "Completion"):
        from colibri_lab import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'colibri_lab' has no attribute {name!r}")
