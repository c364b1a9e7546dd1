"""Constrained decoding on the default model: JSON schemas, regexes and choices always hold,
jump-forward changes the number of model steps and nothing else, and constrained requests mix
with the rest of the runtime (radix cache, preemption, n > 1, seeds, bad input)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import jsonschema
import lark
import pytest
from cfg_grammars import GRAMMARS, PARSERS

from radixrt import SamplingParams


@pytest.fixture(params=[(False, "outlines"), (True, "llguidance")],
                ids=["inline-outlines", "overlap-llguidance"])
def variant(request: pytest.FixtureRequest) -> tuple[bool, str]:
    """Every test here runs twice: on an Engine that steps its worker inline with every grammar
    on outlines-core, and on one that overlaps planning with a worker thread, as the server
    does, with every grammar on llguidance. Both must hold every property."""
    return request.param


@pytest.fixture
def overlap(variant: tuple[bool, str]) -> bool:
    return variant[0]


@pytest.fixture
def make_engine(make_engine: Any, variant: tuple[bool, str]) -> Any:
    return lambda **options: make_engine(**{"grammar_backend": variant[1], **options})

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "email": {"type": "string", "format": "email"},
        "nickname": {"type": "string", "maxLength": 10},
    },
    "required": ["name", "age"],
}
SCHEMAS = [
    PERSON,
    {  # nested objects, an enum, an array with bounded items, a bounded number
        "type": "object",
        "properties": {
            "city": {"type": "object",
                     "properties": {"name": {"type": "string", "maxLength": 12},
                                    "country": {"enum": ["France", "Spain", "Italy"]}},
                     "required": ["name", "country"]},
            "temperatures": {"type": "array", "items": {"type": "integer", "minimum": -30,
                                                        "maximum": 45}, "maxItems": 4},
            "rating": {"type": "number", "minimum": 0, "maximum": 5},
        },
        "required": ["city", "temperatures", "rating"],
    },
    {  # strings with patterns, a boolean, an optional field
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "valid": {"type": "boolean"},
            "note": {"type": "string", "maxLength": 8},
        },
        "required": ["code", "valid"],
    },
]
PROMPTS = ["Reply with a JSON object describing the data: ",
           "Here is the JSON record you asked for: "]


def _run(engine: Any, prompts: list[str], params: list[SamplingParams]) -> list[Any]:
    return engine.generate(prompts, params)


def test_json_schemas_always_validate_greedy_and_sampled(make_engine):
    engine = make_engine()
    prompts, params, schemas = [], [], []
    for schema in SCHEMAS:
        for prompt in PROMPTS:
            for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 7}):
                prompts.append(prompt)
                params.append(SamplingParams(max_tokens=160, json_schema=schema, **sampling))
                schemas.append(schema)
    for out, schema in zip(_run(engine, prompts, params), schemas, strict=True):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)


REGEXES = [
    (r"-?(0|[1-9][0-9]{0,5})", "The answer, as an integer: "),
    (r"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])", "Today's date is "),
    (r"[a-z]{2,8}\.[a-z]{2,8}@[a-z]{3,8}\.(com|org|net)", "Contact e-mail: "),
    (r"(red|green|blue|light blue)", "My favourite color is "),
]


def test_regexes_always_match_in_full(make_engine):
    engine = make_engine()
    prompts, params, patterns = [], [], []
    for pattern, prompt in REGEXES:
        for sampling in ({"temperature": 0.0}, {"temperature": 1.2, "seed": 3},
                         {"temperature": 1.2, "seed": 4}):
            prompts.append(prompt)
            params.append(SamplingParams(max_tokens=40, regex=pattern, **sampling))
            patterns.append(pattern)
    for out, pattern in zip(_run(engine, prompts, params), patterns, strict=True):
        assert out.finish_reason == "stop"
        assert re.fullmatch(pattern, out.text), (pattern, out.text)


def test_choices_return_one_choice_exactly_with_n_and_seed(make_engine):
    engine = make_engine()
    choices = ["yes", "no", "maybe so", "no way"]
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=11, n=4, choices=choices)
    first = engine.generate("Is the sea salty? Answer:", params)[0]
    again = engine.generate("Is the sea salty? Answer:", params)[0]
    assert all(s.text in choices and s.finish_reason == "stop" for s in first.samples)
    assert [s.text for s in first.samples] == [s.text for s in again.samples]


def test_jump_forward_gives_identical_outputs_in_fewer_steps(make_engine):
    # without speculative decoding, which drafts forced tokens too
    on = make_engine(speculative_algorithm=None)
    off = make_engine(disable_jump_forward=True, speculative_algorithm=None)
    cases = [(PROMPTS[0], SamplingParams(max_tokens=120, temperature=0.0, json_schema=PERSON)),
             (PROMPTS[1], SamplingParams(max_tokens=120, temperature=0.9, seed=5,
                                         json_schema=SCHEMAS[1])),
             ("Pick one: ", SamplingParams(max_tokens=20, temperature=0.0,
                                           choices=["the first option", "the second option"]))]
    for prompt, params in cases:
        steps = []
        outs = []
        for engine in (on, off):
            before = engine.stats()["steps"]
            outs.append(engine.generate(prompt, params)[0])
            steps.append(engine.stats()["steps"] - before)
        assert outs[0].token_ids == outs[1].token_ids
        assert outs[0].text == outs[1].text
        assert steps[0] < steps[1], (prompt, steps)


def test_unconstrained_requests_are_unchanged_by_constrained_neighbours(make_engine):
    engine = make_engine()
    plain = [("The capital of France is", SamplingParams(max_tokens=16, temperature=0.0)),
             ("Once upon a time", SamplingParams(max_tokens=16, temperature=0.8, seed=2))]
    alone = _run(engine, [p for p, _ in plain], [s for _, s in plain])
    mixed_prompts = [PROMPTS[0], plain[0][0], PROMPTS[1], plain[1][0]]
    mixed_params = [SamplingParams(max_tokens=60, temperature=0.0, json_schema=PERSON),
                    plain[0][1], SamplingParams(max_tokens=20, regex=REGEXES[1][0]), plain[1][1]]
    mixed = _run(engine, mixed_prompts, mixed_params)
    assert mixed[1].token_ids == alone[0].token_ids
    assert mixed[3].token_ids == alone[1].token_ids


def test_constrained_and_unconstrained_share_the_radix_cache(make_engine):
    engine = make_engine()
    prefix = "A long shared context about people and their records. " * 6
    engine.generate(prefix + "Summary:", SamplingParams(max_tokens=4, temperature=0.0))
    out = engine.generate(prefix + "JSON:", SamplingParams(max_tokens=80, temperature=0.0,
                                                           json_schema=PERSON))[0]
    assert out.cached_tokens > 40
    jsonschema.validate(json.loads(out.text), PERSON)


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_grammar_state_survives_preemption(make_engine, preemption):
    digits = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
              "minItems": 16, "maxItems": 16}
    prompts = [f"Sixteen digits, record {i}: " for i in range(6)]
    params = [SamplingParams(max_tokens=60, temperature=0.0, json_schema=digits)] * 6
    roomy = _run(make_engine(), prompts, params)
    # each request fits alone, but not all six at once: the pool forces preemption
    tight = make_engine(max_total_tokens=96, preemption=preemption, schedule_policy="fcfs")
    squeezed = _run(tight, prompts, params)
    stats = tight.stats()
    assert stats["preemptions"] > 0 and (stats["swaps"] > 0) == (preemption == "swap")
    assert [o.token_ids for o in squeezed] == [o.token_ids for o in roomy]
    for out in squeezed:
        jsonschema.validate(json.loads(out.text), digits)


def test_rust_regex_syntax_is_accepted_and_enforced(make_engine):
    r"""Patterns are checked by the engine that runs them (Rust regex syntax on both):
    Unicode classes like \p{Lu} / \p{Ll}, which Python's re refuses, work and hold."""
    import unicodedata

    engine = make_engine()
    params = SamplingParams(max_tokens=32, temperature=0.8, seed=3, n=3,
                            regex=r"\p{Lu}\p{Ll}{2,6}( \p{Lu}\p{Ll}{2,6})?")
    out = engine.generate("A name of a city: ", params)[0]
    # greedy picks full-width letters, a token per byte: room for 14 letters of 3 bytes each
    greedy = engine.generate("A name of a city: ", SamplingParams(
        max_tokens=64, temperature=0, regex=params.regex))[0]
    assert greedy.finish_reason == "stop"
    for sample in [*out.samples, greedy.samples[0]]:
        # a letter may take several tokens: a sample cut by max_tokens is a prefix of a match
        whole = sample.finish_reason == "stop"
        text = sample.text if whole else sample.text.rstrip("\ufffd")  # a character cut short
        words = text.split(" ")
        assert sample.finish_reason in ("stop", "length") and 1 <= len(words) <= 2, sample.text
        for i, word in enumerate(words):
            cut = not whole and i == len(words) - 1
            assert (1 if cut else 3) <= len(word) <= 7, sample.text
            assert unicodedata.category(word[0]) == "Lu", sample.text
            assert all(unicodedata.category(c) == "Ll" for c in word[1:]), sample.text


@pytest.mark.parametrize(("kind", "grammar", "language"), GRAMMARS,
                         ids=[f"{k}-{lang}" for k, _, lang in GRAMMARS])
def test_context_free_grammars_hold(make_engine, kind, grammar, language):
    """GBNF and Lark grammars (arithmetic, a SQL subset, nested lists) on the model: greedy and
    sampled outputs all end and parse with Lark's own parser."""
    engine = make_engine()
    parser = lark.Lark(PARSERS[language], parser="earley")
    params = [SamplingParams(max_tokens=48, temperature=0.0, **{kind: grammar}),
              SamplingParams(max_tokens=48, temperature=1.0, seed=5, n=3, **{kind: grammar})]
    prompt = {"arithmetic": "An arithmetic expression: ", "sql": "A SQL query: ",
              "list": "A nested list: "}[language]
    for out in engine.generate([prompt, prompt], params):
        for sample in out.samples:
            assert sample.finish_reason == "stop", sample.text
            parser.parse(sample.text)


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("regex", "(ab", "unterminated|unclosed"),
    ("regex", "[z-a]", "regex"),
    ("json_schema", '{"type": "nonsense"}', "json_schema is invalid"),
    ("json_schema", "{not json", "json_schema is invalid"),
    ("json_schema", {"type": "integer", "minimum": 5, "maximum": 1}, "minimum"),
])
def test_invalid_patterns_are_refused_at_submit(make_engine, field, value, fragment):
    engine = make_engine()
    with pytest.raises(ValueError, match=fragment):
        engine.submit("x", SamplingParams(**{field: value}))
    out = engine.generate("2 + 2 =", SamplingParams(max_tokens=4, temperature=0.0,
                                                    regex="[0-9]+"))[0]
    assert re.fullmatch("[0-9]+", out.text)


def test_a_grammar_past_the_compile_timeout_is_refused_at_submit(make_engine):
    """outlines-core's check and compile run in a process stopped at grammar_compile_timeout:
    the request is refused naming the flag, and the engine serves the next ones."""
    engine = make_engine(grammar_backend="outlines", grammar_compile_timeout=2)
    start = time.monotonic()
    with pytest.raises(ValueError, match="--grammar-compile-timeout"):
        engine.submit("x", SamplingParams(regex="[ab]*a[ab]{17}"))
    assert time.monotonic() - start < 20
    out = engine.generate("Yes or no? ", SamplingParams(max_tokens=4, regex="(yes|no)"))[0]
    assert out.text in ("yes", "no")


def test_bad_combinations_are_refused():
    with pytest.raises(ValueError, match="at most one"):
        SamplingParams(regex="a", choices=["a"])
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(regex="a", ignore_eos=True)
    with pytest.raises(ValueError, match="choices"):
        SamplingParams(choices=["a", ""])


DISTINCT = 200  # constrained requests, each with a grammar of its own
GRAMMAR_BYTES_BOUND = 96 << 10  # the cache's bounds in this test: 6-8 of these grammars
GRAMMAR_COUNT_BOUND = 16
RSS_GROWTH_BOUND = 1 << 30  # the process, 200 grammars and their requests later


def test_200_distinct_grammars_stay_within_the_grammar_memory_bound(loaded_model):
    """200 constrained requests in one batch, each with its own grammar (100 regexes on
    outlines-core, 100 JSON schemas on llguidance: the default backend), through a cache held
    to 96 KiB: every output holds, the cache never passes its bound,
    each grammar is compiled exactly once (those evicted before their request was admitted are
    loaded from the Engine's grammar folder, never compiled inside a step), and the process
    grows by less than 1 GiB."""
    import psutil

    from radixrt import Engine

    engine = Engine(model=loaded_model, max_total_tokens=8192, check_integrity=True)
    try:
        compiler = engine.grammars
        compiler.max_bytes = GRAMMAR_BYTES_BOUND
        compiler.capacity = GRAMMAR_COUNT_BOUND
        regexes = [f"(yes|no)-{i:03d}" for i in range(DISTINCT // 2)]
        schemas = [{"type": "object", "properties": {f"k{i}": {"type": "integer", "minimum": i,
                                                               "maximum": i + 9}},
                    "required": [f"k{i}"]} for i in range(DISTINCT // 2)]
        params = [SamplingParams(regex=r, max_tokens=10, temperature=0) for r in regexes]
        params += [SamplingParams(json_schema=json.dumps(s), max_tokens=12, temperature=0)
                   for s in schemas]
        rss = psutil.Process().memory_info().rss
        bytes_seen: list[int] = []
        steps_before = engine.stats()["steps"]
        rids = [engine.submit("Answer: ", p) for p in params]
        outputs: dict[int, Any] = {}
        while len(outputs) < len(rids):
            engine.step()
            bytes_seen.append(compiler.cached_bytes)
            for rid in rids:
                if rid not in outputs and (out := engine.take_output(rid)) is not None:
                    outputs[rid] = out
        grown = psutil.Process().memory_info().rss - rss
        texts = [outputs[rid].text for rid in rids]
        for regex, text in zip(regexes, texts):
            assert re.fullmatch(regex, text), (regex, text)
        for schema, text in zip(schemas, texts[len(regexes):]):
            jsonschema.validate(json.loads(text), schema)
        assert compiler.compiled == DISTINCT  # none compiled twice
        assert max(bytes_seen) <= GRAMMAR_BYTES_BOUND
        assert engine.stats()["steps"] > steps_before
        assert grown < RSS_GROWTH_BOUND, grown
    finally:
        engine.close()
