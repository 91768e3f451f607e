"""Tool calling: the JSON Schema a forced tool call must follow, the tool
instructions for templates that cannot render tools, and parsing tool calls
out of a model's output.

Standard library only.
"""
from __future__ import annotations

import json
import re


# Tools are normalized to [{"name", "description", "parameters"}].
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def tool_call_schema(tools: list[dict], only: str | None, parallel: bool) -> dict:
    """JSON Schema of the model's tool-call output: {"name": ..., "arguments": {...}}
    (or a non-empty list of them when parallel)."""
    alts = []
    for t in tools:
        if only is not None and t["name"] != only:
            continue
        alts.append({"type": "object",
                     "properties": {"name": {"const": t["name"]},
                                    "arguments": t["parameters"] or {"type": "object"}},
                     "required": ["name", "arguments"], "additionalProperties": False})
    one = alts[0] if len(alts) == 1 else {"anyOf": alts}
    if parallel:
        return {"type": "array", "items": one, "minItems": 1}
    return one


def tool_system_text(tools: list[dict]) -> str:
    """Tool instructions for chat templates that do not render `tools` themselves."""
    spec = json.dumps([{"name": t["name"], "description": t.get("description") or "",
                        "parameters": t["parameters"] or {"type": "object"}} for t in tools],
                      ensure_ascii=False)
    return ("You can call these tools (each tool's arguments follow its JSON Schema):\n" + spec +
            "\nTo call a tool, reply with only a JSON object: "
            '{"name": "<tool name>", "arguments": {<arguments>}}. '
            "To call several tools, reply with a JSON array of such objects.")


def tool_call_text(calls: list[dict]) -> str:
    """How an earlier assistant tool call is shown to a template that cannot render tool_calls:
    the same JSON the model is asked to produce."""
    objs = [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
    return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_TAG = re.compile(r"^<tool_call>\s*(.*?)\s*(?:</tool_call>)?$", re.S)


def parse_tool_calls(text: str, tools: list[dict]) -> list[dict] | None:
    """The tool calls in a model's output, [{"name", "arguments": dict}], or None
    when the output is not (only) tool calls."""
    s = text.strip()
    for rx in (_FENCE, _TAG):
        m = rx.match(s)
        if m:
            s = m.group(1).strip()
    if not s or s[0] not in "{[":
        return None
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    names = {t["name"] for t in tools}
    calls = []
    for it in items:
        if not isinstance(it, dict) or it.get("name") not in names:
            return None
        args = it.get("arguments", it.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append({"name": it["name"], "arguments": args})
    return calls or None


def looks_like_tool_call(prefix: str) -> bool | None:
    """For streaming under tool_choice auto: True if the output so far may be a
    tool call (buffer it), False if it is plain text, None if undecided."""
    s = prefix.lstrip()
    if not s:
        return None
    if s[0] in "{[":
        return True
    for lead in ("<tool_call>", "```"):
        if s.startswith(lead):
            return True
        if lead.startswith(s):
            return None
    return False
