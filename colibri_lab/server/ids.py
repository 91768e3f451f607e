"""Response ids and creation timestamps."""
from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def now() -> int:
    return int(time.time())
