"""`rx.global_config` (SGLang's `sgl.global_config`): the default backend, live, and SGLang's
settings, each doing what it says where radixrt has the behaviour (verbosity, special tokens in
the output, run_batch's precaching) and checked, never silently ignored, where it has none."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import radixrt as rx
from radixrt.frontend.lang.global_config import DEFAULTS, GlobalConfig


class Recorder:
    """Records each generate's params and each pin; answers "ok"."""

    def __init__(self) -> None:
        self.params: list[dict[str, Any]] = []
        self.pins: list[str] = []

    def chat_format(self) -> rx.ChatFormat:
        return rx.ChatFormat({})

    def generate(self, text: str, params: dict[str, Any], on_piece: Any,
                 priority: int = 0) -> rx.GenResult:
        self.params.append(dict(params))
        return rx.GenResult("ok", "stop")

    def score(self, *args: Any, **kwargs: Any) -> list[rx.ChoiceLogprobs]:
        return []

    def pin(self, text: str, priority: int = 0) -> int:
        self.pins.append(text)
        return len(self.pins)

    def unpin(self, handle: Any) -> None:
        return None

    def info(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def settings() -> Iterator[GlobalConfig]:
    before = rx.global_config.default_backend
    yield rx.global_config
    rx.global_config.reset()
    rx.set_default_backend(before)


@rx.function
def shots(s, question):
    s += "A long constant few-shot prefix. " * 3 + "Q: " + question + "\nA:" + rx.gen("a")


def test_default_backend_is_the_one_set_by_either_name(settings):
    backend = Recorder()
    rx.set_default_backend(backend)
    assert settings.default_backend is backend
    other = Recorder()
    settings.default_backend = other  # SGLang's programs may set it this way too
    assert shots.run(question="x")["a"] == "ok" and other.params and not backend.params
    rx.set_default_backend(None)
    assert settings.default_backend is None


def test_settings_take_effect(settings, capsys):
    backend = Recorder()
    settings.skip_special_tokens_in_output = False
    shots.run(question="x", backend=backend)
    shots.run(question="x", backend=backend, skip_special_tokens=True)  # the run's own wins
    assert [p.get("skip_special_tokens") for p in backend.params] == [False, True]

    settings.verbosity = 2
    shots.run(question="y", backend=backend)
    assert capsys.readouterr().out.endswith("Q: y\nA:ok\n")  # each finished program's text
    settings.verbosity = 1
    shots.run(question="y", backend=backend)
    assert capsys.readouterr().out == ""

    shots.run_batch([{"question": "1"}, {"question": "2"}], backend=backend)
    assert len(backend.pins) == 1  # the traced prefix, pinned for the batch
    settings.enable_precache_with_tracing = False
    shots.run_batch([{"question": "1"}, {"question": "2"}], backend=backend)
    shots.run_batch([{"question": "1"}], backend=backend, prefix_cache=True)  # its own wins
    assert len(backend.pins) == 2


def test_settings_without_an_effect_are_checked_and_unknown_ones_refused(settings):
    settings.spaces_between_special_tokens_in_out = False  # no effect: fast tokenizers
    settings.enable_parallel_encoding = False  # no effect: joins always append text
    assert not settings.spaces_between_special_tokens_in_out
    for name, bad in (("verbosity", -1), ("verbosity", True), ("enable_parallel_encoding", 1)):
        with pytest.raises(ValueError, match=name):
            setattr(settings, name, bad)
    with pytest.raises(AttributeError, match="no setting 'verbose'"):
        settings.verbose = 2
    with pytest.raises(AttributeError, match="no setting 'verbose'"):
        settings.verbose  # noqa: B018
    settings.reset()
    assert {name: getattr(settings, name) for name in DEFAULTS} == DEFAULTS
