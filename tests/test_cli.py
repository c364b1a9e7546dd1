"""`radixrt serve` refuses a bad configuration with one line naming the flag, before it starts
any process: a model that is not there, a device that is not there, a context past the model's
positions, an architecture no family implements, any invalid flag value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from radixrt.cli import as_flags, main
from radixrt.runtime.config import EngineConfig
from radixrt.runtime.worker.setup import check_config, context_length_for

TINY_MISTRAL = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "vocab_size": 96,
    "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "sliding_window": 128,
}


@pytest.fixture
def windowed(tmp_path: Path) -> str:
    """A checkpoint folder (config only: checks never read weights) with a 128-token window."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_MISTRAL))
    return str(tmp_path)


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("radixrt serve: "), err
    return err


@pytest.mark.parametrize(("argv", "expect"), [
    (["--model", "/no/such/model.gguf"], "--model='/no/such/model.gguf': no such GGUF file"),
    (["--model", "/no/such/folder"], "nothing is downloaded"),
    (["--model", "HuggingFaceTB/SmolLM2-135M"], "local paths only"),
    (["--device", "gpu"], "--device='gpu' is invalid: use auto, cpu, cuda or cuda:N"),
    (["--device", "cuda:7"], "--device='cuda:7'"),
    (["--page-size", "3"], "--page-size=3 is invalid"),
    (["--context-length", "99999"], "--context-length=99999 exceeds the model's 8192 positions"),
    (["--max-pinned-fraction", "1.5"], "--max-pinned-fraction=1.5 is invalid"),
    (["--max-running-requests", "0"], "--max-running-requests=0 is invalid"),
    (["--pin-lease-ttl", "0"], "--pin-lease-ttl=0.0 is invalid"),
    (["--port", "70000"], "--port=70000 is invalid"),
])
def test_a_bad_flag_is_one_line_naming_it(capsys: pytest.CaptureFixture[str], argv: list[str],
                                          expect: str) -> None:
    assert expect in refusal(capsys, *argv)


def test_a_folder_without_config_json_is_refused(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    assert "the folder has no config.json" in refusal(capsys, "--model", str(tmp_path))


def test_a_sliding_window_model_serves_its_whole_context(windowed: str) -> None:
    """Windows are exact at any length: a Mistral-style window no longer bounds the context."""
    check_config(EngineConfig(model=windowed, load_format="dummy"))
    from radixrt.runtime.models.loader import inspect_model

    config = inspect_model(windowed)
    assert config.windows == (128, 128) and config.sliding_window == 128
    assert context_length_for(EngineConfig(), config) == 256
    assert context_length_for(EngineConfig(context_length=100), config) == 100


def test_an_unsupported_architecture_is_refused_with_the_list(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY_MISTRAL,
                                                      "architectures": ["FalconForCausalLM"]}))
    err = refusal(capsys, "--model", str(tmp_path))
    assert "architecture 'FalconForCausalLM' is not supported" in err
    for name in ("LlamaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
                 "Olmo2ForCausalLM", "GraniteForCausalLM", "SmolLM3ForCausalLM"):
        assert name in err


def test_messages_name_flags_not_fields() -> None:
    names = ["page_size", "max_total_tokens", "context_length"]
    assert as_flags("EngineConfig.page_size=3 is invalid", names) == "--page-size=3 is invalid"
    assert as_flags("context_length=9 exceeds", names) == "--context-length=9 exceeds"
    assert as_flags("max_total_tokens=1 and page_size=2", names) == (
        "--max-total-tokens=1 and --page-size=2")
