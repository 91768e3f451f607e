"""`Engine`: load a model by alias or path, tokenize, render chat templates,
and generate or stream text through the scheduler.

    eng = Engine("smollm2", n_threads=2)
    out = eng.generate("The capital of France is", max_tokens=16)
    out.text, out.finish_reason, out.metrics["decode_tok_s"]
    for piece in eng.stream("Once upon a time", max_tokens=32):
        print(piece, end="")
    eng.chat([{"role": "user", "content": "Hi!"}]).text
    sc = eng.score("def add(a, b):\n    return a + b\n", top=5)
    sc.perplexity, sc.logprobs, sc.top1, sc.top
"""
from __future__ import annotations

import collections
import json
import hashlib
import math
import threading
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from colibri_lab import _engine, chat as chat_mod, models
from colibri_lab.decode import Decoder
from colibri_lab.errors import EngineError, InvalidRequestError
from colibri_lab.params import RequestParams
from colibri_lab.scheduler import RequestHandle, Scheduler
from colibri_lab.tokenizer import Tokenizer



@dataclass
class Completion:
    """One finished generation."""

    text: str                       # decoded output (cut before a matched stop string)
    tokens: list[int]               # completion token ids (the EOG token is not included)
    finish_reason: str              # "stop" | "length" | "cancelled" | "context"
    metrics: dict                   # per-request metrics (colibri_lab.metrics.REQUEST)
    prompt_tokens: list[int] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)  # per token: token, logprob, top [(id, logprob)]
    schema_ignored: list[dict] = field(default_factory=list)  # lenient json_schema: {keyword, path, reason} left out

    def __str__(self) -> str:
        return self.text


@dataclass
class ScoreResult:
    """Teacher-forced log-probabilities of a token sequence (Engine.score).

    Position i (0 <= i < len(ids) - 1) is the model's prediction after
    ids[:i+1], scored against ids[i+1]; the first token is context only."""

    ids: list[int]                  # the scored sequence (BOS included where the model asks for it)
    logprobs: np.ndarray            # float32 [n]: log p(ids[i+1] | ids[:i+1]), n = len(ids) - 1
    top1: np.ndarray                # int32 [n]: the most probable token (lowest id on ties) at each position
    top_ids: np.ndarray             # int32 [n, k]: the k best tokens, best first (lowest id first on ties)
    top_logprobs: np.ndarray        # float32 [n, k]: their log-probabilities
    metrics: dict                   # the request's metrics (prompt_tokens, prefill_ms, ...)
    logits: np.ndarray | None = None  # float32 [n, n_vocab] raw logits rows (score(..., logits=True))

    @property
    def n(self) -> int:
        """Scored positions (len(ids) - 1)."""
        return len(self.logprobs)

    @property
    def top(self) -> list[list[tuple[int, float]]]:
        """Per position, the k best alternatives as (token id, logprob), best first."""
        return [[(int(t), float(lp)) for t, lp in zip(ti, tl)] for ti, tl in zip(self.top_ids, self.top_logprobs)]

    @property
    def perplexity(self) -> float:
        """exp of the mean negative log-likelihood over the scored positions (float64 sum)."""
        return math.exp(-float(np.mean(self.logprobs, dtype=np.float64)))

    @property
    def tok_s(self) -> float:
        """Tokens scored per second: prompt tokens over the request's prefill time."""
        ms = self.metrics.get("prefill_ms") or 0.0
        return len(self.ids) * 1e3 / ms if ms > 0 else float("nan")


class Engine:
    """A model, its tokenizer and chat template, and a scheduled C engine.

    model: alias ("smollm2") or path to a GGUF file.
    n_threads: compute threads (0 = all cores).  n_ctx: KV positions per slot.
    n_slots: concurrent sequences.  simd: "auto" | "avx512" | "avx2" | "scalar".
    kv_f16: keep the KV cache in f16 (default; half the memory and attention
    reads, as llama.cpp's default cache type) or, False, in f32.
    Speculative decoding resources: draft_model (alias or path; must have the
    target's vocabulary, checked token by token), cross_vocab_draft (a draft
    model with another byte-level BPE tokenizer; source "cross_vocab"),
    layer_skip (the target with blocks skipped; skip_layers=None uses the
    measured calibration of colibri_lab.speculative, cached per model file).
    """

    def __init__(self, model: str = "smollm2", *, n_threads: int = 0, n_ctx: int = 2048, n_slots: int = 1,
                 n_batch: int = 0, n_chunk: int = 0, simd: str = "auto", prefix_reuse: bool = True,
                 max_queue: int = 256, draft_model: str | None = None, layer_skip: bool = False,
                 skip_layers=None, kv_f16: bool = True, cross_vocab_draft: str | None = None,
                 lenient: bool = False, prompt_slack: float | None = None):
        self.model_path = models.resolve(model)
        self.model_name = str(model)
        self.model = _engine.Model(str(self.model_path))
        self.info = self.model.info
        meta = self.model.metadata()
        self.metadata = {k: v for k, v in meta.items() if not k.startswith("tokenizer.ggml.")}
        self.tokenizer = Tokenizer.from_metadata(meta)
        self.chat_template = chat_mod.template_from_metadata(meta)
        self.draft = _engine.Model(str(models.resolve(draft_model))) if draft_model else None
        self.cross_draft = _engine.Model(str(models.resolve(cross_vocab_draft))) if cross_vocab_draft else None
        self.layer_skip_calibration = None
        if layer_skip and skip_layers is None:
            from colibri_lab.speculative import layer_skip_for

            self.layer_skip_calibration = layer_skip_for(self.model, self.model_path, self.tokenizer,
                                                         n_threads=n_threads)
            skip_layers = self.layer_skip_calibration.skip_layers
        self.core = _engine.Engine(self.model, n_slots=n_slots, n_ctx=min(n_ctx, max(2, self.info["n_ctx_train"])),
                                   n_threads=n_threads, n_batch=n_batch, n_chunk=n_chunk, simd=simd,
                                   prefix_reuse=prefix_reuse, draft_model=self.draft, layer_skip=layer_skip,
                                   skip_layers=skip_layers, kv_f16=kv_f16, xdraft_model=self.cross_draft,
                                   prompt_slack=prompt_slack)
        self.params = self.core.params
        self.scheduler = Scheduler(self.core, max_queue=max_queue)
        self._grammars: collections.OrderedDict[str, _engine.Grammar] = collections.OrderedDict()
        self._grammar_lock = threading.Lock()
        self.lenient = bool(lenient)  # default for json_schema: leave out what cannot be enforced
        self._schemas: collections.OrderedDict[tuple, object] = collections.OrderedDict()

    # ------------------------------------------------------------ lifecycle
    def close(self, timeout: float = 10.0) -> None:
        """Stop the scheduler (waiting up to `timeout` s for a running step) and
        free the engine.  A step still running then keeps the engine alive
        until it returns: the core frees itself after it (never under it)."""
        if getattr(self, "scheduler", None) is not None:
            self.scheduler.close(timeout)
            self.scheduler = None
        if getattr(self, "core", None) is not None:
            self.core.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        p = self.params
        return (f"Engine({self.model_name!r}, arch={self.info['arch']}, n_threads={p['n_threads']}, "
                f"n_ctx={p['n_ctx']}, n_slots={p['n_slots']}, simd={p['simd']})")

    # ----------------------------------------------------------------- text
    def tokenize(self, text: str, add_special: bool | None = None, parse_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.model.detokenize_bytes(tokens).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tools=None, **extra) -> str:
        if not self.chat_template:
            raise InvalidRequestError("this model has no chat template (tokenizer.chat_template)")
        tk = self.tokenizer
        bos = tk.id_to_token(tk.bos_id) if tk.bos_id is not None else ""
        eos = tk.id_to_token(tk.eos_id) if tk.eos_id is not None else ""
        return chat_mod.render(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos, eos_token=eos, tools=tools, **extra)

    @staticmethod
    def conversation_key(messages) -> str:
        """A key derived from a conversation's leading messages (system + first user turn),
        stable across turns, so later turns are pinned to the same KV slot."""
        lead = [m for m in messages[:2]]
        return hashlib.sha1(repr([(m.get("role"), m.get("content")) for m in lead]).encode()).hexdigest()[:16]

    def clear_cache(self) -> None:
        """Forget every idle slot's KV and the conversation -> slot pins (cold start for an A/B block)."""
        self.scheduler.clear_conversations()
        for s in range(self.params["n_slots"]):
            self.scheduler.call(lambda core, s=s: core.slot_info(s)["busy"] or core.slot_clear(s))

    # -------------------------------------------------------------- grammar
    def compile_grammar(self, gbnf: str) -> "_engine.Grammar":
        """Compile GBNF text against this model's vocabulary (cached: compile once, reuse)."""
        if not isinstance(gbnf, str) or not gbnf.strip():
            raise InvalidRequestError("grammar must be a non-empty GBNF string")
        with self._grammar_lock:
            g = self._grammars.get(gbnf)
            if g is not None:
                self._grammars.move_to_end(gbnf)
                return g
        g = _engine.Grammar(self.model, gbnf)
        with self._grammar_lock:
            self._grammars[gbnf] = g
            while len(self._grammars) > 64:
                self._grammars.popitem(last=False)
        return g

    def convert_schema(self, json_schema, lenient: bool | None = None):
        """JSON Schema -> colibri_lab.schema.Conversion (GBNF and what lenient mode
        left out), cached by schema."""
        from colibri_lab.schema import convert_schema

        lenient = self.lenient if lenient is None else bool(lenient)
        try:
            key = (json.dumps(json_schema, sort_keys=True), lenient)
        except (TypeError, ValueError):
            return convert_schema(json_schema, lenient=lenient)  # raises the SchemaError
        with self._grammar_lock:
            conv = self._schemas.get(key)
            if conv is not None:
                self._schemas.move_to_end(key)
                return conv
        conv = convert_schema(json_schema, lenient=lenient)
        with self._grammar_lock:
            self._schemas[key] = conv
            while len(self._schemas) > 64:
                self._schemas.popitem(last=False)
        return conv

    def _resolve_grammar(self, grammar, json_schema, lenient=None):
        """(compiled grammar or None, keywords lenient mode left out)."""
        if grammar is not None and json_schema is not None:
            raise InvalidRequestError("give either grammar or json_schema, not both")
        ignored = []
        if json_schema is not None:
            conv = self.convert_schema(json_schema, lenient)
            grammar, ignored = conv.gbnf, conv.ignored
        if grammar is None or isinstance(grammar, _engine.Grammar):
            return grammar, ignored
        return self.compile_grammar(grammar), ignored

    # ------------------------------------------------------------ generation
    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt)
        ids = [int(t) for t in prompt]
        if not ids:
            raise InvalidRequestError("prompt is empty")
        return ids

    def submit(self, prompt, *, max_tokens: int | None = 256, stop=None, logprobs: int = 0,
               conversation: str | None = None, grammar=None, json_schema=None, lenient=None, sink=None,
               **kw) -> tuple[list[int], RequestHandle, list[bytes]]:
        """Queue a request; returns (prompt ids, handle, stop strings as bytes).

        The keywords are colibri_lab.params.RequestParams fields (temperature,
        top_k, top_p, min_p, penalties, seed, logit_bias, slot, speculative, ...),
        validated there; max_tokens=None means the rest of the context.
        grammar: GBNF text (or a compiled Grammar); json_schema: a JSON Schema
        dict.  Either constrains the output with a hard token mask.  lenient
        (default: the Engine's): leave out the schema keywords that cannot be
        enforced instead of refusing the schema; they are in handle.schema_ignored.
        sink(event): receives the events on the scheduler thread instead of
        the handle's queue (see Scheduler)."""
        g, ignored = self._resolve_grammar(grammar, json_schema, lenient)
        ids = self._prompt_ids(prompt)
        if max_tokens is None:
            max_tokens = max(0, self.params["n_ctx"] - len(ids))
        params = RequestParams.from_kwargs(max_tokens=max_tokens, stop=stop or (), n_logprobs=logprobs,
                                           grammar=g, **kw)
        handle = self.scheduler.submit(ids, params, conversation=conversation, sink=sink)
        handle.schema_ignored = ignored
        return ids, handle, list(params.stop)

    def generate(self, prompt, *, max_tokens: int | None = 256, stop=None, logprobs: int = 0,
                 conversation: str | None = None, **kw) -> Completion:
        """Generate a completion for a prompt (text or token ids).

        Sampling: temperature (0 = greedy), top_k, top_p, min_p, repeat_penalty,
        presence_penalty, frequency_penalty, logit_bias {id: bias}, seed.
        stop: a string or list of strings (up to 8).  logprobs: top-n per token."""
        ids, handle, stops = self.submit(prompt, max_tokens=max_tokens, stop=stop, logprobs=logprobs,
                                         conversation=conversation, **kw)
        res = handle.result()
        out = self._completion(ids, res)
        out.schema_ignored = handle.schema_ignored
        return out

    def _completion(self, ids, res) -> Completion:
        m = res["metrics"]
        text = Decoder.decode(self.model.token_bytes, res["tokens"], m["stop_offset"]).text
        return Completion(text=text, tokens=res["tokens"],
                          finish_reason=m["finish_reason"], metrics=m, prompt_tokens=ids,
                          logprobs=res["logprobs"])

    def score(self, prompt, *, top: int = 0, logits: bool = False) -> ScoreResult:
        """Teacher-forced scoring of a prompt (text, tokenized as generate() does,
        BOS where the model asks for it; or token ids): the log-probability of
        every token after the first given the ones before it, the most
        probable token and the `top` best alternatives at each position, and
        the perplexity.  Computed in the engine's batched prefill (chunks of
        the prompt per step, alongside other requests), not token by token;
        each position's row is the one a decode of that prefix would sample
        from.  logits=True also returns the raw logits rows (n x n_vocab
        floats: large).  A sequence of fewer than 2 tokens cannot be scored
        (InvalidRequestError); one longer than the context raises
        ContextLengthExceededError."""
        if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or not 0 <= top <= _engine.MAX_LOGPROBS:
            raise InvalidRequestError(f"top must be an integer in [0, {_engine.MAX_LOGPROBS}], got {top!r}")
        ids = self._prompt_ids(prompt)
        if len(ids) < 2:
            raise InvalidRequestError(f"scoring needs at least 2 tokens (the first is context only), got {len(ids)}")
        handle = self.scheduler.submit(ids, max_tokens=0, n_logprobs=int(top), score=True,
                                       return_logits=bool(logits))
        res = handle.result()
        evs = sorted(res["scores"], key=lambda ev: ev["pos"])
        pos = 0
        for ev in evs:  # the engine's chunks tile positions 0 .. n-2 exactly once
            if ev["pos"] != pos:
                raise EngineError(f"internal error: score rows from position {ev['pos']}, expected {pos}")
            pos += len(ev["logprob"])
        if pos != len(ids) - 1:
            raise EngineError(f"internal error: {pos} positions scored, expected {len(ids) - 1}")
        k = int(top)
        cat = (lambda key, dt, shape: np.concatenate([ev[key] for ev in evs]) if evs
               else np.zeros(shape, dtype=dt))
        return ScoreResult(ids=ids, logprobs=cat("logprob", np.float32, (0,)), top1=cat("argmax", np.int32, (0,)),
                           top_ids=cat("top_tokens", np.int32, (0, k)), top_logprobs=cat("top_logprobs", np.float32, (0, k)),
                           metrics=dict(res["metrics"]),
                           logits=np.concatenate([ev["logits"] for ev in evs]) if logits else None)

    def stream(self, prompt, *, max_tokens: int | None = 256, stop=None, conversation: str | None = None,
               **kw) -> Iterator[str]:
        """Yield text pieces as tokens arrive; pieces never split a UTF-8 character.
        The generator's `.metrics` is not available; use `stream_events` for metrics."""
        for ev in self.stream_events(prompt, max_tokens=max_tokens, stop=stop, conversation=conversation, **kw):
            if ev["text"]:
                yield ev["text"]

    def stream_events(self, prompt, *, max_tokens: int | None = 256, stop=None, logprobs: int = 0,
                      conversation: str | None = None, **kw) -> Iterator[dict]:
        """Yield {"text", "token", "logprob", "top"} per token, then a final
        {"text", "done": True, "finish_reason", "metrics"}.  Closing the
        generator early cancels the request."""
        ids, handle, stops = self.submit(prompt, max_tokens=max_tokens, stop=stop, logprobs=logprobs,
                                         conversation=conversation, **kw)
        dec = Decoder(self.model.token_bytes, stops)
        finished = False
        try:
            for ev in handle:
                if ev["type"] == "token":
                    text = dec.feed(ev["token"])
                    yield {"text": text, "token": ev["token"], "logprob": ev["logprob"], "top": ev.get("top", []),
                           "drafted": ev.get("drafted", False)}
                elif ev["type"] == "done":
                    finished = True
                    m = ev["metrics"]
                    yield {"text": dec.finish(m["stop_offset"]), "done": True,
                           "finish_reason": m["finish_reason"], "metrics": m, "prompt_tokens": len(ids)}
                else:
                    finished = True
                    raise handle.error
        finally:
            if not finished:
                handle.cancel()

    def chat(self, messages, *, tools=None, add_generation_prompt: bool = True, conversation: str | None = None,
             **kw) -> Completion:
        """Render the model's chat template and generate the assistant's reply."""
        prompt = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        if conversation is None:
            conversation = self.conversation_key(messages)
        return self.generate(self.tokenize(prompt, add_special=False),
                             conversation=conversation, **kw)

    def chat_stream(self, messages, *, tools=None, conversation: str | None = None, **kw) -> Iterator[str]:
        prompt = self.apply_chat_template(messages, tools=tools)
        if conversation is None:
            conversation = self.conversation_key(messages)
        return self.stream(self.tokenize(prompt, add_special=False), conversation=conversation, **kw)
