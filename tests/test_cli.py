"""`radixrt serve` refuses a bad configuration with one line naming the flag, before it starts
any process: a model that is not there, a device that is not there, a context past the model's
positions, an architecture no family implements, any invalid flag value."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from radixrt.cli import SERVE_OPTIONS, build_parser, main
from radixrt.config_flags import add_flags, as_flags, flag_fields, flag_of, from_flags
from radixrt.plan_cli import ENGINE_FIELDS, PlanOptions
from radixrt.runtime.config import EngineConfig
from radixrt.runtime.server_options import ServerOptions
from radixrt.runtime.worker.setup import check_config, context_length_for

# Every flag `radixrt serve` and `radixrt plan` have: a flag lost (or one added) fails here.
SERVE_FLAGS = {
    "--model", "--task", "--dtype", "--device", "--load-format", "--weight-format",
    "--quantization",
    "--attention-backend", "--page-size",
    "--max-total-tokens", "--mem-fraction", "--context-length", "--max-running-requests",
    "--max-num-batched-tokens", "--schedule-policy", "--preemption", "--disable-radix-cache",
    "--disable-jump-forward", "--grammar-backend", "--grammar-compile-timeout",
    "--check-integrity", "--seed", "--cuda-graph-max-bs", "--host-cache-tokens",
    "--disk-cache-dir", "--disk-cache-tokens", "--enable-hierarchical-cache",
    "--max-pinned-fraction", "--priority-preemption", "--no-priority-preemption", "--fair-share",
    "--no-fair-share", "--fair-share-preemption", "--no-fair-share-preemption",
    "--fair-share-quantum", "--tenant-weights", "--cascade-attention", "--no-cascade-attention",
    "--speculative-algorithm", "--speculative-num-draft-tokens", "--speculative-max-batch-size",
    "--max-queued-requests",
    "--max-queued-per-tenant", "--tp-size", "--nnodes", "--node-rank", "--dist-init-addr",
    "--dist-backend", "--base-gpu-id", "--lora-paths", "--enable-lora", "--max-loras-per-batch",
    "--max-lora-rank", "--max-loaded-loras",  # EngineConfig's
    "--host", "--port", "--api-key", "--api-key-file", "--served-model-name", "--log-level",
    "--dsl-port", "--exit-with-parent", "--pin-lease-ttl", "--tool-call-parser",
    "--reasoning-parser", "--tool-call-enforcement", "--no-tool-call-enforcement", "--dp-size",
    "--disable-openapi", "--router-policy", "--disable-dashboard", "--dashboard-show-text",
    "--otlp-traces-endpoint", "--allowed-media-domains", "--allowed-local-media-path",
    "--media-fetch-timeout",  # ServerOptions'
    "-h", "--help",
}
PLAN_FLAGS = {
    "--model", "--page-size", "--mem-fraction", "--context-length", "--weight-format",
    "--quantization",  # EngineConfig's
    "--memory", "--dtype", "--prompt-tokens", "--mean-output-tokens", "--max-output-tokens",
    "--shared-prefix-tokens", "--requests", "--host-memory", "--disk-space",
    "--json",  # PlanOptions'
    "-h", "--help",
}

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
    def flags(message: str) -> str:
        return as_flags(message, SERVE_OPTIONS)

    assert flags("EngineConfig.page_size=3 is invalid") == "--page-size=3 is invalid"
    assert flags("context_length=9 exceeds") == "--context-length=9 exceeds"
    assert flags("max_total_tokens=1 and page_size=2") == "--max-total-tokens=1 and --page-size=2"
    assert flags("ServerOptions.pin_lease_ttl_s=0.0 is") == "--pin-lease-ttl=0.0 is"
    assert flags("ServerOptions.dsl_port=0 and port=1") == "--dsl-port=0 and --port=1"
    assert flags("EngineConfig.swap_space_tokens=-1") == "EngineConfig.swap_space_tokens=-1"


def subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
               if hasattr(a, "choices"))
    return sub.choices[name]


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings}


def test_the_flag_sets_are_what_they_were() -> None:
    assert options_of(subcommand("serve")) == SERVE_FLAGS
    assert options_of(subcommand("plan")) == PLAN_FLAGS


def test_every_serve_default_is_the_dataclass_default() -> None:
    """No flag restates a default: empty argv parses to the default-constructed dataclasses."""
    args = build_parser().parse_args(["serve"])
    assert from_flags(EngineConfig, args) == EngineConfig()
    assert from_flags(ServerOptions, args) == ServerOptions()
    for cls in SERVE_OPTIONS:
        for f in flag_fields(cls):
            assert getattr(args, f.name) == f.default, f.name
    args = build_parser().parse_args(["plan", "--memory", "80GiB"])
    assert from_flags(EngineConfig, args, only=ENGINE_FIELDS) == EngineConfig()
    assert from_flags(PlanOptions, args) == PlanOptions(memory="80GiB")


def test_every_flag_has_help_and_every_field_a_flag_or_a_reason() -> None:
    for cls in (*SERVE_OPTIONS, PlanOptions):
        for f in flag_fields(cls):
            assert f.metadata["help"].strip(), f"{cls.__name__}.{f.name}"
    hidden = {f.name for cls in SERVE_OPTIONS for f in cls.__dataclass_fields__.values()
              if not f.metadata.get("expose", True)}
    assert hidden == {"swap_space_tokens", "cascade_min_saved_reads", "replica_name"}
    assert flag_of(ServerOptions.__dataclass_fields__["pin_lease_ttl_s"]) == "--pin-lease-ttl"


@pytest.mark.parametrize(("argv", "cls", "kwargs"), [
    (["--schedule-policy", "sjf"], EngineConfig, {"schedule_policy": "sjf"}),
    (["--mem-fraction", "0.99"], EngineConfig, {"mem_fraction": 0.99}),
    (["--tp-size", "3", "--nnodes", "2", "--dist-init-addr", "h:1"], EngineConfig,
     {"tp_size": 3, "nnodes": 2, "dist_init_addr": "h:1"}),
    (["--log-level", "loud"], ServerOptions, {"log_level": "loud"}),
    (["--dsl-port", "0"], ServerOptions, {"dsl_port": 0}),
    (["--pin-lease-ttl", "90000"], ServerOptions, {"pin_lease_ttl_s": 90000.0}),
    (["--reasoning-parser", "o1"], ServerOptions, {"reasoning_parser": "o1"}),
    (["--router-policy", "sticky"], ServerOptions, {"router_policy": "sticky"}),
    (["--dp-size", "0"], ServerOptions, {"dp_size": 0}),
    (["--tenant-weights", "a:0"], EngineConfig, {"tenant_weights": "a:0"}),
    (["--fair-share-quantum", "0"], EngineConfig, {"fair_share_quantum": 0}),
    (["--host-cache-tokens", "-1"], EngineConfig, {"host_cache_tokens": -1}),
    (["--page-size", "16", "--host-cache-tokens", "8"], EngineConfig,
     {"page_size": 16, "host_cache_tokens": 8}),
    (["--disk-cache-tokens", "64"], EngineConfig, {"disk_cache_tokens": 64}),
    (["--page-size", "16", "--disk-cache-dir", "kv", "--disk-cache-tokens", "8"], EngineConfig,
     {"page_size": 16, "disk_cache_dir": "kv", "disk_cache_tokens": 8}),
    (["--host-cache-tokens", "64", "--disable-radix-cache"], EngineConfig,
     {"host_cache_tokens": 64, "disable_radix_cache": True}),
    (["--api-key", "k", "--api-key-file", "keys.txt"], ServerOptions,
     {"api_key": "k", "api_key_file": "keys.txt"}),
    (["--allowed-media-domains", "http://x.com"], ServerOptions,
     {"allowed_media_domains": ("http://x.com",)}),
    (["--allowed-local-media-path", "/no/such/folder"], ServerOptions,
     {"allowed_local_media_path": "/no/such/folder"}),
    (["--media-fetch-timeout", "0"], ServerOptions, {"media_fetch_timeout": 0.0}),
])
def test_a_bad_value_is_refused_by_the_dataclass_with_its_message(
        capsys: pytest.CaptureFixture[str], argv: list[str], cls: Any,
        kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as refused:
        cls(**kwargs)
    message = as_flags(str(refused.value), SERVE_OPTIONS)
    assert message.startswith("--") and " is invalid: " in message
    assert refusal(capsys, *argv) == f"radixrt serve: {message}"


@pytest.mark.parametrize(("argv", "expect"), [
    (["--memory", "80 parsecs"], "--memory='80 parsecs': give a size such as 80GiB"),
    (["--memory", "80GiB", "--mem-fraction", "0.99"], "--mem-fraction=0.99 is invalid"),
    (["--memory", "80GiB", "--page-size", "3"], "--page-size=3 is invalid"),
    (["--memory", "80GiB", "--requests", "0"], "--requests=0 is invalid: must be >= 1"),
    (["--memory", "80GiB", "--dtype", "int4"], "--dtype='int4' is invalid"),
])
def test_plan_refuses_as_the_dataclasses_do(capsys: pytest.CaptureFixture[str], argv: list[str],
                                            expect: str) -> None:
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("radixrt plan: ") and expect in err, err


def test_exclusive_flags_cannot_be_given_together(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--max-total-tokens", "4096", "--mem-fraction", "0.3"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@dataclass(frozen=True)
class Knobs:
    size: int = field(metadata={"help": "required: no default"})
    ratio: float = field(default=0.5, metadata={"help": "a float"})
    mode: Literal["a", "b"] = field(default="a", metadata={"help": "a Literal"})
    name: str | None = field(default=None, metadata={"flag": "label", "help": "renamed"})
    fast: bool = field(default=False, metadata={"help": "store_true"})
    safe: bool = field(default=True, metadata={"help": "--safe / --no-safe"})
    secret: str = field(default="x", metadata={"expose": False})

    def __post_init__(self) -> None:
        if self.mode not in ("a", "b"):
            raise ValueError(f"Knobs.mode={self.mode!r} is invalid: use a or b")


def test_the_generator_reads_types_from_annotations() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, Knobs, "knobs")
    assert options_of(parser) == {"-h", "--help", "--size", "--ratio", "--mode", "--label",
                                  "--fast", "--safe", "--no-safe"}
    args = parser.parse_args(["--size", "3", "--ratio", "2", "--label", "n", "--fast",
                              "--no-safe"])
    assert from_flags(Knobs, args) == Knobs(3, 2.0, "a", "n", True, False)
    assert from_flags(Knobs, parser.parse_args(["--size", "1"])) == Knobs(1)
    assert "{a,b}" in parser.format_help()
    with pytest.raises(ValueError, match="Knobs.mode='c' is invalid"):
        from_flags(Knobs, parser.parse_args(["--size", "1", "--mode", "c"]))
    with pytest.raises(SystemExit):
        parser.parse_args([])  # --size is required


def test_the_generator_refuses_fields_it_cannot_make_flags_of() -> None:
    @dataclass
    class NoHelp:
        x: int = 1

    @dataclass
    class Typo:
        x: int = field(default=1, metadata={"help": "x", "choises": (1, 2)})

    @dataclass
    class Listy:
        x: list[int] = field(default_factory=list, metadata={"help": "x"})

    for cls, fragment in ((NoHelp, "no help text"), (Typo, "unknown flag metadata"),
                          (Listy, "plain value")):
        with pytest.raises(ValueError, match=fragment):
            add_flags(argparse.ArgumentParser(), cls)


def test_media_flags_take_hosts_spaced_comma_separated_or_repeated(tmp_path: Path) -> None:
    args = build_parser().parse_args([
        "serve", "--allowed-media-domains", "a.example", "10.0.0.5,[::1]",
        "--allowed-media-domains", "b.example", "--allowed-local-media-path", str(tmp_path),
        "--media-fetch-timeout", "2.5"])
    options = from_flags(ServerOptions, args)
    assert options.allowed_media_domains == ("a.example", "10.0.0.5", "[::1]", "b.example")
    assert options.allowed_local_media_path == str(tmp_path)
    assert options.media_fetch_timeout == 2.5
    assert from_flags(ServerOptions, build_parser().parse_args(["serve"])) == ServerOptions()
    assert ServerOptions(allowed_media_domains="x, y").allowed_media_domains == ("x", "y")


def test_lora_paths_take_several_values() -> None:
    """--lora-paths NAME=PATH ...: one flag, several adapters, each checked for its form."""
    args = build_parser().parse_args(["serve", "--lora-paths", "a=/x", "b=/y/z"])
    config = from_flags(EngineConfig, args)
    assert config.lora_adapters() == {"a": "/x", "b": "/y/z"} and config.lora_enabled
    with pytest.raises(ValueError, match="NAME=PATH"):
        from_flags(EngineConfig, build_parser().parse_args(["serve", "--lora-paths", "a"]))
    with pytest.raises(ValueError, match="given twice"):
        EngineConfig(lora_paths={"a": "/x"}).with_(lora_paths=("a=/x", "a=/y"))
