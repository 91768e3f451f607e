"""POST /tokenize and /detokenize, with the bodies llama.cpp's server and
vLLM's take, so either's clients work.

/tokenize: {"content" (llama.cpp) | "prompt" (vLLM): text, or "messages": chat
messages (rendered with the chat template, as vLLM does), "add_special" |
"add_special_tokens": bool (default: the model's own rule), "with_pieces": bool,
"model": optional}.  Answer {"tokens": [ids] (or [{"id", "piece"}] with
with_pieces), "count", "max_model_len"}.

/detokenize: {"tokens": [ids], "model": optional} -> {"content": text,
"prompt": text} (llama.cpp's and vLLM's key for the same text).
"""
from __future__ import annotations

from .body import Body
from .errors import ApiError, bad, safe_text
from . import prep
from .openai_api import check_messages


def _model(ctx, b: Body) -> None:
    name = b.str("model")
    if name is not None and name not in ctx.srv.model_names():
        raise ApiError(404, f"The model '{safe_text(name)}' does not exist; this server serves "
                            f"'{ctx.srv.model_id}'", param="model", code="model_not_found")


def tokenize(ctx, data) -> None:
    engine = ctx.engine
    b = Body(data, {"model", "content", "prompt", "messages", "add_special", "add_special_tokens",
                    "with_pieces", "add_generation_prompt"})
    _model(ctx, b)
    given = [k for k in ("content", "prompt", "messages") if b.has(k)]
    if len(given) != 1:
        raise bad("give exactly one of content, prompt (text) or messages", param="content")
    if b.has("add_special") and b.has("add_special_tokens"):
        raise bad("give add_special or add_special_tokens, not both", param="add_special")
    add = b.bool("add_special", None) if b.has("add_special") else b.bool("add_special_tokens", None) \
        if b.has("add_special_tokens") else None
    if given[0] == "messages":
        msgs = b.list("messages")
        if not msgs:
            raise bad("messages must be a non-empty array", param="messages")
        msgs = check_messages(msgs)
        ids = prep.chat_prompt_ids(engine, msgs, prep.ToolMode())
        if add:   # the template already wrote its special tokens; add_special adds the model's BOS as well
            ids = engine.tokenize("", add_special=True) + ids
    else:
        text = b.str(given[0])
        ids = prep.tokenize(engine, text, given[0], add_special=add)
    out = {"count": len(ids), "max_model_len": int(engine.params["n_ctx"])}
    if b.bool("with_pieces", False):
        out["tokens"] = [{"id": t, "piece": engine.model.token_bytes(t).decode("utf-8", "replace")} for t in ids]
    else:
        out["tokens"] = ids
    ctx.send_json(200, out)


def detokenize(ctx, data) -> None:
    engine = ctx.engine
    b = Body(data, {"model", "tokens"})
    _model(ctx, b)
    toks = b.list("tokens")
    if toks is None:
        raise bad("tokens is required", param="tokens")
    n_vocab = int(engine.info["n_vocab"])
    for i, t in enumerate(toks):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
            raise bad(f"tokens[{i}] must be a token id in [0, {n_vocab})", param=f"tokens[{i}]")
    text = engine.detokenize(toks)
    ctx.send_json(200, {"content": text, "prompt": text})
