"""The text a model's chat template puts around each role's message, read off the template itself.

DSL programs build chat prompts one piece at a time (`s += user("...")`, then a `gen` inside
`assistant(...)`), so they need each role's prefix and suffix as text rather than a whole
rendered conversation. Rendering small conversations with sentinel contents and cutting at the
sentinels recovers them for any template of the usual shape (ChatML, Llama-3, ...).
"""

from __future__ import annotations

from typing import Any

ROLES = ("system", "user", "assistant")
_SENTINELS = {"system": "RXSYSTEMRX", "user": "RXUSERRX", "assistant": "RXASSISTANTRX"}


def chat_roles(tokenizer: Any) -> dict[str, Any]:
    """{"roles": {role: [prefix, suffix]}, "preamble": text} where preamble is what the template
    adds before a conversation that does not start with a system message (SmolLM2 adds a default
    system prompt). Empty roles when the tokenizer has no chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return {"roles": {}, "preamble": ""}
    s, u, a = (_SENTINELS[r] for r in ROLES)

    def render(*msgs: tuple[str, str]) -> str:
        out = tokenizer.apply_chat_template(
            [{"role": r, "content": c} for r, c in msgs], tokenize=False,
            add_generation_prompt=False,
        )
        return _strip_bos(tokenizer, out)

    sys_only = render(("system", s))
    sys_user = render(("system", s), ("user", u))
    full = render(("system", s), ("user", u), ("assistant", a))
    user_only = render(("user", u))

    sys_prefix, sys_suffix = sys_only.split(s)
    user_suffix = sys_user.split(u)[1]
    user_prefix = sys_user.split(s)[1][len(sys_suffix):].split(u)[0]
    assistant_suffix = full.split(a)[1]
    assistant_prefix = full.split(u)[1][len(user_suffix):].split(a)[0]
    before_user = user_only.split(u)[0]
    has_preamble = before_user.endswith(user_prefix)
    preamble = before_user[: len(before_user) - len(user_prefix)] if has_preamble else ""
    return {
        "roles": {
            "system": [sys_prefix, sys_suffix],
            "user": [user_prefix, user_suffix],
            "assistant": [assistant_prefix, assistant_suffix],
        },
        "preamble": preamble,
    }


def _strip_bos(tokenizer: Any, text: str) -> str:
    """The runtime's encode adds BOS itself where the tokenizer does; don't send it twice."""
    bos = getattr(tokenizer, "bos_token", None)
    adds_bos = bool(bos) and tokenizer.encode("a", add_special_tokens=True)[:1] == [
        tokenizer.bos_token_id
    ]
    if adds_bos and text.startswith(bos):
        return text[len(bos):]
    return text
