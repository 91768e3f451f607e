"""Turning an API request into engine submissions: chat prompts (with tools
shown to templates that cannot render them), the context budget, sampling
keywords, the grammar, and the `speculative` extension."""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from colibri_lab.errors import InvalidRequestError
from colibri_lab.params import RequestParams, Speculative

from .body import Body, logit_bias, seed_value
from .errors import ApiError, bad
from .grammars import schema_grammar
from .tools import TOOL_NAME, tool_call_schema, tool_call_text, tool_system_text


@dataclass
class ToolMode:
    tools: list = field(default_factory=list)   # [{"name", "description", "parameters"}]
    choice: str = "none"                        # none | auto | required | named
    name: str | None = None                     # the forced tool for choice == "named"
    parallel: bool = True                       # a list of calls allowed / produced when forced

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        return self.active and self.choice in ("required", "named")

    def grammar(self, engine, param: str) -> str | None:
        if not self.forced:
            return None
        schema = tool_call_schema(self.tools, self.name if self.choice == "named" else None,
                                  self.parallel and self.choice == "required")
        return schema_grammar(engine, schema, param)


def check_tool(name, params, where: str) -> None:
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise bad(f"{where}.name must be 1-64 characters of a-z, A-Z, 0-9, _, . and -", param=f"{where}.name")
    if params is not None and not isinstance(params, dict):
        raise bad(f"{where}: the parameters schema must be an object", param=where)


def chat_prompt_ids(engine, messages: list, tm: ToolMode) -> list[int]:
    """Render the chat template.  Templates that do not mention `tools` get the
    tool list in the system message; templates that do not mention `tool_calls`
    see earlier calls as the JSON the model is asked to produce."""
    tmpl = engine.chat_template or ""
    native_tools = "tools" in tmpl
    native_calls = "tool_calls" in tmpl
    msgs = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls") and not native_calls:
            calls = []
            for c in m["tool_calls"]:
                fn = c.get("function", {}) if isinstance(c, dict) else {}
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except ValueError:
                        pass
                calls.append({"name": fn.get("name"), "arguments": args})
            text = tool_call_text(calls)
            m["content"] = (m["content"] + "\n" + text) if isinstance(m.get("content"), str) and m["content"] else text
            del m["tool_calls"]
        if m.get("role") == "tool" and not native_calls:
            m = {"role": "tool", "content": m.get("content") if m.get("content") is not None else ""}
        msgs.append(m)
    tools_arg = None
    if tm.active:
        if native_tools:
            tools_arg = [{"type": "function", "function": {"name": t["name"], "description": t.get("description") or "",
                                                           "parameters": t["parameters"] or {"type": "object"}}}
                         for t in tm.tools]
        else:
            text = tool_system_text(tm.tools)
            if msgs and msgs[0].get("role") in ("system", "developer") and isinstance(msgs[0].get("content"), str):
                msgs[0] = dict(msgs[0], content=msgs[0]["content"] + "\n\n" + text)
            else:
                msgs.insert(0, {"role": "system", "content": text})
    try:
        prompt = engine.apply_chat_template(msgs, tools=tools_arg)
    except InvalidRequestError as e:
        raise bad(str(e), param="messages") from None
    return tokenize(engine, prompt, "messages", add_special=False)


_MAX_TOKEN_BYTES: dict = {}


def max_token_bytes(engine) -> int:
    """The longest token of the vocabulary, in bytes (computed once per model)."""
    key = id(engine.model)
    n = _MAX_TOKEN_BYTES.get(key)
    if n is None:
        m = engine.model
        n = max(1, max(len(m.token_bytes(t)) for t in range(int(engine.info["n_vocab"]))))
        _MAX_TOKEN_BYTES[key] = n
    return n


def tokenize(engine, text: str, param: str, add_special=None) -> list[int]:
    """Tokenize request text, refusing at once a text that cannot fit in the
    context: a token covers at most max_token_bytes bytes, so a text of B bytes
    has at least B / max_token_bytes tokens.  Tokenizing the 4 MiB a body may
    hold costs seconds of CPU that a context_length_exceeded answer need not."""
    n_ctx = int(engine.params["n_ctx"])
    n_bytes = len(text.encode("utf-8"))
    least = -(-n_bytes // max_token_bytes(engine))
    if least >= n_ctx:
        raise ApiError(400, f"This model's maximum context length is {n_ctx} tokens, but the {param} text has "
                            f"{n_bytes} bytes, at least {least} tokens.", param=param,
                       code="context_length_exceeded")
    return engine.tokenize(text, add_special=add_special)


def derived_conversation(engine, messages: list) -> str | None:
    """The slot-pinning key for a chat without an explicit `conversation`:
    derived from the leading messages, but only for a follow-up turn (one that
    holds an assistant message).  First turns are left unpinned so unrelated
    clients that happen to open with the same messages are not serialized on
    one slot; the engine already prefers the slot with the longest prefix."""
    if any(m.get("role") == "assistant" for m in messages):
        return engine.conversation_key(messages)
    return None


def budget(engine, n_prompt: int, max_tokens: int | None, param: str = "messages") -> int:
    """Completion budget: the request's max_tokens, clamped to the room left in a
    slot's context (finish_reason 'length' when reached); a prompt that leaves no
    room is a 400 context_length_exceeded."""
    n_ctx = int(engine.params["n_ctx"])
    room = n_ctx - n_prompt
    if room < 1:
        raise ApiError(400, f"This model's maximum context length is {n_ctx} tokens, but the prompt has "
                            f"{n_prompt} tokens, which leaves no room for a completion.",
                       param=param, code="context_length_exceeded")
    return room if max_tokens is None else min(max_tokens, room)


def speculative(engine, v) -> dict | None:
    """The `speculative` extension object: RequestParams' speculative settings
    {"sources": [...] | str, "k_max", "adaptive", "ngram_max", "ngram_min"}
    plus "enabled" (false: off).  Returns the settings, or None when absent or
    off; the bounds are RequestParams' (checked when the request is built)."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad("speculative must be an object", param="speculative")
    enabled = v.get("enabled", True)
    if not isinstance(enabled, bool):
        raise bad("speculative.enabled must be a boolean", param="speculative.enabled")
    out = {k: val for k, val in v.items() if k != "enabled"}
    try:
        sp = Speculative.of(out)
    except InvalidRequestError as e:
        raise bad(str(e), param=getattr(e, "param", "speculative")) from None
    if not enabled or not sp.sources:
        return None
    return out


def sampling(b: Body, engine, *, default_temperature: float = 1.0, openai: bool = True) -> dict:
    """RequestParams sampling fields from the common body fields.  Types are
    checked here (with the API's field names); the bounds are RequestParams'
    own, the same for every route and for Engine.  An absent temperature is
    the API's default (1.0), not the engine's greedy 0."""
    kw = {}
    t = b.num("temperature", default_temperature)
    kw["temperature"] = t
    kw["top_p"] = b.num("top_p", 1.0)
    kw["top_k"] = b.int("top_k", 0)
    if openai:
        kw["min_p"] = b.num("min_p", 0.0)
        kw["presence_penalty"] = b.num("presence_penalty", 0.0)
        kw["frequency_penalty"] = b.num("frequency_penalty", 0.0)
        kw["repeat_penalty"] = b.num("repeat_penalty", 1.0)
        bias = logit_bias(b.raw("logit_bias"), "logit_bias", int(engine.info["n_vocab"]))
        if bias:
            kw["logit_bias"] = bias
    seed = seed_value(b.raw("seed")) if openai else None
    if seed is None:
        seed = secrets.randbits(63) if t > 0 else 0
    kw["seed"] = seed
    return kw


def request_params(kw: dict) -> None:
    """Check a request's settings against RequestParams now, before anything
    is submitted, as a 400 naming the field."""
    try:
        RequestParams.from_kwargs(**{k: v for k, v in kw.items() if k in RequestParams.NAMES})
    except InvalidRequestError as e:
        raise bad(str(e), param=getattr(e, "param", None)) from None


def choice_seeds(kw: dict, n: int) -> list[dict]:
    """n copies of the sampling keywords with seeds seed, seed+1, ... so the
    choices differ when sampling and each stays reproducible."""
    out = []
    for i in range(n):
        d = dict(kw)
        d["seed"] = (kw["seed"] + i) % (1 << 64)
        out.append(d)
    return out


def extension_grammar(b: Body, engine) -> str | None:
    g = b.str("grammar")
    if g is None:
        return None
    if not g.strip():
        raise bad("grammar must not be empty", param="grammar")
    from .limits import MAX_GRAMMAR_BYTES
    if len(g.encode("utf-8")) > MAX_GRAMMAR_BYTES:
        raise bad(f"grammar is {len(g.encode('utf-8'))} bytes; the limit is {MAX_GRAMMAR_BYTES}", param="grammar",
                  code="grammar_too_large")
    return g
