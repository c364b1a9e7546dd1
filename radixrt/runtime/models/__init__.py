"""Model code (one decoder, a registry of families) and weight loaders."""

from radixrt.runtime.models.decoder import CausalLM
from radixrt.runtime.models.loader import LoadedModel, default_model_path, load_model
from radixrt.runtime.models.model_config import ModelConfig
from radixrt.runtime.models.registry import supported_architectures

__all__ = ["CausalLM", "LoadedModel", "ModelConfig", "default_model_path", "load_model",
           "supported_architectures"]
