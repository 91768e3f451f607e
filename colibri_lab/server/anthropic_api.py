"""Anthropic-compatible /v1/messages.

Accepted: model, messages, max_tokens (required), system (string or text
blocks), stop_sequences, stream, temperature, top_p, top_k (older SDKs send
them; current ones only through extra_body), tools, tool_choice,
output_config.format (json_schema -> grammar-constrained output; `effort`
is accepted and ignored), thinking only as {"type": "disabled"}.  Accepted
and ignored because they do not change the output here: metadata,
service_tier, cache_control, inference_geo, speed, user_profile_id,
workspace_id.  Extensions: grammar, speculative, conversation, lenient (as on
chat completions: `schema_ignored`).  Content blocks: text, tool_use, tool_result
(`cache_control` on a block is accepted and ignored).  Anything else is a 400
naming it.
"""
from __future__ import annotations

import json

from colibri_lab import metrics as schema

from .body import Body, check_keys, stop_list
from .errors import ApiError, bad
from .grammars import schema_grammar
from .ids import new_id
from .tools import parse_tool_calls
from .usage import timings
from . import convert, prep
from .gen import ClientGone, Generation, Spec, drive, map_engine_error
from .openai_api import ChoiceStream, check_model

IGNORED = {"metadata", "service_tier", "cache_control", "inference_geo", "speed", "user_profile_id", "workspace_id"}
FIELDS = {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
          "top_k", "tools", "tool_choice", "output_config", "thinking", "grammar", "speculative", "conversation",
          "lenient"}
_BLOCK_EXTRA = {"cache_control", "citations"}


def _text_blocks(v, where: str) -> str:
    if isinstance(v, str):
        return v
    if not isinstance(v, list):
        raise bad(f"{where} must be a string or an array of text blocks", param=where)
    parts = []
    for k, blk in enumerate(v):
        w = f"{where}[{k}]"
        if not isinstance(blk, dict) or blk.get("type") != "text" or not isinstance(blk.get("text"), str):
            raise bad(f"{w} must be a text block {{\"type\": \"text\", \"text\": ...}}", param=w)
        check_keys(blk, {"type", "text"} | _BLOCK_EXTRA, w)
        parts.append(blk["text"])
    return "\n".join(parts)


def convert_messages(system, messages) -> list[dict]:
    """Anthropic messages -> OpenAI-style messages for the chat template."""
    out = []
    if system is not None:
        out.append({"role": "system", "content": _text_blocks(system, "system")})
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty array", param="messages")
    for i, m in enumerate(messages):
        w = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{w} must be an object", param=w)
        check_keys(m, {"role", "content"}, w)
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise bad(f"{w}.role must be 'user' or 'assistant', got {role!r}", param=f"{w}.role")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"{w}.content must be a string or an array of content blocks", param=f"{w}.content")
        texts, calls, results = [], [], []
        for k, blk in enumerate(content):
            bw = f"{w}.content[{k}]"
            if not isinstance(blk, dict):
                raise bad(f"{bw} must be an object", param=bw)
            t = blk.get("type")
            if t == "text":
                check_keys(blk, {"type", "text"} | _BLOCK_EXTRA, bw)
                if not isinstance(blk.get("text"), str):
                    raise bad(f"{bw}.text must be a string", param=f"{bw}.text")
                texts.append(blk["text"])
            elif t == "tool_use" and role == "assistant":
                check_keys(blk, {"type", "id", "name", "input"} | _BLOCK_EXTRA, bw)
                if not isinstance(blk.get("name"), str) or not isinstance(blk.get("input", {}), dict):
                    raise bad(f"{bw} needs a string name and an object input", param=bw)
                calls.append({"id": str(blk.get("id", "")), "type": "function",
                              "function": {"name": blk["name"], "arguments": json.dumps(blk.get("input", {}))}})
            elif t == "tool_result" and role == "user":
                check_keys(blk, {"type", "tool_use_id", "content", "is_error"} | _BLOCK_EXTRA, bw)
                c = blk.get("content", "")
                text = _text_blocks(c, f"{bw}.content") if c is not None else ""
                if blk.get("is_error"):
                    text = "Error: " + text
                results.append({"role": "tool", "tool_call_id": str(blk.get("tool_use_id", "")), "content": text})
            else:
                raise bad(f"{bw}: content block type {t!r} is not supported in a {role} message", param=f"{bw}.type")
        out.extend(results)
        if role == "assistant":
            msg = {"role": "assistant", "content": "\n".join(texts) if texts else None}
            if calls:
                msg["tool_calls"] = calls
            elif msg["content"] is None:
                msg["content"] = ""
            out.append(msg)
        elif texts or not results:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tools(b: Body) -> prep.ToolMode:
    tools = b.list("tools")
    choice = b.obj("tool_choice")
    if not tools:
        if choice is not None and choice.get("type") not in ("auto", "none"):
            raise bad("tool_choice needs tools", param="tool_choice")
        return prep.ToolMode()
    from .limits import MAX_TOOLS
    if len(tools) > MAX_TOOLS:
        raise bad(f"at most {MAX_TOOLS} tools", param="tools")
    norm = []
    for i, t in enumerate(tools):
        w = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad(f"{w} must be an object", param=w)
        if t.get("type") not in (None, "custom"):
            raise bad(f"{w}: server tools ({t.get('type')!r}) are not supported", param=f"{w}.type")
        check_keys(t, {"type", "name", "description", "input_schema", "cache_control"}, w)
        prep.check_tool(t.get("name"), t.get("input_schema"), w)
        norm.append({"name": t["name"], "description": t.get("description") or "",
                     "parameters": t.get("input_schema")})
    if len({t["name"] for t in norm}) != len(norm):
        raise bad("tools: names must be unique", param="tools")
    tm = prep.ToolMode(tools=norm, choice="auto")
    if choice is not None:
        check_keys(choice, {"type", "name", "disable_parallel_tool_use"}, "tool_choice")
        kind = choice.get("type")
        dp = choice.get("disable_parallel_tool_use", False)
        if not isinstance(dp, bool):
            raise bad("tool_choice.disable_parallel_tool_use must be a boolean", param="tool_choice")
        tm.parallel = not dp
        if kind == "auto":
            pass
        elif kind == "none":
            tm.choice = "none"
        elif kind == "any":
            tm.choice = "required"
        elif kind == "tool":
            if choice.get("name") not in {t["name"] for t in norm}:
                raise bad(f"tool_choice names tool {choice.get('name')!r}, which is not in tools",
                          param="tool_choice.name")
            tm.choice, tm.name = "named", choice["name"]
        else:
            raise bad("tool_choice.type must be 'auto', 'any', 'tool' or 'none'", param="tool_choice.type")
    return tm


def _output_format(engine, oc) -> str | None:
    if oc is None:
        return None
    check_keys(oc, {"effort", "format"}, "output_config")
    if oc.get("effort") not in (None, "low", "medium", "high", "xhigh", "max"):
        raise bad("output_config.effort must be low, medium, high, xhigh or max", param="output_config.effort")
    fmt = oc.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise bad("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                  param="output_config.format")
    check_keys(fmt, {"type", "schema"}, "output_config.format")
    return schema_grammar(engine, fmt.get("schema"), "output_config.format.schema")


def _usage(m: dict) -> dict:
    return schema.anthropic_usage(m)


def _stop_reason(reason: str, stop_sequence, calls) -> str:
    if calls:
        return "tool_use"
    if stop_sequence is not None:
        return "stop_sequence"
    if reason in ("length", "context"):
        return "max_tokens"
    return "end_turn"


def messages(ctx, data) -> None:
    srv, engine = ctx.srv, ctx.engine
    b = Body(data, FIELDS, IGNORED)
    model = check_model(srv, b)
    convert.set_lenient(b.bool("lenient", False))
    if not b.has("max_tokens"):
        raise bad("max_tokens is required", param="max_tokens")
    mt = b.int("max_tokens", None, 1)
    msgs = convert_messages(b.raw("system"), b.raw("messages"))
    stream = b.bool("stream", False)
    tm = _tools(b)
    kw = prep.sampling(b, engine, openai=False)
    stops = stop_list(b.raw("stop_sequences"), "stop_sequences", 8)
    spec = prep.speculative(engine, b.raw("speculative"))
    if spec is not None:
        kw["speculative"] = spec
    prep.request_params(dict(kw, stop=stops))
    th = b.obj("thinking")
    if th is not None and th != {"type": "disabled"}:
        raise bad("thinking is not supported by this server (only {\"type\": \"disabled\"})", param="thinking")
    gs = [g for g in (prep.extension_grammar(b, engine), _output_format(engine, b.obj("output_config")),
                      tm.grammar(engine, "tool_choice")) if g is not None]
    if len(gs) > 1:
        raise bad("grammar, output_config.format and a forced tool_choice cannot be combined", param="grammar")
    if gs:
        kw["grammar"] = gs[0]
    ids = prep.chat_prompt_ids(engine, msgs, tm)
    max_tokens = prep.budget(engine, len(ids), mt)
    conv = b.str("conversation") or prep.derived_conversation(engine, msgs)
    kw.update(max_tokens=max_tokens, stop=stops, conversation=conv)
    gen = Generation(engine, [Spec(0, ids, kw)], srv.metrics.record)
    mid = new_id("msg_")
    if stream:
        return _stream(ctx, gen, mid, model, tm, len(ids))
    r = gen.collect(ctx.gone)[0]
    calls = parse_tool_calls(r.text, tm.tools) if tm.active else None
    if calls:
        content = [{"type": "tool_use", "id": new_id("toolu_"), "name": c["name"], "input": c["arguments"]}
                   for c in calls]
    else:
        content = [{"type": "text", "text": r.text}]
    out = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
           "stop_reason": _stop_reason(r.finish_reason, r.stop_sequence, calls),
           "stop_sequence": r.stop_sequence, "usage": _usage(r.metrics), "timings": timings(r.metrics)}
    if convert.ignored() is not None:
        out["schema_ignored"] = convert.ignored()
    ctx.send_json(200, out)


COUNT_FIELDS = {"model", "messages", "system", "tools", "tool_choice", "thinking"}


def count_tokens(ctx, data) -> None:
    """POST /v1/messages/count_tokens: the prompt tokens a /v1/messages request
    with these messages, system prompt and tools would have, chat template and
    tool instructions included ({"input_tokens": n})."""
    srv, engine = ctx.srv, ctx.engine
    b = Body(data, COUNT_FIELDS, IGNORED | {"max_tokens"})
    check_model(srv, b)
    msgs = convert_messages(b.raw("system"), b.raw("messages"))
    tm = _tools(b)
    th = b.obj("thinking")
    if th is not None and th != {"type": "disabled"}:
        raise bad("thinking is not supported by this server (only {\"type\": \"disabled\"})", param="thinking")
    ids = prep.chat_prompt_ids(engine, msgs, tm)
    ctx.send_json(200, {"input_tokens": len(ids)})


def _stream(ctx, gen, mid, model, tm, n_prompt) -> None:
    st = ChoiceStream(tm)
    block = {"index": -1, "open": False}   # current content block
    failed = []

    def ev(name, obj):
        obj = dict(type=name, **obj)
        ctx.sse(obj, event=name)

    def open_text():
        if not block["open"]:
            block["index"] += 1
            block["open"] = True
            ev("content_block_start", {"index": block["index"], "content_block": {"type": "text", "text": ""}})

    def close():
        if block["open"]:
            ev("content_block_stop", {"index": block["index"]})
            block["open"] = False

    def text(t):
        open_text()
        ev("content_block_delta", {"index": block["index"], "delta": {"type": "text_delta", "text": t}})

    try:
        ctx.start_sse()
        ev("message_start", {"message": {"id": mid, "type": "message", "role": "assistant", "model": model,
                                         "content": [], "stop_reason": None, "stop_sequence": None,
                                         "usage": _usage({"prompt_tokens": n_prompt})}})
        if st.state == "text":
            open_text()
        ev("ping", {})
        if st.state == "text":   # no tools: a token's event is its text alone, the scheduler thread writes it
            gen.write_tokens_directly(0, _delta_bytes(block["index"]), ctx.try_write)

        def on_event(i, e):
            if "error" in e:
                failed.append(e["error"])
                raise _Abort()
            out = st.feed(e["text"]) if e["text"] else ""
            if out:
                text(out)
            if e.get("done"):
                rest, calls = st.finish()
                if rest:
                    text(rest)
                if calls:
                    close()
                    for c in calls:
                        block["index"] += 1
                        ev("content_block_start", {"index": block["index"], "content_block": {
                            "type": "tool_use", "id": new_id("toolu_"), "name": c["name"], "input": {}}})
                        ev("content_block_delta", {"index": block["index"], "delta": {
                            "type": "input_json_delta", "partial_json": json.dumps(c["arguments"], ensure_ascii=False)}})
                        ev("content_block_stop", {"index": block["index"]})
                elif block["index"] < 0:
                    open_text()
                close()
                r = gen.results[0]
                ev("message_delta", {"delta": {"stop_reason": _stop_reason(e["finish_reason"], r.stop_sequence, calls),
                                               "stop_sequence": r.stop_sequence},
                                     "usage": dict(_usage(e["metrics"])), "timings": timings(e["metrics"])})
                ev("message_stop", {})

        try:
            drive(ctx, gen, on_event)
        except _Abort:
            gen.cancel()
            err = failed[0]
            e = err if isinstance(err, ApiError) else map_engine_error(err)
            ctx.sse(e.anthropic(), event="error")
    except ClientGone:
        gen.cancel()


_MARK = "\x00text\x00"


def _delta_bytes(index: int):
    """text -> the SSE bytes of its content_block_delta event, character for character what
    ctx.sse writes for it, from a serialisation made once (one string escape per token)."""
    obj = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": _MARK}}
    head, _, tail = json.dumps(obj, ensure_ascii=False).rpartition(json.encoder.encode_basestring(_MARK))
    head = "event: content_block_delta\ndata: " + head
    tail += "\n\n"
    esc = json.encoder.encode_basestring
    return lambda text: (head + esc(text) + tail).encode("utf-8", "backslashreplace")


class _Abort(Exception):
    pass
