"""Usage and timings objects of a response, from the metric schema
(colibri_lab.metrics: OPENAI_USAGE, LLAMACPP_TIMINGS).

Standard library plus colibri_lab only.
"""
from __future__ import annotations

from typing import Mapping

from colibri_lab import metrics as schema


def timings(m: Mapping) -> dict:
    """llama.cpp's `timings` object from a request's metrics (colibri_lab.metrics.LLAMACPP_TIMINGS)."""
    return schema.llamacpp_timings(m)


def usage_openai(prompt_tokens: int, cached: int, completion_tokens: int) -> dict:
    return schema.openai_usage({"prompt_tokens": prompt_tokens, "cached_tokens": cached,
                                "completion_tokens": completion_tokens})
