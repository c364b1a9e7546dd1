"""Extract a JSON record from text with a JSON schema: `gen(json_schema=...)`.

The runtime compiles the schema into a grammar over the model's vocabulary, masks every token the
grammar does not allow, and appends the keys and punctuation the schema fixes without model steps
(jump-forward), so every output parses and validates. The records of several passages are
extracted as one batch (`run_batch`).

`extract_person_fields` shows the pattern for backends without constrained decoding (e.g. an
OpenAI-compatible server): the program writes the JSON skeleton itself and the model fills in
only the values, each string a `gen` that stops at the closing quote, enums as `select`s.

Run:  HF_HUB_OFFLINE=1 .venv/bin/python examples/json_extraction.py
"""

from __future__ import annotations

import json
import time
from typing import Any

import radixrt as rx

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "job": {"type": "string", "maxLength": 24},
        "status": {"enum": ["employed", "student", "retired"]},
        "has_pet": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "job", "status", "has_pet"],
}
STATUSES = PERSON_SCHEMA["properties"]["status"]["enum"]

SYSTEM = """Extract facts about the person in the text as JSON.

Example text: Tom Baker is a 52-year-old doctor from Leeds. He has two cats.
Example JSON:
{"name": "Tom Baker", "age": 52, "city": "Leeds", "job": "doctor", "status": "employed", \
"has_pet": true}"""

PASSAGES = [
    "Maria Lopez is a 34-year-old engineer who lives in Madrid. She has a dog called Rex.",
    "Kenji Sato, 71, is a former teacher from Osaka. He lives alone and has no pets.",
    "Anna Schmidt is a 20-year-old student of biology in Berlin. She has a cat.",
]


@rx.function
def extract_person(s, passage):
    s += rx.system(SYSTEM)
    s += rx.user("Text: " + passage)
    s += rx.assistant(rx.gen("record", json_schema=PERSON_SCHEMA, max_tokens=96, temperature=0))


@rx.function
def extract_person_fields(s, passage):
    s += rx.system(SYSTEM)
    s += rx.user("Text: " + passage)
    with s.assistant():
        # Strings stop at the closing quote (the stop string is not part of the value), so the
        # program writes the quote itself; max_tokens keeps a confused model from rambling.
        s += '{"name": "' + rx.gen("name", max_tokens=12, stop='"', temperature=0)
        s += '", "age": ' + rx.gen("age", max_tokens=4, stop=[",", "}", " "], temperature=0)
        s += ', "city": "' + rx.gen("city", max_tokens=8, stop='"', temperature=0)
        s += '", "job": "' + rx.gen("job", max_tokens=8, stop='"', temperature=0)
        s += '", "status": "' + rx.select("status", STATUSES)
        s += '", "has_pet": ' + rx.select("has_pet", ["true", "false"])
        s += "}"


def main(backend: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    states = extract_person.run_batch([{"passage": p} for p in PASSAGES], backend=backend)
    elapsed = time.perf_counter() - t0

    records, texts = [], []
    for passage, state in zip(PASSAGES, states):
        text = state.messages()[-1]["content"]  # the assistant message: the assembled JSON
        record = json.loads(text)  # raises if a value broke the JSON (e.g. a non-numeric age)
        texts.append(text)
        records.append(record)
        print(f"{passage}\n  -> {json.dumps(record)}")
    print(f"{len(records)} records in {elapsed:.1f}s")
    return {"passages": PASSAGES, "records": records, "texts": texts, "seconds": elapsed}


if __name__ == "__main__":
    with rx.Runtime(max_total_tokens=16384) as runtime:
        main(runtime)
