"""OpenAI-compatible endpoints: /v1/chat/completions, /v1/completions, /v1/models.

Accepted fields are an explicit allowlist per endpoint; `user`, `metadata`
and `store` are accepted and ignored (they do not change the output); any
other field is a 400 naming it.  Extensions: top_k, min_p, repeat_penalty,
grammar (GBNF), speculative (object), conversation (slot-pinning key); on chat
completions also lenient (JSON Schemas leave out what cannot be enforced,
reported as `schema_ignored`; see convert.ignored).
"""
from __future__ import annotations

import functools
import json

from .body import Body, check_keys, stop_list
from . import convert
from .errors import ApiError, bad, safe_text
from .grammars import response_format_grammar
from .ids import new_id, now
from .tools import looks_like_tool_call, parse_tool_calls
from .usage import timings, usage_openai
from . import prep
from .gen import ClientGone, Generation, Spec, drive

IGNORED = {"user", "metadata", "store"}
EXTENSIONS = {"top_k", "min_p", "repeat_penalty", "grammar", "speculative", "conversation"}
CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
               "stream", "stream_options", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
               "logprobs", "top_logprobs", "seed", "response_format", "tools", "tool_choice",
               "parallel_tool_calls", "lenient"} | EXTENSIONS
COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
                     "stop", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "echo", "seed",
                     "suffix", "best_of"} | EXTENSIONS
MAX_N = 16
MAX_CHOICES = 64

FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


# ------------------------------------------------------------------- models
def model_object(srv) -> dict:
    eng = srv.engine
    meta = {}
    if eng is not None:
        meta = {"n_ctx": eng.params["n_ctx"], "n_slots": eng.params["n_slots"], "n_vocab": eng.info["n_vocab"],
                "arch": eng.info["arch"], "n_params": eng.info["n_params"]}
    return {"id": srv.model_id, "object": "model", "created": int(srv.t_start), "owned_by": "colibri-lab",
            "meta": meta}


def list_models(ctx) -> None:
    ctx.send_json(200, {"object": "list", "data": [model_object(ctx.srv)]})


def get_model(ctx, model_id: str) -> None:
    if model_id not in ctx.srv.model_names():
        raise ApiError(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    ctx.send_json(200, model_object(ctx.srv))


def check_model(srv, b: Body) -> str:
    name = b.str("model", required=True)
    if name not in srv.model_names():
        raise ApiError(404, f"The model '{name}' does not exist; this server serves '{srv.model_id}'",
                       param="model", code="model_not_found")
    return name


# --------------------------------------------------------------- shared bits
def _stream_opts(b: Body, stream: bool) -> bool:
    so = b.obj("stream_options")
    if so is None:
        return False
    if not stream:
        raise bad("stream_options is only allowed when stream is true", param="stream_options")
    check_keys(so, {"include_usage"}, "stream_options")
    iu = so.get("include_usage", False)
    if not isinstance(iu, bool):
        raise bad("stream_options.include_usage must be a boolean", param="stream_options.include_usage")
    return iu


def _tok_str(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _lp_entry(model, token: int, lp: float, top, n_top: int) -> dict:
    b = model.token_bytes(token)
    return {"token": _tok_str(b), "logprob": float(lp), "bytes": list(b),
            "top_logprobs": [{"token": _tok_str(model.token_bytes(t)), "logprob": float(l),
                              "bytes": list(model.token_bytes(t))} for t, l in list(top)[:n_top]]}


def _usage(results) -> dict:
    by_prompt = {}
    for r in results:
        key = tuple(r.prompt_ids)
        by_prompt.setdefault(key, r)
    prompt = sum(len(k) for k in by_prompt)
    cached = sum(int(r.metrics.get("cached_tokens", 0)) for r in by_prompt.values())
    completion = sum(int(r.metrics.get("completion_tokens", 0)) for r in results)
    return usage_openai(prompt, cached, completion)


def _common_kwargs(b: Body, engine, *, default_max: int | None):
    kw = prep.sampling(b, engine)
    stops = stop_list(b.raw("stop"), "stop", 4)
    spec = prep.speculative(engine, b.raw("speculative"))
    if spec is not None:
        kw["speculative"] = spec
    prep.request_params(dict(kw, stop=stops))
    conv = b.str("conversation")
    if conv is not None and not (1 <= len(conv) <= 256):
        raise bad("conversation must be 1-256 characters", param="conversation")
    return kw, stops, conv


def _stream_error(ctx, err: Exception) -> None:
    from .gen import map_engine_error
    e = err if isinstance(err, ApiError) else map_engine_error(err)
    ctx.sse(e.openai())


# ----------------------------------------------------------- chat completions
def _tools(b: Body) -> prep.ToolMode:
    tools = b.list("tools")
    choice = b.raw("tool_choice")
    parallel = b.bool("parallel_tool_calls", True)
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice needs tools", param="tool_choice")
        if tools is not None and len(tools) == 0:
            raise bad("tools must not be empty", param="tools")
        return prep.ToolMode()
    from .limits import MAX_TOOLS
    if len(tools) > MAX_TOOLS:
        raise bad(f"at most {MAX_TOOLS} tools", param="tools")
    norm = []
    for i, t in enumerate(tools):
        w = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise bad(f"{w} must be {{\"type\": \"function\", \"function\": {{...}}}}", param=w)
        check_keys(t, {"type", "function"}, w)
        fn = t["function"]
        check_keys(fn, {"name", "description", "parameters", "strict"}, f"{w}.function")
        prep.check_tool(fn.get("name"), fn.get("parameters"), f"{w}.function")
        norm.append({"name": fn["name"], "description": fn.get("description") or "",
                     "parameters": fn.get("parameters")})
    if len({t["name"] for t in norm}) != len(norm):
        raise bad("tools: function names must be unique", param="tools")
    tm = prep.ToolMode(tools=norm, choice="auto", parallel=parallel)
    if choice is None or choice == "auto":
        pass
    elif choice in ("none", "required"):
        tm.choice = choice
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in {t["name"] for t in norm}:
            raise bad(f"tool_choice names function {name!r}, which is not in tools", param="tool_choice")
        tm.choice, tm.name = "named", name
    else:
        raise bad("tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": "
                  "{\"name\": ...}}", param="tool_choice")
    return tm


ROLES = ("system", "developer", "user", "assistant", "tool")


def _messages(b: Body) -> list:
    msgs = b.list("messages")
    if not msgs:
        raise bad("messages must be a non-empty array", param="messages")
    return check_messages(msgs)


def check_messages(msgs: list, where: str = "messages") -> list:
    """Chat messages checked as OpenAI checks them: known roles; an assistant's
    tool_calls are {"id", "type": "function", "function": {"name",
    "arguments"}}; every tool message carries the tool_call_id of a call made by
    the assistant message it answers, and every call is answered before the
    conversation goes on.  `where` names the field in errors."""
    out = []
    open_calls: dict | None = None    # ids of the last assistant tool calls still unanswered
    for i, m in enumerate(msgs):
        w = f"{where}[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{w} must be an object", param=w)
        check_keys(m, {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}, w)
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"{w}.role must be one of {', '.join(ROLES)}, got {safe_text(repr(role))[:40]}",
                      param=f"{w}.role")
        if role != "tool" and open_calls:
            raise bad("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                      f"'tool_call_id'. The following tool_call_ids did not have response messages: "
                      f"{', '.join(open_calls)}", param=f"{w}.role")
        if role == "tool":
            tid = m.get("tool_call_id")
            if not isinstance(tid, str) or not tid:
                raise bad(f"{w}: a tool message needs tool_call_id, the id of the call it answers",
                          param=f"{w}.tool_call_id")
            if open_calls is None:
                raise bad(f"{w}: messages with role 'tool' must be a response to a preceding message with "
                          f"'tool_calls'", param=f"{w}.role")
            if tid not in open_calls:
                raise bad(f"{w}.tool_call_id {safe_text(tid)[:64]!r} does not answer a pending call of the "
                          f"preceding assistant message", param=f"{w}.tool_call_id")
            del open_calls[tid]
        elif m.get("tool_call_id") is not None:
            raise bad(f"{w}: tool_call_id is only allowed on tool messages", param=f"{w}.tool_call_id")
        else:
            open_calls = None
        if m.get("tool_calls") is not None:
            tc = m["tool_calls"]
            if role != "assistant" or not isinstance(tc, list) or not tc:
                raise bad(f"{w}.tool_calls must be a non-empty list of function calls on an assistant message",
                          param=f"{w}.tool_calls")
            open_calls = {}
            for k, c in enumerate(tc):
                cw = f"{w}.tool_calls[{k}]"
                if not isinstance(c, dict) or c.get("type", "function") != "function" or \
                        not isinstance(c.get("function"), dict):
                    raise bad(f"{cw} must be {{\"id\", \"type\": \"function\", \"function\": {{...}}}}", param=cw)
                check_keys(c, {"id", "type", "function"}, cw)
                check_keys(c["function"], {"name", "arguments"}, f"{cw}.function")
                if not isinstance(c.get("id"), str) or not c["id"]:
                    raise bad(f"{cw}.id must be a non-empty string", param=f"{cw}.id")
                if not isinstance(c["function"].get("name"), str):
                    raise bad(f"{cw}.function.name must be a string", param=f"{cw}.function.name")
                if not isinstance(c["function"].get("arguments", ""), str):
                    raise bad(f"{cw}.function.arguments must be a string (JSON text)",
                              param=f"{cw}.function.arguments")
                open_calls[c["id"]] = True
        out.append({k: v for k, v in m.items() if k != "refusal"})
    if open_calls:
        raise bad("An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                  f"'tool_call_id'. The following tool_call_ids did not have response messages: "
                  f"{', '.join(open_calls)}", param=f"{where}[{len(msgs) - 1}]")
    return out


def chat_completions(ctx, data) -> None:
    srv, engine = ctx.srv, ctx.engine
    b = Body(data, CHAT_FIELDS, IGNORED)
    model = check_model(srv, b)
    convert.set_lenient(b.bool("lenient", False))
    messages = _messages(b)
    stream = b.bool("stream", False)
    include_usage = _stream_opts(b, stream)
    n = b.int("n", 1, 1, MAX_N)
    mt = b.int("max_completion_tokens", None, 1)
    if mt is None:
        mt = b.int("max_tokens", None, 1)
    want_lp = b.bool("logprobs", False)
    top_lp = b.int("top_logprobs", 0, 0, 20)
    if b.has("top_logprobs") and not want_lp:
        raise bad("top_logprobs requires logprobs to be true", param="top_logprobs")
    tm = _tools(b)
    kw, stops, conv = _common_kwargs(b, engine, default_max=None)
    grammar = prep.extension_grammar(b, engine)
    rf_grammar = response_format_grammar(engine, b.raw("response_format"))
    tool_grammar = tm.grammar(engine, "tool_choice")
    gs = [g for g in (grammar, rf_grammar, tool_grammar) if g is not None]
    if len(gs) > 1:
        raise bad("grammar, a JSON response_format and a forced tool_choice cannot be combined", param="grammar")
    if gs:
        kw["grammar"] = gs[0]
    ids = prep.chat_prompt_ids(engine, messages, tm)
    max_tokens = prep.budget(engine, len(ids), mt)
    if conv is None:
        conv = prep.derived_conversation(engine, messages)
    specs = []
    for i, skw in enumerate(prep.choice_seeds(kw, n)):
        skw.update(max_tokens=max_tokens, stop=stops, logprobs=max(1, top_lp) if want_lp else 0)
        # only the first choice is pinned: pinning all n would serialize them on one slot
        skw["conversation"] = conv if i == 0 else None
        specs.append(Spec(i, ids, skw))
    gen = Generation(engine, specs, srv.metrics.record)
    rid = new_id("chatcmpl-")
    if stream:
        return _chat_stream(ctx, gen, rid, model, n, tm, want_lp, top_lp, include_usage)
    results = gen.collect(ctx.gone)
    choices = []
    for r in results:
        calls = parse_tool_calls(r.text, tm.tools) if tm.active else None
        msg = {"role": "assistant", "content": None if calls else r.text, "refusal": None}
        if calls:
            msg["tool_calls"] = [{"id": new_id("call_"), "type": "function",
                                  "function": {"name": c["name"], "arguments": _json(c["arguments"])}}
                                 for c in calls]
        lp = None
        if want_lp:
            lp = {"content": [_lp_entry(engine.model, t, l, top, top_lp)
                              for t, (l, top) in zip(r.tokens, r.logprobs)], "refusal": None}
        choices.append({"index": r.index, "message": msg, "logprobs": lp,
                        "finish_reason": "tool_calls" if calls else FINISH.get(r.finish_reason, "stop")})
    out = {"id": rid, "object": "chat.completion", "created": now(), "model": model,
           "system_fingerprint": srv.fingerprint, "choices": choices, "usage": _usage(results),
           "timings": timings(results[0].metrics)}
    if convert.ignored() is not None:
        out["schema_ignored"] = convert.ignored()
    ctx.send_json(200, out)


def _json(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


class ChoiceStream:
    """Per-choice streaming state under tools: plain text passes through; output
    that may be a tool call is held until the end (forced calls always are)."""

    def __init__(self, tm: prep.ToolMode):
        self.tm = tm
        self.state = "text" if not tm.active else ("buffer" if tm.forced else "undecided")
        self.buf = ""

    def feed(self, text: str) -> str:
        if self.state == "text":
            return text
        self.buf += text
        if self.state == "undecided":
            v = looks_like_tool_call(self.buf)
            if v is False:
                self.state, out, self.buf = "text", self.buf, ""
                return out
            if v:
                self.state = "buffer"
        return ""

    def finish(self):
        """(text still to send, tool calls or None)."""
        if self.state == "text":
            return "", None
        calls = parse_tool_calls(self.buf, self.tm.tools)
        return ("", calls) if calls else (self.buf, None)


def _chunk_maker(srv, rid, model, created, obj, include_usage):
    """Builder of one stream's chunks; with include_usage every chunk carries "usage": null
    (only the final usage chunk fills it)."""
    def chunk(choices, **extra):
        d = {"id": rid, "object": obj, "created": created, "model": model,
             "system_fingerprint": srv.fingerprint, "choices": choices}
        if include_usage:
            d["usage"] = None
        d.update(extra)
        return d
    return chunk


_MARK = "\x00text\x00"
_json_str = json.encoder.encode_basestring   # json.dumps(s, ensure_ascii=False) of a str, in C


def _sse_bytes(text_chunk, text: str) -> bytes:
    """The SSE event of a token's text chunk, as the handler's sse() writes it."""
    return f"data: {text_chunk(text)}\n\n".encode("utf-8", "backslashreplace")


def _text_chunks(chunk, choice):
    """The per-token chunk of a stream as text: text -> the JSON of chunk([choice(text)]),
    character for character, from a serialisation made once (the token's text is the only
    part that changes), so a token costs one string escape instead of a dict and a dumps."""
    head, _, tail = json.dumps(chunk([choice(_MARK)]), ensure_ascii=False).rpartition(_json_str(_MARK))
    return lambda text: head + _json_str(text) + tail


def _chat_stream(ctx, gen, rid, model, n, tm, want_lp, top_lp, include_usage) -> None:
    srv, engine = ctx.srv, ctx.engine
    created = now()

    chunk = _chunk_maker(srv, rid, model, created, "chat.completion.chunk", include_usage)

    states = {i: ChoiceStream(tm) for i in range(n)}
    pend_lp = {i: [] for i in range(n)}
    failed = []
    try:
        ctx.start_sse()
        for i in range(n):
            ctx.sse(chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}]))

        plain = {i: _text_chunks(chunk, lambda t, i=i: {"index": i, "delta": {"content": t}, "logprobs": None,
                                                        "finish_reason": None}) for i in range(n)}
        if not want_lp and not tm.active:   # a token's chunk is its text alone: the scheduler thread writes it
            for i in range(n):
                gen.write_tokens_directly(i, functools.partial(_sse_bytes, plain[i]), ctx.try_write)

        def content(i, text):
            if not want_lp:
                ctx.sse(plain[i](text))
                return
            lp = None
            if want_lp:
                lp = {"content": pend_lp[i], "refusal": None}
                pend_lp[i] = []
            ctx.sse(chunk([{"index": i, "delta": {"content": text}, "logprobs": lp, "finish_reason": None}]))

        def on_event(i, ev):
            if "error" in ev:
                failed.append(ev["error"])
                raise _Abort()
            if want_lp:
                for tok, lp, top in ev.get("tokens", ()):
                    pend_lp[i].append(_lp_entry(engine.model, tok, lp, top, top_lp))
            out = states[i].feed(ev["text"]) if ev["text"] else ""
            if out:
                content(i, out)
            if ev.get("done"):
                rest, calls = states[i].finish()
                if rest:
                    content(i, rest)
                if calls:
                    ctx.sse(chunk([{"index": i, "delta": {"tool_calls": [
                        {"index": k, "id": new_id("call_"), "type": "function",
                         "function": {"name": c["name"], "arguments": _json(c["arguments"])}}
                        for k, c in enumerate(calls)]}, "logprobs": None, "finish_reason": None}]))
                reason = "tool_calls" if calls else FINISH.get(ev["finish_reason"], "stop")
                ctx.sse(chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason}],
                              timings=timings(ev["metrics"])))

        try:
            drive(ctx, gen, on_event)
        except _Abort:
            gen.cancel()
            _stream_error(ctx, failed[0])
            return
        if include_usage:
            results = [gen.results[i] for i in sorted(gen.results)]
            ctx.sse(chunk([], usage=_usage(results)))
        ctx.sse("[DONE]")
    except ClientGone:
        gen.cancel()


class _Abort(Exception):
    pass


# ---------------------------------------------------------------- completions
def _prompts(engine, v) -> list[list[int]]:
    n_vocab = int(engine.info["n_vocab"])

    def ids_of(p, where):
        if isinstance(p, str):
            if not p:
                raise bad(f"{where} must not be empty", param="prompt")
            return prep.tokenize(engine, p, "prompt")
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            bad_ids = [t for t in p if not 0 <= t < n_vocab]
            if bad_ids:
                raise bad(f"{where}: token id {bad_ids[0]} is out of range [0, {n_vocab})", param="prompt")
            return list(p)
        raise bad(f"{where} must be a string, an array of token ids, or an array of either", param="prompt")

    if v is None:
        raise bad("prompt is required", param="prompt")
    if isinstance(v, str) or (isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool)
                                                                 for t in v)):
        return [ids_of(v, "prompt")]
    if isinstance(v, list) and v:
        return [ids_of(p, f"prompt[{k}]") for k, p in enumerate(v)]
    raise bad("prompt must be a non-empty string, array of token ids, or array of either", param="prompt")


def _legacy_lp(model, tokens, lps, n_top, offset0: int) -> dict:
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    off = offset0
    for t, (l, top) in zip(tokens, lps):
        s = _tok_str(model.token_bytes(t))
        out["tokens"].append(s)
        out["token_logprobs"].append(float(l))
        out["top_logprobs"].append({_tok_str(model.token_bytes(a)): float(x) for a, x in list(top)[:n_top]})
        out["text_offset"].append(off)
        off += len(s)
    return out


def completions(ctx, data) -> None:
    srv, engine = ctx.srv, ctx.engine
    b = Body(data, COMPLETION_FIELDS, IGNORED)
    model = check_model(srv, b)
    prompts = _prompts(engine, b.raw("prompt"))
    stream = b.bool("stream", False)
    include_usage = _stream_opts(b, stream)
    n = b.int("n", 1, 1, MAX_N)
    if b.has("best_of") and b.int("best_of", 1, 1) != n:
        raise bad("best_of other than n is not supported", param="best_of")
    if b.has("suffix") and b.str("suffix") != "":
        raise bad("suffix (fill-in-the-middle) is not supported", param="suffix")
    if len(prompts) * n > MAX_CHOICES:
        raise bad(f"at most {MAX_CHOICES} choices per request (prompts x n)", param="n")
    mt = b.int("max_tokens", 16, 1)
    n_lp = b.int("logprobs", None, 0, 20)
    echo = b.bool("echo", False)
    if echo and n_lp is not None:
        raise bad("echo with logprobs needs prompt-token logprobs, which this server does not compute",
                  param="echo")
    kw, stops, conv = _common_kwargs(b, engine, default_max=16)
    grammar = prep.extension_grammar(b, engine)
    if grammar is not None:
        kw["grammar"] = grammar
    specs = []
    k = 0
    for pi, ids in enumerate(prompts):
        max_tokens = prep.budget(engine, len(ids), mt, param="prompt")
        for j, skw in enumerate(prep.choice_seeds(kw, n)):
            skw.update(max_tokens=max_tokens, stop=stops, logprobs=n_lp or 0,
                       conversation=conv if (k == 0 and conv is not None) else None)
            specs.append(Spec(k, ids, skw))
            k += 1
    prompt_text = {}
    if echo:
        for s in specs:
            prompt_text[s.index] = engine.detokenize(s.prompt_ids)
    gen = Generation(engine, specs, srv.metrics.record)
    rid = new_id("cmpl-")
    if stream:
        return _completion_stream(ctx, gen, rid, model, len(specs), n_lp, prompt_text, include_usage)
    results = gen.collect(ctx.gone)
    choices = []
    for r in results:
        pre = prompt_text.get(r.index, "")
        lp = _legacy_lp(engine.model, r.tokens, r.logprobs, n_lp, len(pre)) if n_lp is not None else None
        choices.append({"index": r.index, "text": pre + r.text, "logprobs": lp,
                        "finish_reason": FINISH.get(r.finish_reason, "stop")})
    ctx.send_json(200, {"id": rid, "object": "text_completion", "created": now(), "model": model,
                        "system_fingerprint": srv.fingerprint, "choices": choices, "usage": _usage(results),
                        "timings": timings(results[0].metrics)})


def _completion_stream(ctx, gen, rid, model, n_choices, n_lp, prompt_text, include_usage) -> None:
    srv, engine = ctx.srv, ctx.engine
    created = now()

    chunk = _chunk_maker(srv, rid, model, created, "text_completion", include_usage)

    pend = {i: ([], []) for i in range(n_choices)}
    offs = {i: len(prompt_text.get(i, "")) for i in range(n_choices)}
    plain = {i: _text_chunks(chunk, lambda t, i=i: {"index": i, "text": t, "logprobs": None, "finish_reason": None})
             for i in range(n_choices)}
    failed = []
    try:
        ctx.start_sse()
        for i, text in sorted(prompt_text.items()):
            ctx.sse(chunk([{"index": i, "text": text, "logprobs": None, "finish_reason": None}]))
        if n_lp is None:   # a token's chunk is its text alone: the scheduler thread writes it
            for i in range(n_choices):
                gen.write_tokens_directly(i, functools.partial(_sse_bytes, plain[i]), ctx.try_write)

        def send(i, text, reason=None, **extra):
            if n_lp is None and reason is None and not extra:   # a token's text: the common chunk
                offs[i] += len(text)
                ctx.sse(plain[i](text))
                return
            lp = None
            if n_lp is not None:
                toks, lps = pend[i]
                lp = _legacy_lp(engine.model, toks, lps, n_lp, offs[i])
                pend[i] = ([], [])
            offs[i] += len(text)
            ctx.sse(chunk([{"index": i, "text": text, "logprobs": lp, "finish_reason": reason}], **extra))

        def on_event(i, ev):
            if "error" in ev:
                failed.append(ev["error"])
                raise _Abort()
            for tok, lp, top in ev.get("tokens", ()):
                pend[i][0].append(tok)
                pend[i][1].append((lp, top))
            if ev.get("done"):
                send(i, ev["text"], FINISH.get(ev["finish_reason"], "stop"), timings=timings(ev["metrics"]))
            elif ev["text"]:
                send(i, ev["text"])

        try:
            drive(ctx, gen, on_event)
        except _Abort:
            gen.cancel()
            _stream_error(ctx, failed[0])
            return
        if include_usage:
            ctx.sse(chunk([], usage=_usage([gen.results[i] for i in sorted(gen.results)])))
        ctx.sse("[DONE]")
    except ClientGone:
        gen.cancel()
