"""The default model's chat template with its generation prompt swapped, for tests that need a
reasoning model's template (tests/runtime/server/openai/test_openai_serving_reasoning.py,
tests/frontend/lang/test_tools.py)."""

from __future__ import annotations

import copy
from typing import Any

GENERATION = "{{ '<|im_start|>assistant\n' }}"


def with_template(tokenizer: Any, generation: str) -> Any:
    """A copy of the tokenizer whose chat template ends with `generation` instead."""
    tok = copy.copy(tokenizer)
    assert GENERATION in tokenizer.chat_template
    tok.chat_template = tokenizer.chat_template.replace(GENERATION, generation)
    return tok
