"""The text of a program state and its chat structure: role markers, messages, the preamble, and
the images whose tokens the text holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixrt.frontend.lang.backend import ChatFormat


@dataclass
class Transcript:
    """Text so far, the role open now (if any), the finished messages, and the images (their
    files' bytes) in the order their image tokens stand in the text: the text is only ever
    appended to, so every call on it sends them all.

    `chat` is fetched on first use, so a program without roles never asks the backend for its
    chat template."""

    chat: Callable[[], ChatFormat]
    text: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    role: str | None = None
    role_start: int = 0
    seen_role: bool = False
    images: list[bytes] = field(default_factory=list)

    def begin_role(self, role: str) -> str:
        """Open a role; returns the text that was appended (its markers)."""
        if self.role is not None:
            raise ValueError(f"{role}(...) inside {self.role}(...): roles do not nest")
        fmt = self.chat()
        prefix, _ = fmt.markers(role)
        added = prefix
        if not self.seen_role and role != "system":  # the template's default system prompt
            added = fmt.preamble + prefix
        self.seen_role = True
        self.text += added
        self.role, self.role_start = role, len(self.text)
        return added

    def end_role(self, role: str) -> str:
        if self.role != role:
            raise ValueError(f"end of {role} but the open role is {self.role}")
        _, suffix = self.chat().markers(role)
        self.messages.append({"role": role, "content": self.text[self.role_start :]})
        self.text += suffix
        self.role = None
        return suffix

    def copy(self) -> Transcript:
        return Transcript(self.chat, self.text, [dict(m) for m in self.messages], self.role,
                          self.role_start, self.seen_role, list(self.images))
