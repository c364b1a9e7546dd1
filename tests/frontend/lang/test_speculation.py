"""API speculative execution (`@function(num_api_spec_tokens=N)`): the Speculation bookkeeping on
its own, then programs on a deterministic in-memory "model" (it continues any prefix of one
document with the rest of it, a character a token), where a speculative run must give exactly the
values of a plain run in fewer calls, and last a real runtime."""

from __future__ import annotations

from typing import Any

import pytest

import radixrt as rx
from radixrt.frontend.lang.backend import PieceMeta
from radixrt.frontend.lang.speculation import Speculation, speculates

DOC = ("Name: Ada Lovelace\nBirthday: December 10, 1815\nJob: Analyst\n\nName: Charles Babbage"
       "\nBirthday: December 26, 1791\nJob: Engineer\n")


class Document:
    """Continues text that is a prefix of `doc` with the rest of it (one token a character,
    streamed a token a piece); any other text gets nothing (end of sequence at once)."""

    def __init__(self, doc: str = DOC) -> None:
        self.doc = doc
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.token_usage = rx.TokenUsage()

    def chat_format(self) -> rx.ChatFormat:
        return rx.ChatFormat({r: (f"<{r}>", f"</{r}>") for r in ("system", "user", "assistant")})

    def generate(self, text: str, params: dict[str, Any], on_piece: Any,
                 priority: int = 0) -> rx.GenResult:
        self.calls.append((text, dict(params)))
        rest = self.doc[len(text):] if self.doc.startswith(text) else ""
        limit = params.get("max_tokens") or 256
        out, reason = rest[:limit], "length" if len(rest) > limit else "stop"
        stops = params.get("stop") or ()
        for stop in [stops] if isinstance(stops, str) else stops:
            at = out.find(stop)
            if at >= 0:
                out, reason = out[:at], "stop"
        for char in out if on_piece is not None else "":
            on_piece(char, PieceMeta(1))
        self.token_usage.add(len(text), len(out))
        return rx.GenResult(out, reason, len(text), 0, len(out))

    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0) -> list[rx.ChoiceLogprobs]:
        return [rx.ChoiceLogprobs([0.0 if self.doc.startswith(text + c) else -9.0])
                for c in choices]

    def pin(self, text: str, priority: int = 0) -> None:
        return None

    def unpin(self, handle: Any) -> None:
        return None

    def info(self) -> dict[str, Any]:
        return {}


def character(s):
    s += "Name:" + rx.gen("name", stop="\n") + "\nBirthday:" + rx.gen("birthday", stop="\n")
    s += "\nJob:" + rx.gen("job", stop="\n") + "\n"


def test_a_speculative_run_gives_the_plain_runs_values_in_one_call():
    plain, spec = Document(), Document()
    want = rx.function(character).run(backend=plain)
    got = rx.function(num_api_spec_tokens=64)(character).run(backend=spec)
    assert [got[v] for v in ("name", "birthday", "job")] == \
        [want[v] for v in ("name", "birthday", "job")] == \
        [" Ada Lovelace", " December 10, 1815", " Analyst"]
    assert got.text() == want.text()
    assert len(plain.calls) == 3 and len(spec.calls) == 1
    assert spec.token_usage.prompt_tokens < plain.token_usage.prompt_tokens
    text, params = spec.calls[0]
    assert text == "Name:" and "stop" not in params and params["max_tokens"] == 64  # N
    meta = got.get_meta_info("birthday")
    assert meta == {"finish_reason": "stop", "prompt_tokens": 0, "cached_tokens": 0,
                    "completion_tokens": len(" December 10, 1815"), "speculative": True}
    assert got.get_meta_info("name")["prompt_tokens"] == len("Name:")  # the call's, once


def test_a_program_that_writes_something_else_drops_the_speculation_and_calls_again():
    @rx.function(num_api_spec_tokens=64)
    def other(s):
        s += "Name:" + rx.gen("name", stop="\n")
        s += "\nAge:" + rx.gen("age", stop="\n")  # not what the document says next

    backend = Document()
    state = other.run(backend=backend)
    assert state["name"] == " Ada Lovelace"
    assert state["age"] == "" and len(backend.calls) == 2
    assert backend.calls[1][0] == "Name: Ada Lovelace\nAge:"


def test_max_tokens_stops_and_the_end_of_the_text_are_honoured():
    @rx.function(num_api_spec_tokens=4)
    def short(s):
        s += "Name:" + rx.gen("a", max_tokens=5)  # takes its whole call: max(5, N) tokens
        s += rx.gen("b", max_tokens=3, stop=" ")  # calls for max(3, N) and takes 3 of them
        s += rx.gen("c", stop="\n")  # neither the "e" left nor N more tokens hold its end

    spec, plain = Document(), Document()
    got = short.run(backend=spec)
    want = rx.function(short.func).run(backend=plain)
    assert [got[v] for v in "abc"] == [want[v] for v in "abc"] == [" Ada ", "Lov", "elace"]
    assert got.get_meta_info("a")["finish_reason"] == "length"
    assert got.get_meta_info("b")["finish_reason"] == "length"
    assert [params.get("max_tokens") for _, params in spec.calls] == [5, 4, 4, None]
    assert spec.calls[2][0] == spec.calls[3][0] == "Name: Ada Lov"
    assert spec.calls[3][1] == {"stop": "\n"}  # at last the gen's own call

    @rx.function(num_api_spec_tokens=500)
    def to_the_end(s):
        s += "Name:" + rx.gen("all", stop="never there")

    state = to_the_end.run(backend=Document())
    assert state["all"] == DOC.removeprefix("Name:")  # the call ended: the gen ends there too
    assert state.get_meta_info("all")["finish_reason"] == "stop"


def test_gens_that_cannot_speculate_call_for_real():
    @rx.function(num_api_spec_tokens=64)
    def mixed(s):
        s += "Name:" + rx.gen("name", stop="\n")
        s += "\nBirthday:" + rx.gen("birthday", regex=r"[ A-Za-z0-9,]+", stop="\n")
        s += "\nJob:" + rx.gen("job", stop="\n", temperature=0.5)  # other options: calls

    backend = Document()
    state = mixed.run(backend=backend)
    assert state["job"] == " Analyst"
    assert [c[0][-4:] for c in backend.calls] == ["ame:", "day:", "Job:"]
    assert "stop" in backend.calls[1][1]  # the constrained gen's own call
    assert speculates({"stop": "\n", "temperature": 0})
    for option in ({"logprobs": True}, {"regex": "a"}, {"min_tokens": 2}, {"n": 2},
                   {"stop_token_ids": [3]}, {"separate_reasoning": True}):
        assert not speculates(option)


def test_selects_roles_and_forks_under_speculation():
    doc = "<user>Q</user><assistant>Pick: yes. Why: because.</assistant>"

    @rx.function(num_api_spec_tokens=64)
    def chat(s):
        s += rx.user("Q")
        s += rx.assistant("Pick:" + rx.gen("pick", stop=".") + ". Why:"
                          + rx.gen("why", stop="."))
        forks = s.fork(2)
        forks += rx.gen("more", stop=".")
        forks.join()

    backend = Document(doc)
    state = chat.run(backend=backend)
    assert (state["pick"], state["why"]) == (" yes", " because")
    assert len(backend.calls) == 1 + 2  # the role's gens in one call; each fork calls on its own
    assert all("stop" in params for _, params in backend.calls[1:])  # children: no speculation


def test_speculation_bookkeeping():
    spec = Speculation(16)
    assert spec.call_params({"stop": ["\n"], "max_tokens": 32, "temperature": 0}) == \
        {"max_tokens": 32, "temperature": 0}
    spec.keep({"stop": "\n"}, [(" Ada", 2), ("\n", 1), ("Job", 1)], " Ada\nJob: X", 6, "length")
    assert spec.text == " Ada\nJob: X"  # the final text beyond the pieces is kept too
    taken = spec.take({"stop": "\n"})
    assert taken is not None and (taken.text, taken.tokens, taken.finish_reason) == \
        (" Ada", 2, "stop")
    assert spec.take({"stop": "\n", "temperature": 1.0}) is None  # made with other options
    spec.fill("\nJo")  # "b" keeps the token of "Job"; ": X" holds the call's last 2 tokens
    assert spec.text == "b: X"
    assert spec.take({"max_tokens": 2}) is None  # 2 tokens end inside ": X": where is unknown
    taken = spec.take({"max_tokens": 1})
    assert taken is not None and (taken.text, taken.finish_reason) == ("b", "length")
    spec.fill("nothing like it")
    assert spec.text == ""
    with pytest.raises(ValueError, match="num_api_spec_tokens"):
        Speculation(0)
    with pytest.raises(ValueError, match="num_api_spec_tokens"):
        rx.function(num_api_spec_tokens=-1)(character)


def character_template(s):  # SGLang's test_completion_speculative program
    s += "Construct a character within the following format:\n"
    s += "Name: Steve Jobs.\nBirthday: February 24, 1955.\nJob: Apple CEO.\n"
    s += "\nPlease generate new Name, Birthday and Job.\n"
    s += "Name:" + rx.gen("name", stop="\n") + "\nBirthday:" + rx.gen("birthday", stop="\n")
    s += "\nJob:" + rx.gen("job", stop="\n") + "\n"


@pytest.mark.slow
def test_on_a_runtime_speculation_saves_calls_and_prompt_tokens():
    with rx.Runtime(max_total_tokens=4096, log_level="warning") as runtime:
        plain = rx.function(character_template).run(backend=runtime, temperature=0)
        usage = runtime.token_usage.snapshot()
        runtime.token_usage.reset()
        spec = rx.function(num_api_spec_tokens=64)(character_template).run(
            backend=runtime, temperature=0)
        spec_usage = runtime.token_usage.snapshot()
    names = ("name", "birthday", "job")
    assert [spec[v] for v in names] == [plain[v] for v in names]  # greedy: the same text
    assert (usage["calls"], spec_usage["calls"]) == (3, 1)  # the model follows the template
    assert spec_usage["prompt_tokens"] < usage["prompt_tokens"]
    assert all(spec.get_meta_info(v)["speculative"] for v in names)
