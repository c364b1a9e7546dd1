"""The DSL's own logic on a small in-memory backend (no model): tracing of constant prefixes,
nested fork/join, failures. Everything that needs a runtime is in
tests/frontend/lang/test_api.py."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import pytest

import radixrt as rx
from radixrt.frontend.lang.sglang_names import DTYPE_REGEX
from radixrt.frontend.lang.tracer import constant_prefix

CHAT = rx.ChatFormat({r: (f"<{r}>", f"</{r}>") for r in ("system", "user", "assistant")},
                     preamble="<default-system/>")


class EchoBackend:
    """gen returns "<n>" where n counts calls; select picks the longest choice."""

    def __init__(self) -> None:
        self.calls = 0
        self.pins: list[str] = []
        self.unpinned = 0
        self.priorities: list[tuple[str, int]] = []  # (gen or select, priority) per call

    def chat_format(self) -> rx.ChatFormat:
        return CHAT

    def generate(self, text: str, params: dict[str, Any], on_piece: Any,
                 priority: int = 0) -> rx.GenResult:
        self.priorities.append(("gen", priority))
        if params.get("max_tokens") == 7:
            raise rx.BackendError("the runtime refused max_tokens=7")
        if params.get("max_tokens") == 9:  # accepted, then ended by the runtime with an error
            return rx.GenResult("", "error: the KV pool is too small for this request")
        self.calls += 1
        return rx.GenResult(f"<{self.calls}>", "length")

    def score(self, text: str, choices: list[str], unconditional: bool,
              priority: int = 0) -> list[Any]:
        self.priorities.append(("select", priority))
        return [rx.ChoiceLogprobs([float(len(c))]) for c in choices]

    def pin(self, text: str, priority: int = 0) -> int:
        self.priorities.append(("pin", priority))
        self.pins.append(text)
        return len(self.pins)

    def unpin(self, handle: Any) -> None:
        self.unpinned += 1

    def info(self) -> dict[str, Any]:
        return {}


def test_constant_prefix_stops_at_the_first_argument_or_model_call():
    def text_then_arg(s, q):
        s += "Shots. " + "Q: " + q

    def roles(s, q):
        s += rx.system("sys") + rx.user("Question: " + q)

    def gen_first(s, q):
        s += "Hello" + rx.gen("x")
        s += q

    def fstring(s, q):
        s += "A"
        s += f"B {q}"

    assert constant_prefix(text_then_arg, ["q"], lambda: CHAT) == "Shots. Q: "
    assert constant_prefix(roles, ["q"], lambda: CHAT) == "<system>sys</system><user>Question: "
    assert constant_prefix(gen_first, ["q"], lambda: CHAT) == "Hello"
    assert constant_prefix(fstring, ["q"], lambda: CHAT) == "A"


def test_nested_forks_join_into_the_grandparent_with_meta():
    backend = EchoBackend()

    @rx.function
    def tree(s):
        s += "root"
        outer = s.fork(2)
        for child in outer:
            inner = child.fork(2)
            inner += rx.gen("leaf")
            inner += rx.select("pick", ["a", "bbb"])
            inner.join()
        outer.join()

    state = tree.run(backend=backend)
    assert [len(x) for x in state["leaf"]] == [2, 2]
    assert state["pick"] == [["bbb", "bbb"], ["bbb", "bbb"]]
    assert state.get_meta_info("pick")[0][0]["scores"] == [1.0, 3.0]
    assert backend.pins == ["root", "root", "root"] and backend.unpinned == 3


def test_each_fork_has_its_own_messages():
    """A fork's messages are the parent's before the fork, then its own turns: never a
    sibling's, and the parent's stay its own (the children's turns reach it only as text
    appended at a join)."""

    @rx.function
    def chat(s):
        s += rx.system("Be brief.")
        forks = s.fork(2)
        forks += lambda i: rx.user(f"Q{i}") + rx.assistant(rx.gen("a"))
        forks.join()
        s += rx.user("Which?")

    state = chat.run(backend=EchoBackend())
    system = {"role": "system", "content": "Be brief."}
    assert state.messages() == [system, {"role": "user", "content": "Which?"}]
    for i, fork in enumerate(state.forks):
        assert fork.messages() == [system, {"role": "user", "content": f"Q{i}"},
                                   {"role": "assistant", "content": state["a"][i]}]


def test_a_select_whose_choices_tie_picks_the_first():
    """Choices that score the same: the first of them is chosen (SGLang's rule), whatever the
    method."""

    @rx.function
    def prog(s):
        s += "Pick: " + rx.select("mean", ["ab", "cd", "e"])  # EchoBackend: scores 2, 2, 1
        s += rx.select("greedy", ["ef", "gh"], method="greedy")

    state = prog.run(backend=EchoBackend())
    assert (state["mean"], state["greedy"]) == ("ab", "ef")
    assert state.get_meta_info("mean")["scores"] == [2.0, 2.0, 1.0]


@pytest.mark.parametrize("mode", ["gather_variable", "concate_and_append"])
def test_a_join_releases_the_forks_prefix_in_either_mode(mode: str):
    """fork() pins the text so far in the runtime's cache; join() unpins it whichever way it
    joins, so a program's pins never pile up."""
    backend = EchoBackend()

    @rx.function
    def prog(s):
        s += "Shared context. "
        forks = s.fork(2)
        forks += lambda i: f"Part {i}." + rx.gen("x", max_tokens=2)
        forks.join(mode=mode)
        s += " End."

    state = prog.run(backend=backend)
    assert backend.pins == ["Shared context. "] and backend.unpinned == 1
    if mode == "concate_and_append":
        assert state.text().startswith("Shared context. Part 0.<")
        assert "Part 1.<" in state.text() and state.text().endswith(" End.")


def test_failures_surface_from_run_and_from_run_batch():
    backend = EchoBackend()

    @rx.function
    def bad(s, tokens):
        s += "x"
        forks = s.fork(2)
        forks += rx.gen("y", max_tokens=tokens)

    with pytest.raises(rx.BackendError, match="refused"):
        bad.run(tokens=7, backend=backend)
    assert backend.unpinned == 1  # the fork's prefix is released on failure too
    with pytest.raises(ValueError, match="max_tokens=-1"):  # checked in the program itself
        bad.run(tokens=-1, backend=backend)
    with pytest.raises(rx.BackendError, match="refused"):
        bad.run_batch([{"tokens": 3}, {"tokens": 7}], backend=backend)
    with pytest.raises(TypeError, match="bad"):
        bad.run(backend=backend)  # missing argument
    with pytest.raises(rx.BackendError, match="gen 'y' failed in the runtime: the KV pool"):
        bad.run(tokens=9, backend=backend)  # an error ending is raised, not an empty answer


def test_run_batch_pins_the_traced_prefix_once():
    backend = EchoBackend()

    @rx.function
    def few_shot(s, q):
        s += "Example 1. Example 2. "
        s += "Q: " + q + rx.gen("a")

    states = few_shot.run_batch([{"q": str(i)} for i in range(5)], backend=backend)
    assert backend.pins == ["Example 1. Example 2. Q: "] and backend.unpinned == 1
    assert sorted(s["a"] for s in states) == sorted(f"<{i}>" for i in range(1, 6))


def test_priorities_reach_the_backend_from_the_run_each_call_and_forks():
    @rx.function
    def prog(s):
        s += "Q" + rx.gen("a", max_tokens=2)
        s += rx.gen("b", max_tokens=2, priority=-4)
        s += rx.select("c", ["x", "yy"])
        forks = s.fork(2)
        for f in forks:
            f += rx.gen("d", max_tokens=2)
        forks.join()

    backend = EchoBackend()
    prog.run(backend=backend, priority=3)
    assert backend.priorities[:4] == [("gen", 3), ("gen", -4), ("select", 3), ("pin", 3)]
    assert backend.priorities[4:] == [("gen", 3), ("gen", 3)]  # the forks inherit the run's
    backend.priorities.clear()
    prog.run_batch([{}, {}], backend=backend, priority=1, prefix_cache=False)
    assert sorted(set(backend.priorities)) == [("gen", -4), ("gen", 1), ("pin", 1),
                                               ("select", 1)]
    backend.priorities.clear()
    prog.run(backend=backend)
    assert ("gen", 0) in backend.priorities


def test_a_bad_priority_is_refused_where_the_program_names_it():
    with pytest.raises(ValueError, match="priority"):
        rx.gen("x", priority=1 << 40)
    with pytest.raises(TypeError, match="priority must be an int"):
        rx.select("x", ["a"], priority="high")

    @rx.function
    def prog(s):
        s += "x"

    with pytest.raises(ValueError, match="priority"):
        prog.run(backend=EchoBackend(), priority=1 << 40)



def test_a_gens_constraint_reaches_the_backend_inside_its_params():
    seen: list[dict[str, Any]] = []

    class Recording(EchoBackend):
        def generate(self, text, params, on_piece, priority=0):
            seen.append(dict(params))
            return super().generate(text, params, on_piece, priority)

    @rx.function
    def prog(s):
        s += rx.gen("a", regex="[0-9]+", max_tokens=3) + rx.gen("b", json_schema={"type": "x"})
        s += rx.gen("c", choices=("yes", "no")) + rx.gen("d", dtype=bool)

    prog.run(backend=Recording(), temperature=0)
    assert seen == [
        {"temperature": 0, "regex": "[0-9]+", "max_tokens": 3},
        {"temperature": 0, "json_schema": '{"type": "x"}'},
        {"temperature": 0, "choices": ["yes", "no"]},
        {"temperature": 0, "regex": DTYPE_REGEX[bool]},
    ]
    assert rx.gen("c", choices=["y"]).constraint_kind == "choices"
    assert rx.gen("x").constraint_kind is None
    with pytest.raises(ValueError, match="cannot be combined with regex"):
        rx.gen("x", regex="a", ignore_eos=True)  # checked once, with the sampling fields

# --- asyncio ------------------------------------------------------------------------------------
class AsyncEcho(EchoBackend):
    """EchoBackend whose answers depend on the text only, with async twins that wait on the
    event loop (as RuntimeEndpoint's do); counts the calls cancelled while in flight."""

    def __init__(self, delay: float = 0.001) -> None:
        super().__init__()
        self.delay = delay
        self.cancelled = 0
        self.in_flight = 0

    def generate(self, text: str, params: dict[str, Any], on_piece: Any,
                 priority: int = 0) -> rx.GenResult:
        return rx.GenResult(f"<{len(text) % 97}>", "length")

    async def agenerate(self, *args: Any) -> rx.GenResult:
        import asyncio

        self.in_flight += 1
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        return self.generate(*args)

    async def ascore(self, *args: Any) -> list[Any]:
        import asyncio

        await asyncio.sleep(0)
        return self.score(*args)

    async def apin(self, text: str, priority: int = 0) -> int:
        return self.pin(text, priority)

    async def aunpin(self, handle: Any) -> None:
        self.unpin(handle)


@rx.function
def forked_program(s, topic):
    s += "Topic: " + topic + "\n" + rx.gen("intro", max_tokens=4)
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += f"Idea {i}:" + rx.gen("idea", max_tokens=4)
    forks.join()
    s += rx.select("verdict", ["good", "bad"])
    with s.var_scope("tail"):
        s += "End." + rx.gen("end", max_tokens=2)


def test_arun_gives_what_run_gives_on_one_loop_without_a_thread_each():
    import asyncio
    import threading

    backend = AsyncEcho()
    topics = [f"topic {i}" * (i % 5 + 1) for i in range(300)]
    want = [forked_program.run(topic=t, backend=backend).variables for t in topics]

    async def main() -> list[dict]:
        before = threading.active_count()
        states = await asyncio.gather(*(forked_program.arun(topic=t, backend=backend)
                                        for t in topics))
        assert threading.active_count() <= before + 1  # no thread per program or fork
        return [s.variables for s in states]

    assert asyncio.run(main()) == want
    batch = asyncio.run(forked_program.arun_batch([{"topic": t} for t in topics[:20]],
                                                  backend=backend, max_concurrency=8))
    assert [s.variables for s in batch] == want[:20]
    assert backend.pins.count("Topic: ") >= 1  # arun_batch pinned the constant prefix


def test_a_cancelled_arun_cancels_its_calls_in_flight():
    import asyncio

    backend = AsyncEcho(delay=30.0)

    async def main() -> None:
        task = asyncio.ensure_future(forked_program.arun(topic="x", backend=backend))
        while backend.in_flight == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 10))
    assert backend.cancelled == 1 and backend.in_flight == 0


def test_atext_iter_streams_an_arun_and_errors_reach_the_caller():
    import asyncio

    @rx.function
    def streamed(s):
        s += "A" + rx.gen("x", max_tokens=2) + "B" + rx.gen("y", max_tokens=2)

    async def main() -> tuple[list[str], str]:
        state = await streamed.arun(backend=AsyncEcho(), stream=True)
        pieces = [p async for p in state.atext_iter()]
        await state.await_done()
        return pieces, state.text()

    pieces, text = asyncio.run(main())
    assert "".join(pieces) == text

    @rx.function
    def refused(s):
        s += "x" + rx.gen("x", max_tokens=7)  # EchoBackend refuses max_tokens=7

    with pytest.raises(rx.BackendError, match="refused"):
        asyncio.run(refused.arun(backend=EchoBackend()))  # a backend with no async twins


def test_sglang_names_radixrt_lacks_say_what_to_use():
    with pytest.raises(AttributeError, match="OpenAICompatible"):
        rx.OpenAI  # noqa: B018
    with pytest.raises(AttributeError, match="not video"):
        rx.video  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'nonsense'"):
        rx.nonsense  # noqa: B018


def test_an_image_goes_with_every_call_on_its_text_where_the_backend_takes_images(tmp_path):
    @rx.function
    def look(s):
        s += rx.user(rx.image(b"picture") + "What is it?")
        forks = s.fork(1)
        forks += rx.assistant(rx.gen("a", max_tokens=2))
        forks.join("concate_and_append")
        s += rx.user(rx.image(path) + "And this?") + rx.assistant(rx.gen("b", max_tokens=2))

    path = tmp_path / "second.png"  # read when the program appends it, on the client
    path.write_bytes(b"second")
    with pytest.raises(rx.BackendError, match="the model takes no images"):
        look.run(backend=EchoBackend())  # its chat format names no image token

    class NamesAnImageToken(EchoBackend):
        def chat_format(self) -> rx.ChatFormat:
            return dataclasses.replace(CHAT, image_token="<img>")

    with pytest.raises(rx.BackendError, match="pin takes no images"):
        look.run(backend=NamesAnImageToken())  # ... but its calls take no images=

    class TakesImages(NamesAnImageToken):
        def __init__(self) -> None:
            super().__init__()
            self.sent: list[tuple[str, str, tuple[bytes, ...]]] = []

        def generate(self, text: str, params: dict[str, Any], on_piece: Any,
                     priority: int = 0, images: tuple[bytes, ...] = ()) -> rx.GenResult:
            self.sent.append(("gen", text, images))
            return super().generate(text, params, on_piece, priority)

        def pin(self, text: str, priority: int = 0, images: tuple[bytes, ...] = ()) -> int:
            self.sent.append(("pin", text, images))
            return super().pin(text, priority)

    backend = TakesImages()
    state = look.run(backend=backend)
    first = "<default-system/><user><img>What is it?</user>"
    assert backend.sent == [
        ("pin", first, (b"picture",)),
        ("gen", first + "<assistant>", (b"picture",)),
        ("gen", first + "<assistant><1></assistant><user><img>And this?</user><assistant>",
         (b"picture", b"second"))]
    assert state.messages()[0] == {"role": "user", "content": "<img>What is it?"}
    data_url = "data:image/png;base64," + base64.b64encode(b"xyz").decode()
    assert rx.image(data_url).data == b"xyz" and rx.image(bytearray(b"ab")).data == b"ab"
    with pytest.raises(ValueError, match="fetch a URL yourself"):
        rx.image("https://example.com/cat.png")
    with pytest.raises(ValueError, match="is empty"):
        rx.image(b"")
    with pytest.raises(TypeError, match="not int"):
        rx.image(3)


def test_sglang_sampling_names_translate_and_clash_clearly():
    from radixrt.frontend.lang.sglang_names import sampling_fields

    assert sampling_fields({"max_new_tokens": 8, "top_logprobs_num": 2, "stop": None},
                           "gen()") == {"max_tokens": 8, "top_logprobs": 2, "logprobs": True}
    with pytest.raises(TypeError, match="max_tokens= / max_new_tokens="):
        sampling_fields({"max_tokens": 1, "max_new_tokens": 2}, "gen()")
    with pytest.raises(TypeError, match="unknown option"):
        sampling_fields({"temprature": 0}, "run()")

    @rx.function
    def prog(s, temperature):  # a program argument of a sampling option's name stays its own
        s += f"t={temperature}" + rx.gen("x", max_tokens=2)

    state = prog.run(temperature="hot", backend=EchoBackend())
    assert state.text().startswith("t=hot")


def test_a_blocking_backend_streams_into_arun_from_its_worker_thread():
    import asyncio

    class Streaming(EchoBackend):
        def generate(self, text, params, on_piece, priority=0):
            pieces = ["a", "b", "c"]
            for piece in pieces if on_piece is not None else []:
                on_piece(piece)
            return rx.GenResult("".join(pieces), "length")

    @rx.function
    def streamed(s):
        s += "X" + rx.gen("x", max_tokens=3)

    async def main() -> list[str]:
        state = await streamed.arun(backend=Streaming(), stream=True)
        pieces = [p async for p in state.atext_iter("x")]
        await state.await_done()
        return pieces

    assert asyncio.run(main()) == ["a", "b", "c"]


def test_review_regressions_of_the_async_and_sglang_paths():
    import asyncio
    import contextvars

    @rx.function
    def prog(s, temperature=None):
        s += f"t={temperature}" + rx.gen("x", max_tokens=2)
        forks = s.fork(2)
        forks += rx.gen("y", max_tokens=2)
        forks.join()

    # run-level defaults that only a gen may have are refused, naming them
    with pytest.raises(TypeError, match=r"\['n'\] cannot be a run's default"):
        prog.run(backend=EchoBackend(), n=3)
    # arun_batch binds each item as run_batch does: the program's own argument stays its own
    states = asyncio.run(prog.arun_batch([{"temperature": "hot"}, ("cold",)],
                                         backend=AsyncEcho(), max_tokens=2))
    assert [s.text().split("<")[0] for s in states] == ["t=hot", "t=cold"]
    with pytest.raises(ValueError, match="max_concurrency"):
        asyncio.run(prog.arun_batch([{}], backend=AsyncEcho(), max_concurrency=0))

    # a backend written before priorities existed (pin / generate / score without it)
    class OldBackend(EchoBackend):
        def pin(self, text):  # type: ignore[override]
            return super().pin(text)

        def generate(self, text, params, on_piece):  # type: ignore[override]
            return rx.GenResult("<old>", "length")

    assert len(prog.run(backend=OldBackend())["y"]) == 2

    # context variables of the caller reach the program on the loop
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")

    @rx.function
    def tagged(s):
        s += request_id.get()

    async def main() -> str:
        request_id.set("req-7")
        return (await tagged.arun(backend=AsyncEcho())).text()

    assert asyncio.run(main()) == "req-7"


class Recording(EchoBackend):
    """EchoBackend that keeps each generate's text and params."""

    def __init__(self) -> None:
        super().__init__()
        self.generated: list[tuple[str, dict[str, Any]]] = []

    def generate(self, text: str, params: dict[str, Any], on_piece: Any,
                 priority: int = 0) -> rx.GenResult:
        self.generated.append((text, dict(params)))
        return super().generate(text, params, on_piece, priority)


def test_gen_and_select_take_sglangs_positional_parameters():
    from radixrt.frontend.lang.sglang_names import REGEX_INT

    assert rx.gen("x", 256).params == {"max_tokens": 256}
    assert rx.gen("x", 64, 2, None, ["\n"], [7], None, 0.5).params == {
        "max_tokens": 64, "min_tokens": 2, "stop": ["\n"], "stop_token_ids": [7],
        "temperature": 0.5}
    assert rx.gen("x", 8, return_logprob=True, top_logprobs_num=2).params == {
        "max_tokens": 8, "logprobs": True, "top_logprobs": 2}
    assert rx.gen("x", 8, max_new_tokens=None).params == {"max_tokens": 8}
    with pytest.raises(TypeError, match="max_tokens= / max_new_tokens="):
        rx.gen("x", 8, max_new_tokens=9)
    with pytest.raises(TypeError, match="stop_regex"):
        rx.gen("x", 8, None, None, None, None, r"\d")
    # a number stops at a space or a newline, as SGLang's runtime backend makes it
    assert rx.gen("n", dtype=int, stop=".").params == {"stop": [".", " ", "\n"],
                                                       "regex": REGEX_INT}
    assert rx.gen_int("n", 16, None, "\n").params["stop"] == ["\n", " "]
    assert rx.gen_string("s", 16).params["max_tokens"] == 16
    with pytest.raises(TypeError, match="multiple values"):
        rx.gen_int("n", 16, max_tokens=8)
    # gen(choices=, choices_method=) is SGLang's gen-as-select; choices alone stay a constraint
    picked = rx.gen("c", choices=["a", "b"], choices_method=rx.greedy_token_selection)
    assert isinstance(picked, rx.frontend.lang.ir.Select) and picked.method == "greedy"
    assert rx.gen("c", choices=["a", "b"]).params == {"choices": ["a", "b"]}
    with pytest.raises(TypeError, match="max_tokens"):
        rx.gen("c", 8, choices=["a"], choices_method=rx.greedy_token_selection)
    chosen = rx.select("c", ["a", "b"], 0.0, rx.unconditional_likelihood_normalized)
    assert chosen.method == "unconditional_likelihood_normalized"
    with pytest.raises(TypeError, match="method='greedy'"):
        rx.select("c", ["a", "b"], "greedy")


def test_sglang_state_idioms():
    backend = Recording()

    @rx.function
    def prog(s):
        s.system("Be brief.")  # SGLang's role call with its content: appended at once
        s += rx.user_begin() + "Hi" + rx.user_end()
        s["note"] = "set in order"
        assert "note" in s and "nothing" not in s
        with s.copy() as c:  # a fork of one, joined at the end of the block
            c += rx.gen("inner")
        forks = s.fork(2)
        forks += [rx.gen("a"), rx.gen("b")]  # one expression a child
        forks.join()
        s += rx.assistant()  # an empty message

    state = prog.run(backend=backend)
    assert state.text().startswith("<system>Be brief.</system><user>Hi</user>")
    assert state.text().endswith("<assistant></assistant>")
    assert state["note"] == "set in order" and len(state["inner"]) == 1
    assert len(state["a"]) == len(state["b"]) == 2  # gathered over both children
    assert state["a"][1] is None and state["b"][0] is None
    state["int_res"] = 24  # after the run, as SGLang's test_dtype_gen does
    assert state["int_res"] == 24 and state.error() is None
    with pytest.raises(ValueError, match="one per fork"):
        rx.function(lambda s: s.fork(2).__iadd__([rx.gen("x")])).run(backend=backend)
    with pytest.raises(TypeError, match="position_ids_offset"):
        rx.function(lambda s: s.fork(2, position_ids_offset=[0, 1])).run(backend=backend)

    @rx.function
    def fails(s):
        s += rx.gen("x", max_tokens=7)  # EchoBackend refuses max_tokens=7

    failed = fails.run(backend=EchoBackend(), stream=True)
    with pytest.raises(rx.BackendError):
        failed.wait(5)
    assert isinstance(failed.error(), rx.BackendError)  # SGLang's way to read it


def test_sglang_program_idioms():
    backend = EchoBackend()

    @rx.function(num_api_spec_tokens=16)
    def spec(s, q):
        s += q + rx.gen("a")

    @rx.function()
    def plain(s, q, r="!"):
        s += "Prefix. " + q + r + rx.gen("a")

    assert spec.num_api_spec_tokens == 16 and plain.num_api_spec_tokens is None
    bound = plain.bind(r="?")
    assert bound.run("Q", backend=backend).text().startswith("Prefix. Q?")
    assert bound.run_batch([("X",)], backend=backend)[0].text().startswith("Prefix. X?")
    with pytest.raises(TypeError, match="no argument"):
        plain.bind(nope=1)
    assert plain.cache(backend=backend) == "Prefix. "  # the constant prefix, prefilled now
    with pytest.raises(NotImplementedError, match="trace"):
        plain.trace()
