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


# cb_status (native/include/colibri.h) -> exception, the one table.  Column 1:
# a call that failed (the binding raises it).  Column 2: an ERROR event, i.e.
# a request the engine accepted and that failed later: refused at admission
# for its length, or its grammar hit a dead end or outgrew the matcher's
# limits (FORMAT / UNSUPPORTED / ARG: the request's fault, a 400), or the
# engine failed (anything else).
STATUS = {
    -1: (ModelLoadError, EngineError),                            # CB_ERR_IO
    -2: (ModelLoadError, InvalidRequestError),                    # CB_ERR_FORMAT
    -3: (UnsupportedModelError, InvalidRequestError),             # CB_ERR_UNSUPPORTED
    -4: (EngineError, EngineError),                               # CB_ERR_NOMEM
    -5: (InvalidRequestError, InvalidRequestError),               # CB_ERR_ARG
    -6: (QueueFullError, EngineError),                            # CB_ERR_FULL
    -7: (ContextLengthExceededError, ContextLengthExceededError), # CB_ERR_CONTEXT
    -8: (KeyError, EngineError),                                  # CB_ERR_NOT_FOUND
    -9: (EngineError, EngineError),                               # CB_ERR_BUSY
}


def from_status(status, message: str, event: bool = False) -> Exception:
    """The exception for a negative cb_status from a call (event=False) or an
    ERROR event (event=True); EngineError for a status not in the table."""
    return STATUS.get(status, (EngineError, EngineError))[1 if event else 0](message)
