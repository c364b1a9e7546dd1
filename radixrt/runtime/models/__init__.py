"""Llama-family model code (Llama, SmolLM2, Mistral, Qwen2, Qwen3) and weight loaders."""

from radixrt.runtime.models.llama import LlamaForCausalLM
from radixrt.runtime.models.loader import LoadedModel, default_model_path, load_model
from radixrt.runtime.models.model_config import ModelConfig

__all__ = ["LlamaForCausalLM", "LoadedModel", "ModelConfig", "default_model_path", "load_model"]
