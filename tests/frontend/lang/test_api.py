"""The DSL against a live local runtime (`rx.Runtime()`: the real process trio over ZeroMQ) on the
default model: every primitive, prefix reuse seen in the runtime's counters, errors, and the
same programs through RuntimeEndpoint and OpenAICompatible."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import torch

import radixrt as rx
from radixrt import SamplingParams

pytestmark = pytest.mark.slow  # starts real processes

FACTS = ("Paris is the capital of France. Berlin is the capital of Germany. Madrid is the "
         "capital of Spain. Rome is the capital of Italy. Lisbon is the capital of Portugal. ")


@pytest.fixture(scope="module")
def rt() -> Iterator[rx.Runtime]:
    runtime = rx.Runtime(max_total_tokens=8192, check_integrity=True, log_level="warning")
    yield runtime
    runtime.close()
    assert runtime.proc.returncode == 0, runtime.log_tail()


def counters_delta(rt: rx.Runtime, before: dict) -> dict[str, int]:
    after = rt.info()
    return {k: after[k] - before[k] for k in ("prompt_tokens", "cached_tokens", "computed_tokens")}


# --- gen ---------------------------------------------------------------------------------------
def test_gen_equals_the_engine_with_max_tokens_and_stop(rt, make_engine):
    @rx.function
    def complete(s, prompt):
        s += prompt
        s += rx.gen("free", max_tokens=12, temperature=0)
        s += "\nAgain: " + prompt
        s += rx.gen("stopped", max_tokens=40, temperature=0, stop=".")

    state = complete.run(prompt="The capital of France is", backend=rt)
    engine = make_engine()
    first = engine.generate("The capital of France is", SamplingParams(max_tokens=12,
                                                                      temperature=0))[0]
    assert state["free"] == first.text
    assert state.get_meta_info("free")["completion_tokens"] == 12
    assert state.get_meta_info("free")["finish_reason"] == "length"
    prefix = "The capital of France is" + first.text + "\nAgain: The capital of France is"
    second = engine.generate(prefix, SamplingParams(max_tokens=40, temperature=0, stop=["."]))[0]
    assert state["stopped"] == second.text and "." not in state["stopped"]
    assert state.get_meta_info("stopped")["finish_reason"] == "stop"
    assert state.text() == prefix + second.text


# --- select ------------------------------------------------------------------------------------
def _hf_logprobs(hf_model, ids: list[int], start: int) -> list[float]:
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    return [logits[t - 1, ids[t]].item() for t in range(start, len(ids))]


@pytest.mark.parametrize("method", ["token_length_normalized", "greedy",
                                    "unconditional_likelihood_normalized"])
def test_select_scores_equal_a_direct_computation(rt, tokenizer, hf_model, method):
    text = FACTS + "Question: What is the capital of Germany? Answer:"
    choices = [" Paris", " Berlin", " the city of Madrid"]

    @rx.function
    def ask(s):
        s += text
        s += rx.select("answer", choices, method=method)

    state = ask.run(backend=rt)
    meta = state.get_meta_info("answer")
    prefix = tokenizer.encode(text)
    for i, choice in enumerate(choices):
        full = tokenizer.encode(text + choice)
        start = next(j for j, (a, b) in enumerate(zip(prefix + [-1], full)) if a != b)
        direct = _hf_logprobs(hf_model, full, start)
        assert meta["token_logprobs"][i] == pytest.approx(direct, abs=2e-3)
        if method == "unconditional_likelihood_normalized":
            alone = [tokenizer.eos_token_id if tokenizer.bos_token_id is None
                     else tokenizer.bos_token_id, *tokenizer.encode(choice,
                                                                    add_special_tokens=False)]
            uncond = _hf_logprobs(hf_model, alone, 1)
            assert meta["unconditional_token_logprobs"][i] == pytest.approx(uncond, abs=2e-3)
            expect = (sum(direct) - sum(uncond)) / len(direct)
        elif method == "greedy":
            expect = direct[0]
        else:
            expect = sum(direct) / len(direct)
        assert meta["scores"][i] == pytest.approx(expect, abs=2e-3)
    best = max(range(len(choices)), key=lambda i: (
        meta["token_logprobs"][i] if method == "greedy" else meta["scores"][i]))
    assert state["answer"] == choices[best]
    assert state.text() == text + choices[best]


# --- roles -------------------------------------------------------------------------------------
def test_roles_render_the_chat_template(rt, tokenizer):
    @rx.function
    def chat(s):
        s += rx.system("You answer briefly.")
        with s.user():
            s += "Name a color."
        s += rx.assistant(rx.gen("color", max_tokens=8, temperature=0))
        s += rx.user("And a fruit?")

    state = chat.run(backend=rt)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == state["color"]
    assert state.text() == tokenizer.apply_chat_template(messages, tokenize=False)

    @rx.function
    def no_system(s):
        s += rx.user("Hi")

    expected = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert no_system.run(backend=rt).text() == expected  # the template's default system prompt


# --- fork / join and prefix reuse --------------------------------------------------------------
def test_fork_prefix_is_computed_once_and_join_gathers(rt, tokenizer):
    prefix = FACTS * 3 + "Now list one more fact about Europe."
    num_tokens = len(tokenizer.encode(prefix))

    @rx.function
    def branches(s):
        s += prefix
        s += rx.select("kind", [" Europe", " Asia"])
        forks = s.fork(4)
        for i, f in enumerate(forks):
            f += f" Fact {i + 1}:"
            f += rx.gen("fact", max_tokens=6, temperature=0)
            f += rx.select("kind", [" true", " false"])  # re-set by every child
        forks.join()
        s += " Done."
        return len(forks)

    before = rt.info()
    state = branches.run(backend=rt)
    delta = counters_delta(rt, before)
    facts = state["fact"]
    assert isinstance(facts, list) and len(facts) == 4
    assert facts == [f["fact"] for f in state.forks]
    assert state["kind"] == [f["kind"] for f in state.forks]
    metas = state.get_meta_info("fact")
    assert [m["completion_tokens"] for m in metas] == [6] * 4
    assert state.return_value == 4
    assert state.text().startswith(prefix) and state.text().endswith(" Done.")
    # the prefix was computed once (by the pin) and then served from the cache 4 times
    assert delta["cached_tokens"] >= 4 * (num_tokens - 2)
    assert delta["computed_tokens"] < num_tokens + 4 * 30
    assert rt.info()["pinned"] == 0  # join released it


def test_run_batch_computes_the_few_shot_prefix_once(rt, tokenizer):
    shots = "".join(f"Q: What is {a} plus {b}?\nA: {a + b}\n\n" for a, b in
                    [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1), (4, 4), (6, 3)])

    @rx.function
    def few_shot(s, question):
        s += shots
        s += "Q: " + question + "\nA:"
        s += rx.select("answer", [" 2", " 4", " 6", " 8"])

    questions = [f"What is {a} plus {b}?" for a, b in [(1, 1), (2, 2), (3, 3), (4, 4), (1, 3)]]
    before = rt.info()
    states = few_shot.run_batch([{"question": q} for q in questions], backend=rt,
                                num_threads=5)
    delta = counters_delta(rt, before)
    assert [s["answer"] for s in states][:4] == [" 2", " 4", " 6", " 8"]
    shot_tokens = len(tokenizer.encode(shots))
    # traced constant prefix computed once; each program's select finds it cached
    assert delta["cached_tokens"] >= len(questions) * (shot_tokens - 2)
    assert delta["computed_tokens"] < shot_tokens + len(questions) * 60


# --- constrained decoding ----------------------------------------------------------------------
def test_gen_with_regex_json_schema_and_choices(rt):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                "rank": {"type": "integer", "minimum": 1,
                                                         "maximum": 9}},
              "required": ["city", "rank"]}

    @rx.function
    def extract(s):
        s += "Paris is the first city of France. As JSON: "
        s += rx.gen("record", json_schema=schema, max_tokens=40, temperature=0)
        s += "\nYear founded: " + rx.gen("year", regex=r"[0-9]{3,4}", max_tokens=8)
        s += "\nIs it big? " + rx.gen("big", choices=["yes", "no"], max_tokens=4)

    state = extract.run(backend=rt)
    record = json.loads(state["record"])
    assert set(record) == {"city", "rank"} and 1 <= record["rank"] <= 9
    assert re.fullmatch(r"[0-9]{3,4}", state["year"])
    assert state["big"] in ("yes", "no")
    # the same program over radixrt's OpenAI API (regex / choices extras, response_format)
    with rx.OpenAICompatible(f"{rt.base_url}/v1", model="default") as openai_backend:
        over_http = extract.run(backend=openai_backend)
    assert over_http["record"] == state["record"]  # greedy: the same JSON
    assert re.fullmatch(r"[0-9]{3,4}", over_http["year"]) and over_http["big"] in ("yes", "no")

    @rx.function
    def broken(s):
        s += "x" + rx.gen("y", regex="(ab")

    with pytest.raises(rx.BackendError, match="regex"):
        broken.run(backend=rt)


# --- streaming ---------------------------------------------------------------------------------
def test_streaming_yields_pieces_of_a_variable(rt):
    @rx.function
    def story(s):
        s += "Once upon a time"
        s += rx.gen("story", max_tokens=24, temperature=0, ignore_eos=True)

    state = story.run(backend=rt, stream=True)
    assert state.wait(timeout=120) is state
    pieces = list(state.text_iter("story"))
    assert len(pieces) > 1
    assert "".join(pieces) == state["story"]
    assert "".join(state.text_iter()) == state.text()


# --- errors ------------------------------------------------------------------------------------
def test_errors_surface_as_exceptions_and_the_runtime_keeps_serving(rt):
    @rx.function
    def too_long(s):
        s += "Hello"
        s += rx.gen("x", max_tokens=10**6)

    with pytest.raises(rx.BackendError, match="max_tokens"):
        too_long.run(backend=rt)

    @rx.function
    def bad_param(s):
        s += rx.gen("x", temperature=-1)

    with pytest.raises(ValueError, match="temperature"):
        bad_param.run(backend=rt)
    with pytest.raises(TypeError, match="unknown option"):
        rx.gen("x", max_tokenz=3)
    with pytest.raises(ValueError, match="choices"):
        rx.select("x", [])
    with pytest.raises(ValueError, match="method"):
        rx.select("x", ["a"], method="vote")

    @rx.function
    def nested(s):
        s += rx.user(rx.user("hi"))

    with pytest.raises(ValueError, match="do not nest"):
        nested.run(backend=rt)

    @rx.function
    def missing(s):
        s += "Hi"
        return s["nope"]

    with pytest.raises(KeyError, match="nope"):
        missing.run(backend=rt)

    @rx.function
    def fine(s):
        s += "2 + 2 ="
        s += rx.gen("x", max_tokens=3, temperature=0)

    assert fine.run(backend=rt)["x"]
    assert rt.info()["running"] == 0


def test_unreachable_endpoint_is_a_clear_error():
    with pytest.raises(rx.BackendError, match="no radixrt runtime answered"):
        rx.RuntimeEndpoint("tcp://127.0.0.1:9", connect_timeout=1)


# --- other backends ----------------------------------------------------------------------------
def test_openai_compatible_backend_runs_the_same_program(rt):
    @rx.function
    def qa(s):
        s += rx.user("What is the capital of Italy?")
        s += rx.assistant(rx.gen("answer", max_tokens=10, temperature=0))
        s += rx.user("Is that right?") + rx.assistant(rx.select("check", ["Yes", "No"]))
        s += " Sure? " + rx.select("sure", ["Yes, sure", "No"],
                                   method="unconditional_likelihood_normalized")

    native = qa.run(backend=rt)
    with rx.OpenAICompatible(f"{rt.base_url}/v1", model="default") as openai_backend:
        over_http = qa.run(backend=openai_backend)
    assert over_http.text() == native.text()
    for name in ("check", "sure"):  # unconditional scores too (they differed before)
        assert over_http.get_meta_info(name)["scores"] == pytest.approx(
            native.get_meta_info(name)["scores"], abs=2e-3), name
    got = over_http.get_meta_info("sure")["unconditional_token_logprobs"]
    want = native.get_meta_info("sure")["unconditional_token_logprobs"]
    assert [len(g) for g in got] == [len(w) for w in want]  # the first token is scored too
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=2e-3)


def test_frontend_over_a_remote_endpoint_does_not_import_torch(rt):
    code = textwrap.dedent(f"""
        import sys
        import radixrt as rx
        @rx.function
        def hello(s):
            s += "Hello, my name is"
            s += rx.gen("name", max_tokens=4, temperature=0)
        with rx.RuntimeEndpoint("{rt.address}") as ep:
            print(repr(hello.run(backend=ep)["name"]))
        assert "torch" not in sys.modules, "torch was imported"
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_a_gen_the_runtime_ends_with_an_error_raises(rt):
    """A prompt that fits the context but whose max_tokens can never fit the KV pool (8192
    slots): the runtime ends the request with "error: ... KV slots ..."; the program raises with
    that message instead of setting the variable to "" and going on."""
    @rx.function
    def probe(s):
        s += "Hi"
        s += rx.gen("x", max_tokens=1, temperature=0)

    prompt_tokens = probe.run(backend=rt).get_meta_info("x")["prompt_tokens"]
    fits_context = rt.info()["context_length"] - prompt_tokens

    @rx.function
    def too_big(s):
        s += "Hi"
        s += rx.gen("x", max_tokens=fits_context, temperature=0)
        s += "never reached"

    with pytest.raises(rx.BackendError, match="gen 'x' failed in the runtime: .*KV"):
        too_big.run(backend=rt)
    assert probe.run(backend=rt)["x"]  # the runtime keeps serving


def test_a_runtime_dies_with_the_program_that_started_it(tmp_path):
    """A program that started rx.Runtime() is SIGKILLed (no chance to clean up): the runtime's
    three processes are gone within seconds instead of living on, re-parented to init."""
    import signal
    import time

    import psutil

    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        import radixrt as rx
        rt = rx.Runtime(max_total_tokens=1024, log_level="warning")
        print(rt.proc.pid, flush=True)
        time.sleep(600)
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert line.strip().isdigit(), f"the owner did not start its runtime: {line!r}"
        launcher = psutil.Process(int(line))
        runtime = [launcher, *launcher.children(recursive=True)]
        assert len(runtime) >= 3  # tokenizer (the launcher), scheduler, worker
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in runtime):
            assert time.monotonic() < deadline, [p.pid for p in runtime if p.is_running()]
            time.sleep(0.2)
    finally:
        if owner.poll() is None:
            owner.kill()
        for p in psutil.process_iter():  # never leave a runtime behind, even on failure
            with contextlib.suppress(psutil.Error):
                if line.strip().isdigit() and p.pid == int(line):
                    p.kill()


def test_the_runtimes_model_threads_spin_briefly_then_sleep(rt):
    """The worker process starts with a short OpenMP spin (worker/cpu_waiting.py: a busy
    neighbouring process costs the runtime its share of the cores, no more); the scheduler runs
    no OpenMP threads."""
    import psutil

    from radixrt.runtime.worker.cpu_waiting import WAIT_SPINS

    cpu = rx.get_server_info(rt)["cpu"]  # the worker's own account
    assert cpu["threads"] == torch.get_num_threads() and cpu["kernels"]
    if not any(k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")):
        assert cpu["openmp_wait"] == f"GOMP_SPINCOUNT={WAIT_SPINS}"
    processes = {p.name(): p for p in psutil.Process(rt.proc.pid).children(recursive=True)}
    scheduler = next(p for name, p in processes.items() if "scheduler" in name)
    with open(f"/proc/{scheduler.pid}/maps") as f:  # no torch, no OpenMP threads
        assert not any("libgomp" in line for line in f)


# --- pins are leases ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def short_leases() -> Iterator[rx.Runtime]:
    """A runtime whose pins outlive their client's last renewal by 2 s only, and may lock a
    quarter of its 2048-token pool (512 tokens)."""
    runtime = rx.Runtime(max_total_tokens=2048, check_integrity=True, log_level="warning",
                         pin_lease_ttl=2, max_pinned_fraction=0.25)
    yield runtime
    runtime.close()


def _wait_for(predicate, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_a_client_killed_after_fork_loses_its_pins_within_the_ttl(short_leases, tmp_path):
    """A DSL client process SIGKILLed between fork() and join(): its pinned prefix and the KV
    it locks are released within the lease TTL (they used to stay locked forever)."""
    import signal

    script = tmp_path / "forker.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import radixrt as rx

        @rx.function
        def forked(s):
            s += {FACTS!r} + "Question: which city is the capital of France?"
            forks = s.fork(2)
            print("forked", flush=True)
            time.sleep(600)

        forked.run(backend=rx.RuntimeEndpoint({short_leases.address!r}))
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "forked"
        assert short_leases.info()["pinned"] == 1 and short_leases.info()["kv_locked"] > 0
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        released = _wait_for(lambda: short_leases.info()["pinned"] == 0, timeout=2 + 3)
        info = short_leases.info()
        assert released and info["kv_locked"] == 0, info
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_live_program_keeps_its_pin_past_the_ttl(short_leases):
    """The client renews in the background: a fork that lasts three TTLs keeps its prefix
    pinned (and the children find it cached); join releases it."""
    import time

    seen = {}

    @rx.function
    def slow_fork(s):
        s += FACTS + "Name a capital:"
        forks = s.fork(2)
        time.sleep(6)  # three leases' worth
        seen["pinned"] = short_leases.info()["pinned"]
        forks += rx.gen("city", max_tokens=4, temperature=0)
        forks.join()

    before = short_leases.info()
    slow_fork.run(backend=short_leases)
    assert seen["pinned"] == 1
    after = short_leases.info()
    assert after["pinned"] == 0 and after["kv_locked"] == 0
    assert after["cached_tokens"] - before["cached_tokens"] > 0  # the children hit the prefix


def test_a_fork_past_the_pin_budget_runs_unpinned_with_a_warning(short_leases):
    """The pin budget refuses a prefix of ~800 tokens (past 512): the program is warned, runs
    on and answers as a pinned run would; nothing stays locked."""
    long_facts = FACTS * 20

    @rx.function
    def wide_fork(s):
        s += long_facts + "Name a capital:"
        forks = s.fork(2)
        forks += rx.gen("city", max_tokens=4, temperature=0)
        forks.join()
        s += rx.gen("after", max_tokens=4, temperature=0)

    before = short_leases.info()
    with pytest.warns(RuntimeWarning, match="not pinned.*past the pin budget of 512"):
        state = wide_fork.run(backend=short_leases)
    after = short_leases.info()
    assert after["pins_refused"] == before["pins_refused"] + 1
    assert after["pinned"] == 0 and after["kv_locked"] == 0
    assert state["city"] and state["after"]
    assert after["cached_tokens"] - before["cached_tokens"] > 700  # still cached, just evictable
