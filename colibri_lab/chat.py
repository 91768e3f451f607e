"""Chat templates: the GGUF's jinja2 template rendered the way HF transformers does.

``render`` reproduces ``transformers``' ``apply_chat_template`` environment: a
jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that
keeps non-ASCII text, and the globals ``raise_exception`` and ``strftime_now``.
The sandbox keeps a template (which comes from a downloaded file) away from
Python internals: ``{{ ''.__class__ }}`` renders nothing and anything built on
it raises.

Messages are checked before rendering: a list of dicts with a known ``role``
and ``content`` that is a string, a list of ``{"type": "text", "text": ...}``
parts (joined with newlines, as llama.cpp does for templates that expect plain
strings) or, for assistant messages that carry ``tool_calls``, None.

A GGUF without ``tokenizer.chat_template`` (Gemma-3-270M, a pretrained model,
has none) gets its family's turn format from ``BUILTIN_TEMPLATES``, chosen by
``general.architecture``, as llama.cpp falls back to its built-in templates.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InvalidRequestError

__all__ = ["render", "validate_messages", "template_from_metadata", "ROLES", "BUILTIN_TEMPLATES"]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class _GenerationTag(jinja2.ext.Extension):
    """Accept ``{% generation %}...{% endgeneration %}`` (used by some HF
    templates to mark assistant tokens for training masks): renders the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise InvalidRequestError(
            f"chat template syntax error at line {e.lineno}: {e.message}"
        ) from e


def _content_text(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise InvalidRequestError(
                    f"messages[{i}].content[{k}] must be an object, got {type(part).__name__}"
                )
            kind = part.get("type")
            if kind != "text":
                raise InvalidRequestError(
                    f"messages[{i}].content[{k}] has type {kind!r}; only 'text' parts are supported"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError(f"messages[{i}].content[{k}].text must be a string")
            texts.append(text)
        return "\n".join(texts)
    raise InvalidRequestError(
        f"messages[{i}].content must be a string or a list of text parts, "
        f"got {type(content).__name__}"
    )


def validate_messages(messages: Any) -> list[dict]:
    """Check ``messages`` and return normalized copies (content as a string).

    The caller's objects are not modified.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidRequestError(
            f"messages must be a list of message objects, got {type(messages).__name__}"
        )
    if not messages:
        raise InvalidRequestError("messages must not be empty")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequestError(
                f"messages[{i}].role must be one of {sorted(ROLES)}, got {role!r}"
            )
        m = dict(msg)
        if "content" not in msg or msg["content"] is None:
            if role == "assistant" and msg.get("tool_calls"):
                m["content"] = None  # templates test for it before use
            else:
                raise InvalidRequestError(f"messages[{i}] ({role}) has no content")
        else:
            m["content"] = _content_text(i, msg["content"])
        out.append(m)
    return out


def render(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: Sequence[Mapping[str, Any]] | None = None,
    **extra: Any,
) -> str:
    """Render a chat template into the prompt text.

    ``extra`` goes to the template as more variables (e.g. ``documents``,
    ``enable_thinking``).  Raises InvalidRequestError for bad messages, a
    template that does not parse, or one that fails while rendering
    (including the template's own ``raise_exception`` and sandbox violations).
    """
    if not isinstance(template, str) or not template:
        raise InvalidRequestError("chat template must be a non-empty string")
    msgs = validate_messages(messages)
    if tools is not None and (
        isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence)
    ):
        raise InvalidRequestError("tools must be a list of tool definitions")
    compiled = _compile(template)
    try:
        return compiled.render(
            messages=msgs,
            tools=list(tools) if tools is not None else None,
            add_generation_prompt=bool(add_generation_prompt),
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except jinja2.TemplateError as e:  # includes sandbox SecurityError
        raise InvalidRequestError(f"chat template error: {e}") from e
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
        # e.g. a template that concatenates content with something that is not a string
        raise InvalidRequestError(
            f"chat template failed while rendering: {type(e).__name__}: {e}"
        ) from e


# Gemma's turn format (what llama.cpp's built-in "gemma" template writes and
# Google's Gemma 3 template renders): BOS first; no system role, so a leading
# system message opens the first user turn, followed by a blank line; the
# assistant's role is "model"; each content is trimmed; turns alternate, user first.
_GEMMA = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = (messages[0]['content'] | trim) + '\n\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set prefix = '' -%}"
    "{%- set turns = messages -%}"
    "{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) or m['role'] not in ('user', 'assistant') -%}"
    "{{ raise_exception('Gemma turns must alternate user / assistant, starting with user "
    "(one optional system message first)') }}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' }}"
    "{{ (prefix if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

# general.architecture -> the chat template used when the file has none.
BUILTIN_TEMPLATES = {"gemma": _GEMMA, "gemma2": _GEMMA, "gemma3": _GEMMA}


def template_from_metadata(meta: Mapping[str, Any], name: str | None = None) -> str | None:
    """The GGUF's chat template (``tokenizer.chat_template``, or the named
    variant ``tokenizer.chat_template.<name>``); for a file without one, its
    architecture's entry in ``BUILTIN_TEMPLATES``; else None."""
    key = "tokenizer.chat_template" if name is None else f"tokenizer.chat_template.{name}"
    value = meta.get(key)
    if isinstance(value, str) and value:
        return value
    if name is None:
        return BUILTIN_TEMPLATES.get(meta.get("general.architecture"))
    return None
