"""Typed exceptions.  Every error the engine reports surfaces as one of these,
with a message that names what was wrong."""


class ColibriError(Exception):
    """Base class for every colibri-lab error."""


class ModelLoadError(ColibriError):
    """A model file could not be opened, or is not a valid GGUF file."""


class UnsupportedModelError(ModelLoadError):
    """A well-formed GGUF file that uses an architecture or tensor type the engine lacks."""


class ModelNotFoundError(ColibriError):
    """An alias that is not registered, or a model that cannot be fetched."""


class InvalidRequestError(ColibriError, ValueError):
    """A parameter out of range or of the wrong type."""


class GrammarError(InvalidRequestError):
    """A GBNF grammar or JSON schema that cannot be compiled (the message names line and column)."""


class SchemaError(GrammarError):
    """A JSON Schema that uses a keyword or construct the converter does not support,
    or that admits no value (the message names the keyword and its JSON pointer)."""


class ContextLengthExceededError(InvalidRequestError):
    """The prompt plus completion does not fit in the context window."""


class QueueFullError(ColibriError):
    """The scheduler's bounded queue is full; retry later."""


class EngineError(ColibriError):
    """The engine failed while running a request."""
