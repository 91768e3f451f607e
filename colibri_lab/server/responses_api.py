"""OpenAI's Responses API: POST /v1/responses (`client.responses.create`,
`.stream`, `.parse`), streaming and not.

Accepted: model, input (a string, or message items with input_text /
output_text parts, function_call and function_call_output items),
instructions (a system message before the input), max_output_tokens,
temperature, top_p, tools (function tools), tool_choice,
parallel_tool_calls, text.format (text, json_object, json_schema ->
grammar-constrained output), stream, store (responses are never stored here,
so previous_response_id is refused), truncation "disabled", metadata (echoed).
Extensions as on chat completions: top_k, min_p, repeat_penalty, seed,
speculative, conversation, lenient (`schema_ignored`).  Anything else is a
400 naming it.

A stream is the event sequence OpenAI sends: response.created,
response.in_progress, then per output item response.output_item.added,
(message) response.content_part.added, response.output_text.delta...,
response.output_text.done, response.content_part.done, or (function call)
response.function_call_arguments.delta / .done, then
response.output_item.done; last response.completed (or response.incomplete
when max_output_tokens cut it).  Every event carries a sequence_number.
Without tools, the message item opens before the first token and each
output_text.delta is written by the scheduler thread itself, as chat
completions and Anthropic messages are (gen.Generation.write_tokens_directly);
its sequence number is taken when its bytes are built.
"""
from __future__ import annotations

import json
import re

from colibri_lab import metrics as schema

from .body import Body, check_keys
from .errors import ApiError, bad, safe_text
from .grammars import json_object_grammar, schema_grammar
from .ids import new_id, now
from .tools import parse_tool_calls
from .usage import timings
from . import convert, prep
from .gen import ClientGone, Generation, Spec, drive, map_engine_error
from .openai_api import ChoiceStream, check_model

IGNORED = {"user", "service_tier", "safety_identifier", "prompt_cache_key"}
FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
          "parallel_tool_calls", "text", "stream", "store", "metadata", "truncation", "previous_response_id",
          "include", "reasoning", "top_logprobs", "max_tool_calls", "background",
          "top_k", "min_p", "repeat_penalty", "seed", "speculative", "conversation", "lenient"}
_PART_TEXT = {"user": "input_text", "system": "input_text", "developer": "input_text", "assistant": "output_text"}
_ITEM_EXTRA = {"id", "status"}


# ------------------------------------------------------------------- input
def _content(c, role: str, w: str) -> str:
    if isinstance(c, str):
        return c
    if not isinstance(c, list):
        raise bad(f"{w} must be a string or an array of content parts", param=w)
    want = _PART_TEXT[role]
    texts = []
    for k, part in enumerate(c):
        pw = f"{w}[{k}]"
        if not isinstance(part, dict) or part.get("type") not in (want, "refusal" if role == "assistant" else want):
            got = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad(f"{pw}: content part type {got!r} is not supported in a {role} message (use {want!r})",
                      param=f"{pw}.type")
        if part["type"] == "refusal":
            check_keys(part, {"type", "refusal"}, pw)
            texts.append(str(part.get("refusal") or ""))
            continue
        check_keys(part, {"type", "text", "annotations", "logprobs"}, pw)
        if not isinstance(part.get("text"), str):
            raise bad(f"{pw}.text must be a string", param=f"{pw}.text")
        texts.append(part["text"])
    return "".join(texts)


def input_messages(instructions, inp) -> list[dict]:
    """Responses input (+ instructions) -> chat messages for the template."""
    out = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions must be a string", param="instructions")
        out.append({"role": "system", "content": instructions})
    if isinstance(inp, str):
        if not inp:
            raise bad("input must not be empty", param="input")
        out.append({"role": "user", "content": inp})
        return out
    if not isinstance(inp, list) or not inp:
        raise bad("input must be a string or a non-empty array of input items", param="input")
    pending: dict[str, str] = {}    # call_id -> name of calls not yet answered
    for i, it in enumerate(inp):
        w = f"input[{i}]"
        if not isinstance(it, dict):
            raise bad(f"{w} must be an object", param=w)
        kind = it.get("type", "message")
        if kind == "message":
            check_keys(it, {"type", "role", "content"} | _ITEM_EXTRA, w)
            role = it.get("role")
            if role not in _PART_TEXT:
                raise bad(f"{w}.role must be user, assistant, system or developer, got "
                          f"{safe_text(repr(role))[:40]}", param=f"{w}.role")
            if pending:
                raise bad(f"{w}: function calls {', '.join(pending)} have no function_call_output item",
                          param=w)
            out.append({"role": role, "content": _content(it.get("content"), role, f"{w}.content")})
        elif kind == "function_call":
            check_keys(it, {"type", "call_id", "name", "arguments"} | _ITEM_EXTRA, w)
            for k in ("call_id", "name", "arguments"):
                if not isinstance(it.get(k), str) or (k != "arguments" and not it[k]):
                    raise bad(f"{w}.{k} must be a string", param=f"{w}.{k}")
            call = {"id": it["call_id"], "type": "function",
                    "function": {"name": it["name"], "arguments": it["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls") is not None:
                last["tool_calls"].append(call)   # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            pending[it["call_id"]] = it["name"]
        elif kind == "function_call_output":
            check_keys(it, {"type", "call_id", "output"} | _ITEM_EXTRA, w)
            cid = it.get("call_id")
            if not isinstance(cid, str) or cid not in pending:
                raise bad(f"{w}.call_id must name an earlier function_call item that has no output yet",
                          param=f"{w}.call_id")
            outp = it.get("output")
            if not isinstance(outp, str):
                outp = _content(outp, "user", f"{w}.output") if isinstance(outp, list) else None
                if outp is None:
                    raise bad(f"{w}.output must be a string", param=f"{w}.output")
            del pending[cid]
            out.append({"role": "tool", "tool_call_id": cid, "content": outp})
        else:
            raise bad(f"{w}: input item type {safe_text(repr(kind))[:40]} is not supported", param=f"{w}.type")
    if pending:
        raise bad(f"no function_call_output item for function call(s) {', '.join(pending)}", param="input")
    if not any(m["role"] != "system" for m in out):
        raise bad("input must hold at least one message", param="input")
    return out


def _tools(b: Body) -> prep.ToolMode:
    tools = b.list("tools")
    choice = b.raw("tool_choice")
    parallel = b.bool("parallel_tool_calls", True)
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice needs tools", param="tool_choice")
        return prep.ToolMode()
    from .limits import MAX_TOOLS
    if len(tools) > MAX_TOOLS:
        raise bad(f"at most {MAX_TOOLS} tools", param="tools")
    norm = []
    for i, t in enumerate(tools):
        w = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            got = t.get("type") if isinstance(t, dict) else None
            raise bad(f"{w}: only function tools are supported, got {safe_text(repr(got))[:40]}",
                      param=f"{w}.type")
        check_keys(t, {"type", "name", "description", "parameters", "strict"}, w)
        prep.check_tool(t.get("name"), t.get("parameters"), w)
        norm.append({"name": t["name"], "description": t.get("description") or "", "parameters": t.get("parameters")})
    if len({t["name"] for t in norm}) != len(norm):
        raise bad("tools: function names must be unique", param="tools")
    tm = prep.ToolMode(tools=norm, choice="auto", parallel=parallel)
    if choice is None or choice == "auto":
        pass
    elif choice in ("none", "required"):
        tm.choice = choice
    elif isinstance(choice, dict) and choice.get("type") == "function":
        check_keys(choice, {"type", "name"}, "tool_choice")
        if choice.get("name") not in {t["name"] for t in norm}:
            raise bad(f"tool_choice names function {safe_text(repr(choice.get('name')))[:64]}, which is not "
                      f"in tools", param="tool_choice.name")
        tm.choice, tm.name = "named", choice["name"]
    else:
        raise bad("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
                  param="tool_choice")
    return tm


def _text_format(engine, text) -> tuple[str | None, dict]:
    """text.format -> (GBNF or None, the format echoed in the response)."""
    if text is None:
        return None, {"type": "text"}
    if not isinstance(text, dict):
        raise bad("text must be an object", param="text")
    check_keys(text, {"format", "verbosity"}, "text")
    if text.get("verbosity") not in (None, "medium"):
        raise bad("text.verbosity other than 'medium' is not supported", param="text.verbosity")
    fmt = text.get("format")
    if fmt is None:
        return None, {"type": "text"}
    if not isinstance(fmt, dict):
        raise bad("text.format must be an object", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        check_keys(fmt, {"type"}, "text.format")
        return None, fmt
    if kind == "json_object":
        check_keys(fmt, {"type"}, "text.format")
        return json_object_grammar(engine, "text.format"), fmt
    if kind == "json_schema":
        check_keys(fmt, {"type", "name", "schema", "strict", "description"}, "text.format")
        name = fmt.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise bad("text.format.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -", param="text.format.name")
        if "schema" not in fmt:
            raise bad("text.format.schema is required", param="text.format.schema")
        return schema_grammar(engine, fmt["schema"], "text.format.schema"), fmt
    raise bad(f"text.format.type must be 'text', 'json_object' or 'json_schema', got "
              f"{safe_text(repr(kind))[:40]}", param="text.format.type")


# ---------------------------------------------------------------- endpoint
class _Req:
    """What the response object echoes of the request."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def responses(ctx, data) -> None:
    srv, engine = ctx.srv, ctx.engine
    b = Body(data, FIELDS, IGNORED)
    model = check_model(srv, b)
    convert.set_lenient(b.bool("lenient", False))
    if b.has("previous_response_id"):
        raise bad("previous_response_id is not supported: this server does not store responses (send the "
                  "conversation in input)", param="previous_response_id")
    if b.has("background") and b.bool("background", False):
        raise bad("background responses are not supported", param="background")
    if b.list("include"):
        raise bad("include is not supported", param="include")
    if b.raw("reasoning") not in (None, {}) and b.raw("reasoning") != {"effort": None}:
        raise bad("reasoning is not supported by this model", param="reasoning")
    if b.raw("truncation") not in (None, "disabled"):
        raise bad("truncation other than 'disabled' is not supported", param="truncation")
    if b.int("top_logprobs", 0, 0, 20):
        raise bad("top_logprobs is not supported on /v1/responses", param="top_logprobs")
    if b.has("max_tool_calls"):
        b.int("max_tool_calls", None, 1)
    store = b.bool("store", True)
    meta = b.obj("metadata") or {}
    msgs = input_messages(b.raw("instructions"), b.raw("input"))
    stream = b.bool("stream", False)
    mt = b.int("max_output_tokens", None, 1)
    tm = _tools(b)
    kw = prep.sampling(b, engine)
    spec = prep.speculative(engine, b.raw("speculative"))
    if spec is not None:
        kw["speculative"] = spec
    prep.request_params(kw)
    fmt_grammar, fmt = _text_format(engine, b.raw("text"))
    tool_grammar = tm.grammar(engine, "tool_choice")
    if fmt_grammar is not None and tool_grammar is not None:
        raise bad("a JSON text.format and a forced tool_choice cannot be combined", param="text.format")
    g = fmt_grammar or tool_grammar
    if g is not None:
        kw["grammar"] = g
    ids = prep.chat_prompt_ids(engine, msgs, tm)
    max_tokens = prep.budget(engine, len(ids), mt, param="input")
    conv = b.str("conversation") or prep.derived_conversation(engine, msgs)
    kw.update(max_tokens=max_tokens, stop=[], conversation=conv)
    req = _Req(model=model, instructions=b.raw("instructions"), max_output_tokens=mt,
               temperature=kw["temperature"], top_p=kw["top_p"], tm=tm, fmt=fmt, metadata=meta, store=store,
               parallel=b.bool("parallel_tool_calls", True), tools=b.list("tools") or [],
               tool_choice=b.raw("tool_choice") or ("auto" if tm.tools else "none"))
    gen = Generation(engine, [Spec(0, ids, kw)], srv.metrics.record)
    rid = new_id("resp_")
    created = now()
    if stream:
        return _stream(ctx, gen, rid, created, req)
    r = gen.collect(ctx.gone)[0]
    output = _output_items(r.text, tm)
    out = _response(rid, created, req, output, r.metrics, r.finish_reason)
    if convert.ignored() is not None:
        out["schema_ignored"] = convert.ignored()
    ctx.send_json(200, out)


def _output_items(text: str, tm) -> list[dict]:
    calls = parse_tool_calls(text, tm.tools) if tm.active else None
    if calls:
        return [_call_item(c) for c in calls]
    return [_message_item(text, "completed")]


def _message_item(text: str, status: str, mid: str | None = None) -> dict:
    return {"type": "message", "id": mid or new_id("msg_"), "status": status, "role": "assistant",
            "content": [] if text is None else [_text_part(text)]}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(c: dict, status: str = "completed", args: str | None = None) -> dict:
    return {"type": "function_call", "id": new_id("fc_"), "call_id": new_id("call_"), "name": c["name"],
            "arguments": json.dumps(c["arguments"], ensure_ascii=False) if args is None else args,
            "status": status}


def _usage(m: dict | None) -> dict | None:
    if m is None:
        return None
    return schema.responses_usage(m)


def _response(rid, created, req, output, metrics, finish_reason, status=None, error=None) -> dict:
    if status is None:
        status = "incomplete" if finish_reason in ("length", "context") else "completed"
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": req.model,
        "output": output, "parallel_tool_calls": req.parallel, "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": req.temperature,
        "text": {"format": req.fmt}, "tool_choice": req.tool_choice, "tools": req.tools, "top_p": req.top_p,
        "truncation": "disabled", "usage": _usage(metrics), "user": None, "metadata": req.metadata,
        "timings": timings(metrics) if metrics else None,
    }


def _stream(ctx, gen, rid, created, req) -> None:
    st = ChoiceStream(req.tm)
    seq = [0]
    output: list[dict] = []
    msg = {"item": None, "index": -1, "text": ""}   # the open message item

    def ev(kind, **fields):
        d = {"type": kind, "sequence_number": seq[0]}
        d.update(fields)
        seq[0] += 1
        ctx.sse(d, event=kind)

    def open_message():
        if msg["item"] is not None:
            return
        item = _message_item(None, "in_progress")
        msg.update(item=item, index=len(output))
        output.append(item)
        ev("response.output_item.added", output_index=msg["index"], item=item)
        ev("response.content_part.added", item_id=item["id"], output_index=msg["index"], content_index=0,
           part=_text_part(""))

    def text(t):
        open_message()
        msg["text"] += t
        ev("response.output_text.delta", item_id=msg["item"]["id"], output_index=msg["index"], content_index=0,
           delta=t, logprobs=[])

    def delta_bytes(t):
        """On the scheduler thread (write_tokens_directly): the SSE bytes of t's output_text.delta event,
        what ev() writes for it; the event takes its sequence number and its text joins the message."""
        data = delta_of(t, seq[0])
        seq[0] += 1
        msg["text"] += t
        return data

    def close_message():
        item = msg["item"]
        if item is None:
            return
        part = _text_part(msg["text"])
        ev("response.output_text.done", item_id=item["id"], output_index=msg["index"], content_index=0,
           text=msg["text"], logprobs=[])
        ev("response.content_part.done", item_id=item["id"], output_index=msg["index"], content_index=0, part=part)
        item.update(status="completed", content=[part])
        ev("response.output_item.done", output_index=msg["index"], item=item)
        msg["item"] = None

    failed = []

    def on_event(i, e):
        if "error" in e:
            failed.append(e["error"])
            raise _Abort()
        if "data" in e:   # built by delta_bytes on the scheduler thread, not written there
            ctx.write_sse_bytes(e["data"])
        else:
            out = st.feed(e["text"]) if e["text"] else ""
            if out:
                text(out)
        if not e.get("done"):
            return
        rest, calls = st.finish()
        if rest:
            text(rest)
        if calls:
            close_message()
            for c in calls:
                args = json.dumps(c["arguments"], ensure_ascii=False)
                item = _call_item(c, "in_progress", "")
                idx = len(output)
                output.append(item)
                ev("response.output_item.added", output_index=idx, item=dict(item))
                ev("response.function_call_arguments.delta", item_id=item["id"], output_index=idx, delta=args)
                ev("response.function_call_arguments.done", item_id=item["id"], output_index=idx, arguments=args,
                   name=item["name"])
                item.update(arguments=args, status="completed")
                ev("response.output_item.done", output_index=idx, item=item)
        else:
            open_message()   # an empty answer is still one message item
            close_message()
        resp = _response(rid, created, req, output, e["metrics"], e["finish_reason"])
        ev("response.completed" if resp["status"] == "completed" else "response.incomplete", response=resp)

    try:
        ctx.start_sse()
        start = _response(rid, created, req, [], None, None, status="in_progress")
        ev("response.created", response=start)
        ev("response.in_progress", response=start)
        if st.state == "text":   # no tools: a token's event is its text alone, the scheduler thread writes it
            open_message()
            delta_of = _delta_bytes(msg["item"]["id"], msg["index"])
            gen.write_tokens_directly(0, delta_bytes, ctx.try_write, stateful=True)
        try:
            drive(ctx, gen, on_event)
        except _Abort:
            gen.cancel()
            err = failed[0]
            e = err if isinstance(err, ApiError) else map_engine_error(err)
            ev("error", code=e.code or e.kind, message=e.message, param=e.param)
            ev("response.failed", response=_response(rid, created, req, output, None, None, status="failed",
                                                     error={"code": e.code or "server_error",
                                                            "message": e.message}))
    except ClientGone:
        gen.cancel()


_MARK_TEXT = "\x00text\x00"
_MARK_SEQ = 987654321987654321


def _delta_bytes(item_id: str, index: int):
    """(text, sequence number) -> the SSE bytes of a response.output_text.delta event, character for
    character what ctx.sse writes for ev("response.output_text.delta", ...), from a serialisation made
    once (one string escape per token)."""
    kind = "response.output_text.delta"
    obj = {"type": kind, "sequence_number": _MARK_SEQ, "item_id": item_id, "output_index": index,
           "content_index": 0, "delta": _MARK_TEXT, "logprobs": []}
    s = json.dumps(obj, ensure_ascii=False)
    head, _, rest = s.partition(str(_MARK_SEQ))
    mid, _, tail = rest.partition(json.encoder.encode_basestring(_MARK_TEXT))
    head = f"event: {kind}\ndata: " + head
    tail += "\n\n"
    esc = json.encoder.encode_basestring
    return lambda text, n: (head + str(n) + mid + esc(text) + tail).encode("utf-8", "backslashreplace")


class _Abort(Exception):
    pass
