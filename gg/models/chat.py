"""Chat templates rendered with jinja2 the way transformers renders them: a sandboxed environment
with trim_blocks and lstrip_blocks, the loop-controls extension, `raise_exception`, `strftime_now`
and a `tojson` filter that keeps non-ASCII text."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Sequence

from ..errors import GGError


class TemplateError(GGError):
    """The chat template raised (raise_exception) or failed to render."""


def _environment():
    try:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise GGError("chat: rendering chat templates needs jinja2: pip install jinja2") from None

    def raise_exception(message: str):
        raise TemplateError(f"chat template: {message}")

    def tojson(x: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render(template: str, messages: Sequence[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
    """The prompt text for `messages` ([{"role": ..., "content": ...}, ...])."""
    if not isinstance(template, str) or not template:
        raise GGError("chat: this model has no chat template (tokenizer.chat_template); use chat=False")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise GGError(f"chat: each message must be a dict with 'role' and 'content', got {m!r}")
    from jinja2 import TemplateError as JinjaError
    try:
        return _environment().from_string(template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **extra)
    except TemplateError:
        raise
    except JinjaError as e:
        raise TemplateError(f"chat template failed to render: {e}") from e
