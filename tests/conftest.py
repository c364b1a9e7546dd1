"""Session-wide fixtures: the default model is loaded once (ours and the HF reference), and every
engine a test builds runs the KV invariant check after each step and again at teardown."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# CI replays the same examples every run (a landing must not hinge on a lucky draw); locally,
# hypothesis explores new ones each time.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# Tests that use any of these fixtures (directly or through another) load the default model:
# they are marked `model`, and `make test-fast` leaves them out.
MODEL_FIXTURES = {"loaded_model", "hf_model", "tokenizer", "make_engine", "model_on_device"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)


@pytest.fixture(scope="session")
def loaded_model() -> Any:
    """Our model code on the default model's weights, float32 on the CPU."""
    from radixrt.runtime.models.loader import load_model

    return load_model("default", dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tokenizer(loaded_model: Any) -> Any:
    return loaded_model.tokenizer


@pytest.fixture(scope="session")
def hf_model() -> Any:
    """Hugging Face transformers on the same GGUF weights: the reference for correctness."""
    import torch
    from transformers import AutoModelForCausalLM

    from radixrt.runtime.models.loader import default_model_path

    folder, fname = default_model_path()
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    return model.eval()


@pytest.fixture
def overlap() -> bool:
    """How make_engine's engines drive their worker: inline (False) or, as the server does,
    overlapped on a worker thread (True). Modules that run both ways override this fixture."""
    return False


@pytest.fixture
def make_engine(loaded_model: Any, overlap: bool) -> Iterator[Callable[..., Any]]:
    """Build engines on the shared weights; each checks its KV invariants after every step, and
    at teardown must be idle: nothing running, nothing private, the pool all free or cached."""
    from radixrt import Engine

    engines: list[Any] = []

    def build(**options: Any) -> Any:
        options.setdefault("max_total_tokens", 4096)
        options.setdefault("overlap", overlap)
        engine = Engine(model=loaded_model, check_integrity=True, **options)
        engines.append(engine)
        return engine

    yield build
    for engine in engines:
        engine.check_integrity()
        stats = engine.stats()
        assert stats["running"] == 0 and stats["waiting"] == 0 and stats["swapped"] == 0
        assert stats["kv_private"] == 0 and stats["kv_locked"] == 0
        assert stats["kv_free"] + stats["kv_evictable"] == stats["kv_total"]
        assert stats["outputs_held"] == 0, "outputs submitted and never taken"
        engine.close()


@pytest.fixture(scope="module", params=["outlines", "llguidance"])
def compiler(request: pytest.FixtureRequest, table: Any) -> Iterator[Any]:
    """A grammar compiler over the test module's `table` fixture (its toy vocabulary), once per
    engine: the constrained-decoding tests that must hold on both engines ask for it (a module
    that defines its own `compiler` gets that one)."""
    from radixrt.runtime.constrained.compiler import GrammarCompiler

    compiler = GrammarCompiler(table, backend=request.param)
    yield compiler
    compiler.close()
