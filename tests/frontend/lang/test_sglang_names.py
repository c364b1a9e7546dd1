"""Programs in SGLang's frontend idioms, as its documentation and test programs write them, with
only the import changed (`import radixrt as sgl`), against a live runtime (`sgl.Runtime`, the
real process trio) on the default model: run-level sampling defaults, fork item appends and
lambda appends, both join modes, typed gens, var_scope, logprobs in the meta info, control flow
on a select, streaming, sync, the role begin/end calls, set_var, flush_cache / get_server_info,
the same programs through an http:// RuntimeEndpoint, and what SGLang's test programs read of
the default backend: logprob token texts, streamed meta info, the model's tokenizer path and the
token usage."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import radixrt as sgl

pytestmark = pytest.mark.slow  # starts real processes


@pytest.fixture(scope="module")
def runtime() -> Iterator[sgl.Runtime]:
    runtime = sgl.Runtime(model_path="default", max_total_tokens=8192, check_integrity=True,
                          log_level="warning")
    sgl.set_default_backend(runtime)
    yield runtime
    runtime.shutdown()
    assert runtime.proc.returncode == 0, runtime.log_tail()


@sgl.function
def answer(s, question):
    s += "Q: " + question + "\nA:"
    s += sgl.gen("answer", stop="\n")


@sgl.function
def answer_explicit(s, question, max_tokens):
    s += "Q: " + question + "\nA:"
    s += sgl.gen("answer", stop="\n", temperature=0, max_tokens=max_tokens)


def test_sampling_defaults_at_run_run_batch_and_direct_call(runtime):
    want = answer_explicit.run(question="What is 2 + 2?", max_tokens=6)["answer"]
    assert answer.run(question="What is 2 + 2?", temperature=0, max_new_tokens=6)["answer"] \
        == want
    assert answer(question="What is 2 + 2?", temperature=0, max_new_tokens=6)["answer"] == want
    states = answer.run_batch([{"question": "What is 2 + 2?"}, ("What is 2 + 2?",)],
                              temperature=0, max_new_tokens=6)
    assert [s["answer"] for s in states] == [want, want]

    @sgl.function
    def own_wins(s):
        s += "Count: 1, 2," + sgl.gen("x", max_tokens=5, ignore_eos=True)

    meta = own_wins.run(temperature=0, max_new_tokens=2).get_meta_info("x")
    assert meta["completion_tokens"] == 5  # the gen's own max_tokens beats the run's default
    with pytest.raises(ValueError, match="temperature"):
        answer.run(question="x", temperature=-1)


def test_fork_item_appends_lambda_appends_and_both_join_modes(runtime):
    @sgl.function
    def tips(s):
        s += "Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.\n\n"
        forks = s.fork(2)
        for i, f in enumerate(["Balanced Diet", "Regular Exercise"]):
            forks[i] += f"Now, expand tip {i + 1} ({f}) into a short paragraph:\n"
            forks[i] += sgl.gen("detailed_tip", max_tokens=12, stop="\n\n")
        forks.join()
        s += "Tip 1:" + forks[0]["detailed_tip"] + "\nTip 2:" + forks[1]["detailed_tip"] + "\n"
        s += "In summary," + sgl.gen("summary", max_tokens=8)

    state = tips.run(temperature=0)
    assert len(state["detailed_tip"]) == 2 and state["summary"]

    @sgl.function
    def parallel_encoding(s, contexts):
        s += "Please memorize these statements.\n"
        forks = s.fork(len(contexts))
        forks += lambda i: f"Statement {i}: " + contexts[i] + "\n"
        forks.join(mode="concate_and_append")
        s += "Question: who is the father of Julian?\nAnswer:" + sgl.gen("answer", max_tokens=6)

    contexts = ["Ethan is the father of Liam.", "Noah is the father of Julian."]
    state = parallel_encoding.run(contexts=contexts, temperature=0)
    text = state.text()
    assert text.index("Statement 0: Ethan") < text.index("Statement 1: Noah") < \
        text.index("Question:")
    with pytest.raises(ValueError, match="join"):
        sgl.function(lambda s: s.fork(2).join(mode="merge")).run()


def test_typed_gens_parse_as_their_types(runtime):
    @sgl.function
    def typed(s):
        s += "Q: How many legs does a dog have?\nA (a number): " + sgl.gen_int("legs")
        s += "\nQ: What is pi to two decimals?\nA: " + sgl.gen("pi", dtype=float)
        s += "\nQ: Is the sky blue? Answer True or False.\nA: " + sgl.gen("blue", dtype=bool)
        s += "\nQ: Name a color in quotes.\nA: " + sgl.gen_string("color", max_tokens=10)

    state = typed.run(temperature=0, max_new_tokens=8)
    int(state["legs"])
    float(state["pi"])
    assert state["blue"] in ("True", "False")
    if state.get_meta_info("color")["finish_reason"] != "length":
        assert isinstance(json.loads(state["color"]), str)
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)


def test_var_scope_set_var_roles_and_sync(runtime):
    @sgl.function
    def chat(s):
        s.system_begin()
        s += "You are terse."
        s.system_end()
        s.user_begin()
        s += "Say hi."
        s.user_end()
        s.assistant_begin()
        with s.var_scope("reply"):
            s += "Hi" + sgl.gen("rest", max_tokens=4)
        s.assistant_end()
        s.set_var("note", 42)

    state = chat.run(temperature=0)
    state.sync()
    assert state["reply"] == "Hi" + state["rest"]
    assert state.get_var("note") == 42
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]


def test_return_logprob_in_the_meta_info(runtime):
    @sgl.function
    def scored(s):
        s += "The capital of France is"
        s += sgl.gen("x", max_tokens=3, return_logprob=True, top_logprobs_num=2,
                     logprob_start_len=1)

    meta = scored.run(temperature=0, ignore_eos=True).get_meta_info("x")
    outputs, tops = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert len(outputs) == meta["completion_tokens"] == 3
    for (logprob, token_id, _), top in zip(outputs, tops):
        assert len(top) == 2 and top[0][1] == token_id  # greedy: the sampled token is the top
        assert logprob == pytest.approx(top[0][0]) and logprob <= 0
    assert len(meta["input_token_logprobs"]) >= 4  # the prompt's tokens from position 1


def test_control_flow_on_a_select_and_choices_methods(runtime):
    @sgl.function
    def tool_use(s, question):
        s += "To answer this question: " + question + ". I need to use a "
        s += sgl.select("tool", choices=["calculator", "search engine"])
        if s["tool"] == "calculator":
            s += " The math expression is" + sgl.gen("expression", max_tokens=6)
        elif s["tool"] == "search engine":
            s += " The key word to search is" + sgl.gen("word", max_tokens=6)

    state = tool_use.run(question="What is 39 + 1?", temperature=0)
    assert state["tool"] in ("calculator", "search engine")
    assert ("expression" in state.variables) == (state["tool"] == "calculator")
    for method in (sgl.token_length_normalized, sgl.greedy_token_selection,
                   sgl.unconditional_likelihood_normalized):

        @sgl.function
        def pick(s, m=method):
            s += "The sky is " + sgl.select("c", choices=["blue", "green"], choices_method=m)

        assert pick.run()["c"] in ("blue", "green")


def test_streaming_with_text_iter(runtime):
    state = answer.run(question="Name a fruit.", temperature=0, max_new_tokens=8, stream=True)
    pieces = list(state.text_iter("answer"))
    assert "".join(pieces) == state["answer"]


def test_flush_cache_and_get_server_info(runtime):
    answer.run(question="What is the capital of Italy?", temperature=0, max_new_tokens=4)
    info = sgl.get_server_info()
    assert info["prompt_tokens"] > 0 and "kv_total" in info
    sgl.flush_cache()
    assert sgl.get_server_info()["kv_evictable"] == 0


def test_an_http_runtime_endpoint_runs_the_same_programs(runtime):
    endpoint = sgl.RuntimeEndpoint(runtime.base_url)
    try:
        want = answer.run(question="What is 2 + 2?", temperature=0, max_new_tokens=6)["answer"]
        got = answer.run(question="What is 2 + 2?", temperature=0, max_new_tokens=6,
                         backend=endpoint)["answer"]
        assert got == want

        @sgl.function
        def forked(s):
            s += "List two colors:" + " red and"
            forks = s.fork(2)
            forks += sgl.gen("more", max_tokens=3)
            forks.join()
            s += " The sky is " + sgl.select("c", choices=["blue", "green"])

        before = runtime.info()["pinned"]
        state = forked.run(temperature=0, backend=endpoint)
        assert len(state["more"]) == 2 and state["c"] in ("blue", "green")
        assert runtime.info()["pinned"] == before  # the fork's pin went with its join
        assert sgl.get_server_info(endpoint)["kv_total"] > 0
    finally:
        endpoint.close()


def test_sglang_spellings_radixrt_does_not_have_say_so(runtime):
    with pytest.raises(TypeError, match="stop_regex"):
        sgl.gen("x", stop_regex=r"\d")
    with pytest.raises(TypeError, match="max_tokens= / max_new_tokens="):
        sgl.gen("x", max_tokens=3, max_new_tokens=4)
    with pytest.raises(ValueError, match="temperature"):
        sgl.select("x", choices=["a", "b"], temperature=0.7)


def test_token_texts_streamed_meta_model_path_and_token_usage(runtime):
    import asyncio

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        sgl.global_config.default_backend.endpoint.get_model_name())

    @sgl.function
    def texts(s):
        s += "The capital of France is"
        s += sgl.gen("x", 6, return_logprob=True, top_logprobs_num=2,
                     return_text_in_logprobs=True, logprob_start_len=0)

    usage = runtime.token_usage
    usage.reset()
    meta = texts.run(temperature=0, ignore_eos=True).get_meta_info("x")
    for entry in meta["output_token_logprobs"] + meta["input_token_logprobs"]:
        assert entry[2] == tokenizer.decode([entry[1]])  # SGLang's shape: each id on its own
    assert all(text is not None for top in meta["output_top_logprobs"] for _, _, text in top)
    with pytest.raises(sgl.BackendError, match="not in the vocabulary"):
        runtime.token_texts([1, 10**9])  # the runtime's op refuses ids its model lacks
    assert (usage.prompt_tokens, usage.completion_tokens, usage.calls) == \
        (meta["prompt_tokens"], meta["completion_tokens"], 1)

    async def streamed() -> list[tuple[str, dict]]:
        state = texts.run(temperature=0, ignore_eos=True, stream=True)
        return [c async for c in state.text_async_iter("x", return_meta_data=True)]

    before = 0
    for piece, piece_meta in asyncio.run(streamed()):  # test_stream_logprobs' checks
        assert piece and piece_meta["completion_tokens"] == \
            piece_meta["output_token_logprobs_length"]
        assert len(piece_meta["output_token_logprobs"]) == \
            piece_meta["completion_tokens"] - before
        before = piece_meta["completion_tokens"]
    assert before == 6

    @sgl.function
    def number(s):
        s += "The number of days in a week is " + sgl.gen_int("days", 8) + " days."

    state = number.run(temperature=0)
    int(state["days"])  # ended at a space or a newline (not part of it), or at max_tokens
