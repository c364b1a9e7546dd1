"""rx.image against a live runtime (`rx.Runtime` on the tiny random LLaVA-1.5 of
tests/tiny_vlms.py: the real process trio over ZeroMQ, the image files' bytes on the wire): a gen
after an image in a user turn answers what the Engine answers for the same chat message with the
same picture (greedy); the same picture again is a radix-cache hit, another one is not; forks
carry the image (their pinned prefix holds it) and a concate_and_append join carries the
children's images on to the parent; a select after an image runs; refusals (bad bytes, embed
of a text with images, a backend that cannot send images) are clear and leave the runtime
serving. `rx.RuntimeEndpoint("http://...")` (SGLang's form) runs the same programs over the
HTTP port (the native /generate with image_data): every answer and every choice's scores as
over ZeroMQ."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tiny_vlms import build_llava, images

import radixrt as rx
from radixrt import Engine, SamplingParams
from radixrt.frontend.backends import http_images

pytestmark = pytest.mark.slow  # starts real processes

PICTURE, OTHER = images([(40, 50), (36, 30)], seed=3)
GREEDY = dict(max_tokens=5, temperature=0, ignore_eos=True)
QUESTION = "What is in this picture?"


def png(picture: Any) -> bytes:
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from radixrt.runtime.models.loader import load_tokenizer

    folder = tmp_path_factory.mktemp("llava")
    build_llava(folder, load_tokenizer("default"))
    return folder


@pytest.fixture(scope="module")
def rt(llava: Path) -> Iterator[rx.Runtime]:
    runtime = rx.Runtime(model=str(llava), max_total_tokens=2048, check_integrity=True,
                         log_level="warning")
    yield runtime
    runtime.close()
    assert runtime.proc.returncode == 0, runtime.log_tail()


@pytest.fixture(scope="module")
def http(rt: rx.Runtime) -> Iterator[Any]:
    endpoint = rx.RuntimeEndpoint(rt.base_url)
    yield endpoint
    endpoint.close()


@pytest.fixture(scope="module")
def engine(llava: Path) -> Iterator[Engine]:
    engine = Engine(str(llava), max_total_tokens=2048, check_integrity=True)
    yield engine
    engine.close()


def engine_answer(engine: Engine, prompt: Any, pictures: list[Any] = ()) -> Any:
    """Greedy, as GREEDY: chat messages (their image parts), or a text with its pictures."""
    rid = engine.submit(prompt, SamplingParams(**GREEDY), images=pictures)
    while (out := engine.take_output(rid)) is None:
        engine.step()
    return out


def image_span(engine: Engine, out: Any) -> tuple[int, int]:
    """Where the placeholders of an output's prompt start, and one past where they end (an
    output shows each placeholder as the image token)."""
    token = engine.front.images.image_token_id
    places = [i for i, t in enumerate(out.prompt_token_ids) if t == token]
    return places[0], places[-1] + 1


@rx.function
def image_qa(s, picture, question):
    s += rx.user(rx.image(picture) + question)
    s += rx.assistant(rx.gen("answer", **GREEDY))


def test_a_gen_after_an_image_answers_as_the_engine_and_hits_the_cache(rt, engine, tmp_path):
    path = tmp_path / "picture.png"
    path.write_bytes(png(PICTURE))
    state = image_qa.run(picture=str(path), question=QUESTION, backend=rt)  # read here
    assert state.text().startswith(f"<|im_start|>user\n<image>\n{QUESTION}<|im_end|>\n")
    chat = [{"role": "user", "content": [{"type": "image", "image": PICTURE},
                                         {"type": "text", "text": QUESTION}]}]
    expected = engine_answer(engine, chat)
    meta = state.get_meta_info("answer")
    assert state["answer"] == expected.text
    assert meta["prompt_tokens"] == expected.prompt_tokens
    assert state.messages()[0]["content"] == f"<image>\n{QUESTION}"

    start, end = image_span(engine, expected)
    again = image_qa.run(picture=png(PICTURE), question="Describe it.", backend=rt)
    assert again.get_meta_info("answer")["cached_tokens"] >= end, "its placeholders' KV reused"
    other = image_qa.run(picture=png(OTHER), question=QUESTION, backend=rt)
    assert other.get_meta_info("answer")["cached_tokens"] <= start, "another picture: a miss"


@rx.function
def forked(s):
    s += rx.user(rx.image(PICTURE) + QUESTION)  # a PIL image, sent as PNG
    forks = s.fork(2)
    forks += lambda i: rx.assistant(f"Answer {i}:" + rx.gen("answer", **GREEDY))
    forks[1] += rx.user(rx.image(png(OTHER)) + "And this one?")
    forks.join("concate_and_append")
    s += rx.assistant(rx.gen("last", **GREEDY))


@rx.function
def choose(s, method):
    s += rx.user(rx.image(PICTURE) + "Is it blue?")
    s += rx.assistant(rx.select("answer", ["yes", "no", "maybe so, who knows"], method=method))


def test_forks_and_a_concate_and_append_join_carry_the_images(rt, engine):
    state = forked.run(backend=rt)
    for i, child in enumerate(state.forks):
        text = child.text()
        before = text[:text.index(f"Answer {i}:") + len(f"Answer {i}:")]
        expected = engine_answer(engine, before, [PICTURE])
        assert child["answer"] == expected.text
        assert child.get_meta_info("answer")["cached_tokens"] >= image_span(
            engine, expected)[1], "the pinned prefix, image and all"
    text, last = state.text(), state["last"] + "<|im_end|>\n"
    assert text.count("<image>\n") == 2 and text.endswith(last)  # the parent's, the child's
    before = text[:-len(last)]
    assert state["last"] == engine_answer(engine, before, [PICTURE, OTHER]).text


def test_refusals_are_clear_and_the_runtime_keeps_serving(rt):
    @rx.function
    def broken(s):
        s += rx.user(rx.image(b"\x89PNG not really") + QUESTION)
        s += rx.assistant(rx.gen("answer", **GREEDY))

    with pytest.raises(rx.BackendError, match="image 0: not an image"):
        broken.run(backend=rt)

    @rx.function
    def choose(s):
        s += rx.user(rx.image(PICTURE) + "Is it blue?")
        s += rx.assistant(rx.select("yes_no", ["yes", "no"]))

    chosen = choose.run(backend=rt)  # its choices scored by prompt logprobs, image and all
    assert chosen["yes_no"] in ("yes", "no")

    @rx.function
    def pick(s):
        s += rx.user(rx.image(PICTURE) + "Is it blue?")
        s += rx.assistant(rx.gen("yes_no", choices=["yes", "no"]))
        s += rx.embed("vector")

    with pytest.raises(rx.BackendError, match="holds images.*text="):
        pick.run(backend=rt)
    with pytest.raises(FileNotFoundError, match="no-such.png"):
        rx.image("no-such.png")
    completions = rx.OpenAICompatible(rt.base_url + "/v1", "default", chat_format="chatml")
    with pytest.raises(rx.BackendError, match="rx.image needs rx.Runtime"):
        image_qa.run(picture=png(PICTURE), question=QUESTION, backend=completions)
    completions.close()
    state = image_qa.run(picture=png(PICTURE), question=QUESTION, backend=rt)
    assert state.get_meta_info("answer")["completion_tokens"] == GREEDY["max_tokens"]


@rx.function
def rule(s):
    s += rx.user(rx.image(PICTURE) + "Draw a rule.")
    s += rx.assistant("Q: " + "=" * 64 + rx.select("rule", ["=", "==", "= done"]))


def test_the_http_endpoint_runs_image_programs_as_over_zeromq(rt, http, engine, monkeypatch):
    """SGLang's `RuntimeEndpoint("http://...")`: gens (streamed too), selects and forks whose
    text holds images go through the native /generate; the path they replace is ZeroMQ's."""
    assert http.chat_format().image_token == "<image>\n"  # /server_info names it
    question = "Name a color."
    zmq = image_qa.run(picture=png(PICTURE), question=question, backend=rt)
    over_http = image_qa.run(picture=png(PICTURE), question=question, backend=http)
    assert over_http["answer"] == zmq["answer"]
    meta, expected = over_http.get_meta_info("answer"), zmq.get_meta_info("answer")
    assert meta["prompt_tokens"] == expected["prompt_tokens"]
    chat = [{"role": "user", "content": [{"type": "image", "image": PICTURE},
                                         {"type": "text", "text": question}]}]
    end = image_span(engine, engine_answer(engine, chat))[1]
    assert meta["cached_tokens"] >= end, "the picture's placeholders hit the tree"
    streamed = image_qa.run(picture=png(PICTURE), question=question, backend=http, stream=True)
    assert "".join(streamed.text_iter("answer")) == zmq["answer"]

    for method in ("token_length_normalized", "unconditional_likelihood_normalized"):
        want = choose.run(method=method, backend=rt).get_meta_info("answer")
        got = choose.run(method=method, backend=http).get_meta_info("answer")
        for key in ("token_logprobs", "unconditional_token_logprobs"):
            if key == "unconditional_token_logprobs" and method == "token_length_normalized":
                continue
            assert [len(c) for c in got[key]] == [len(c) for c in want[key]], key
            for ours, theirs in zip(got[key], want[key]):
                assert ours == pytest.approx(theirs, abs=1e-4), key
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-4)

    # choices whose tokenization takes back the text's last 5 tokens (a run of "="): with the
    # input logprobs asked from 8 tokens back, and from 1 (asked again from the start)
    want = rule.run(backend=rt).get_meta_info("rule")
    for lookback in (8, 1):
        monkeypatch.setattr(http_images, "SCORE_LOOKBACK", lookback)
        got = rule.run(backend=http).get_meta_info("rule")
        assert [len(c) for c in got["token_logprobs"]] == [len(c) for c in want["token_logprobs"]]
        for ours, theirs in zip(got["token_logprobs"], want["token_logprobs"]):
            assert ours == pytest.approx(theirs, abs=1e-4), lookback

    @rx.function
    def scored(s):  # a gen's output and prompt logprobs after an image
        s += rx.user(rx.image(PICTURE) + question)
        s += rx.assistant(rx.gen("answer", return_logprob=True, logprob_start_len=3,
                                 top_logprobs_num=2, **GREEDY))

    want, got = (scored.run(backend=b).get_meta_info("answer") for b in (rt, http))
    for key in ("output_token_logprobs", "input_token_logprobs"):
        assert [e[1] for e in got[key]] == [e[1] for e in want[key]], key
        assert [e[0] for e in got[key]] == pytest.approx([e[0] for e in want[key]], abs=1e-4)
    assert len(got["input_top_logprobs"]) == len(want["input_top_logprobs"])

    @rx.function
    def tool_after_image(s):
        s += rx.user(rx.image(PICTURE) + question)
        s += rx.assistant(rx.gen("call", tools=[{"type": "function", "function": {
            "name": "look", "parameters": {"type": "object", "properties": {}}}}]))

    with pytest.raises(rx.BackendError, match="tools=.*after rx.image"):
        tool_after_image.run(backend=http)

    state = forked.run(backend=http)  # the fork's prefix pinned with its image over HTTP
    reference = forked.run(backend=rt)
    assert [c["answer"] for c in state.forks] == [c["answer"] for c in reference.forks]
    assert state["last"] == reference["last"]
    assert state.forks[0].get_meta_info("answer")["cached_tokens"] >= end

    with pytest.raises(rx.BackendError, match="image 0: not an image"):
        image_qa.run(picture=b"\x89PNG not really", question=question, backend=http)
