"""LoRA adapters while serving: POST /load_lora_adapter {"lora_name", "lora_path"} and POST
/unload_lora_adapter {"lora_name"} (SGLang's routes; vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter take the same bodies). The scheduler checks the adapter against the
model before anything is loaded; a refusal is a 400 naming what is wrong (a 404 for a name
that is not loaded), and the server goes on serving. A loaded adapter is served by its name as
OpenAI's `model`, /generate's `lora_path` and the DSL's `lora=`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from radixrt.runtime.config import MAX_NAME_CHARS, MAX_PATH_CHARS
from radixrt.runtime.server.core.error_shapes import APIError
from radixrt.runtime.server.core.http_openapi import documented
from radixrt.runtime.tokenizer.tokenizer_manager import TokenizerManager

RESERVED_NAMES = ("default",)  # `model` values that name the base model


class LoadLora(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    lora_path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)


class UnloadLora(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)


class LoraAdapterInfo(BaseModel):
    name: str
    path: str
    rank: int
    modules: list[str]
    digest: str


class LoraResult(BaseModel):
    success: bool
    message: str
    adapter: LoraAdapterInfo


def add_lora_routes(app: FastAPI, manager: TokenizerManager) -> None:
    @app.post("/load_lora_adapter", responses=documented(LoraResult, (400,)))
    @app.post("/v1/load_lora_adapter", responses=documented(LoraResult, (400,)))
    async def load(body: LoadLora) -> dict[str, Any]:
        if body.lora_name in (manager.model_name, *RESERVED_NAMES) or "\0" in body.lora_name:
            raise APIError(f"lora_name {body.lora_name!r} names the base model; choose "
                           "another name", param="lora_name")
        return answer(await manager.load_lora(body.lora_name, body.lora_path), "loaded",
                      "lora_path")

    @app.post("/unload_lora_adapter", responses=documented(LoraResult, (400, 404)))
    @app.post("/v1/unload_lora_adapter", responses=documented(LoraResult, (400, 404)))
    async def unload(body: UnloadLora) -> dict[str, Any]:
        return answer(await manager.unload_lora(body.lora_name), "unloaded", "lora_name")


def answer(result: dict[str, Any], done: str, param: str) -> dict[str, Any]:
    if not result.get("ok"):
        status = int(result.get("status", 400))
        raise APIError(str(result.get("error")), status=status, param=param,
                       code="lora_not_found" if status == 404 else None)
    adapter = result["adapter"]
    return {"success": True, "message": f"LoRA adapter {adapter['name']!r} {done}",
            "adapter": adapter}
