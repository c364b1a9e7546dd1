"""Images through every HTTP surface of a real `radixrt serve` on a tiny LLaVA-1.5
(tests/tiny_vlms.py), with the official openai and anthropic clients: OpenAI chat image_url parts
(data: and http URLs), the Responses API's input_image, Anthropic's image blocks (base64 and
URL sources), SGLang's /generate image_data (plain base64, data: URLs, local paths, batches).
Each answers what the in-process Engine answers for the same picture and question, a repeated
image is a radix-cache hit, and every bad image (not an image, bad base64, too many, a URL that
does not answer or answers slowly, a refused address or path) is a 400 in the surface's error
shape naming the field, after which the server still serves.

One server for the module, started with --allowed-media-domains 127.0.0.1 (the test's own image
host on 127.0.0.1), --allowed-local-media-path (a temporary folder) and --media-fetch-timeout 2.
The refusal of private addresses is tested on that same server with URLs naming `localhost`:
it resolves to a loopback address too, but the option lists only the literal 127.0.0.1, and the
check is by the URL's host (so no second server, without the option, is started for it)."""

from __future__ import annotations

import base64
import io
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from serve_process import API_KEY, Server, free_port
from tiny_vlms import build_llava, images

from radixrt import Engine, SamplingParams

pytestmark = pytest.mark.slow  # starts real processes

QUESTION = "What is in this picture?"
MAX_TOKENS = 8
PICTURE, OTHER = images([(40, 50), (33, 33)], seed=3)
TIMEOUT_S = 2  # --media-fetch-timeout


def png(picture: Any) -> bytes:
    out = io.BytesIO()
    picture.save(out, format="PNG")  # lossless: the server decodes the very pixels
    return out.getvalue()


PNG = png(PICTURE)
B64 = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{B64}"
NOT_IMAGE_URL = "data:image/png;base64," + base64.b64encode(b"hello, no picture").decode()


class Hosted:
    """The test's image host (127.0.0.1) and its local folder."""

    def __init__(self, folder: Path) -> None:
        bodies = {"/pic.png": PNG, "/page.html": b"<html>no picture</html>"}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = bodies.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.port = self.http.server_address[1]
        self.silent = socket.socket()  # connects (the kernel's backlog), never answers
        self.silent.bind(("127.0.0.1", 0))
        self.silent.listen(8)
        self.folder = folder
        (folder / "pic.png").write_bytes(PNG)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.http.shutdown()
        self.silent.close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    folder = tmp_path_factory.mktemp("llava")
    build_llava(folder, tokenizer)
    return folder


@pytest.fixture(scope="module")
def expected(checkpoint: Path) -> Any:
    """The Engine's greedy answer to the question about PICTURE."""
    engine = Engine(str(checkpoint), max_total_tokens=1024, check_integrity=True)
    try:
        messages = [{"role": "user", "content": [{"type": "image", "image": PICTURE},
                                                 {"type": "text", "text": QUESTION}]}]
        return engine.generate(messages, SamplingParams(max_tokens=MAX_TOKENS,
                                                        temperature=0))[0]
    finally:
        engine.close()


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosted]:
    host = Hosted(tmp_path_factory.mktemp("media"))
    yield host
    host.close()


@pytest.fixture(scope="module")
def server(checkpoint: Path, hosted: Hosted, expected: Any) -> Iterator[Server]:
    srv = Server("--model", str(checkpoint), "--max-total-tokens", "2048", "--api-key", API_KEY,
                 "--log-level", "warning", "--check-integrity",
                 "--allowed-media-domains", "127.0.0.1",
                 "--allowed-local-media-path", str(hosted.folder),
                 "--media-fetch-timeout", str(TIMEOUT_S))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)


def chat(client: openai.OpenAI, *urls: str, **extra: Any) -> Any:
    parts = [{"type": "image_url", "image_url": {"url": url, "detail": "low"}} for url in urls]
    return client.chat.completions.create(
        model="default", max_tokens=MAX_TOKENS, temperature=0, **extra,
        messages=[{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}])


def refused(call: Any, *words: str, param: str | None = "messages") -> None:
    """`call()` is an HTTP 400 in OpenAI's error shape, naming `param`, whose message has
    every word."""
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    error = caught.value.response.json()["error"]
    assert error["param"] == param
    for word in words:
        assert word in error["message"], error["message"]


def test_chat_with_a_data_url_is_the_engines_answer_and_a_cache_hit_again(
        client: openai.OpenAI, expected: Any) -> None:
    first = chat(client, DATA_URL)
    assert first.choices[0].message.content == expected.text
    assert first.usage.prompt_tokens == expected.prompt_tokens  # 16 placeholders included
    again = chat(client, DATA_URL)
    assert again.choices[0].message.content == expected.text
    assert again.usage.prompt_tokens_details.cached_tokens == expected.prompt_tokens - 1
    streamed = chat(client, DATA_URL, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        expected.text
    other = chat(client, "data:image/png;base64," + base64.b64encode(png(OTHER)).decode())
    assert other.usage.prompt_tokens_details.cached_tokens < 16  # the image differs: no hit


def test_chat_fetches_an_allowed_host_and_refuses_a_private_one(
        client: openai.OpenAI, hosted: Hosted, expected: Any) -> None:
    out = chat(client, hosted.url("/pic.png"))
    assert out.choices[0].message.content == expected.text
    assert out.usage.prompt_tokens_details.cached_tokens > 0  # the same pixels as the data: URL
    refused(lambda: chat(client, hosted.url("/pic.png", host="localhost")),
            "loopback", "--allowed-media-domains localhost")


@pytest.mark.parametrize("case", ["not-an-image", "bad-base64", "html", "missing", "too-many",
                                  "closed-port", "silent", "local-path", "ftp"])
def test_a_bad_image_is_a_400_and_the_server_keeps_serving(
        client: openai.OpenAI, hosted: Hosted, expected: Any, case: str) -> None:
    silent = hosted.silent.getsockname()[1]
    urls, words = {
        "not-an-image": ([NOT_IMAGE_URL], ["image 0", "not an image"]),
        "bad-base64": (["data:image/png;base64,@@not base64@@"], ["not valid base64"]),
        "html": ([DATA_URL, hosted.url("/page.html")], ["image 1", "not an image"]),
        "missing": ([hosted.url("/nothing.png")], ["HTTP 404"]),
        "too-many": ([DATA_URL] * 17, ["17 images", "at most 16"]),
        "closed-port": ([f"http://127.0.0.1:{free_port()}/pic.png"], ["cannot connect"]),
        "silent": ([f"http://127.0.0.1:{silent}/pic.png"], [f"did not answer in {TIMEOUT_S} s"]),
        "local-path": (["/etc/hostname"], ["outside the folder", "--allowed-local-media-path"]),
        "ftp": (["ftp://127.0.0.1/pic.png"], ["unsupported URL scheme"]),
    }[case]
    refused(lambda: chat(client, *urls), *words)
    assert chat(client, DATA_URL).choices[0].message.content == expected.text


def test_an_image_outside_a_user_message_is_a_400(client: openai.OpenAI) -> None:
    image = {"type": "image_url", "image_url": {"url": DATA_URL}}
    refused(lambda: client.chat.completions.create(model="default", max_tokens=2, messages=[
        {"role": "system", "content": [image]}, {"role": "user", "content": "Hi"}]),
        "only user messages carry images")


def test_anthropic_image_blocks(server: Server, hosted: Hosted, expected: Any) -> None:
    claude = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)
    sources = [{"type": "base64", "media_type": "image/png", "data": B64},
               {"type": "url", "url": hosted.url("/pic.png")}]
    for source in sources:
        messages = [{"role": "user", "content": [{"type": "image", "source": source},
                                                 {"type": "text", "text": QUESTION}]}]
        msg = claude.messages.create(model="default", max_tokens=MAX_TOKENS, messages=messages,
                                     extra_body={"temperature": 0.0})
        assert msg.content[0].text == expected.text
        usage = msg.usage
        assert usage.input_tokens + usage.cache_read_input_tokens == expected.prompt_tokens
        counted = claude.messages.count_tokens(model="default", messages=messages)
        assert counted.input_tokens == expected.prompt_tokens
    bad = {"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="default", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image", "source": bad}]}])
    body = caught.value.response.json()
    assert body["type"] == "error" and "not an image" in body["error"]["message"]


def test_responses_input_image(client: openai.OpenAI, hosted: Hosted, expected: Any) -> None:
    for url in (DATA_URL, hosted.url("/pic.png")):
        response = client.responses.create(
            model="default", max_output_tokens=MAX_TOKENS, temperature=0, store=False,
            input=[{"role": "user", "content": [
                {"type": "input_image", "image_url": url, "detail": "auto"},
                {"type": "input_text", "text": QUESTION}]}])
        assert response.output_text == expected.text
        assert response.usage.input_tokens == expected.prompt_tokens
    refused(lambda: client.responses.create(model="default", max_output_tokens=2, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": NOT_IMAGE_URL}]}]),
        "not an image")


def native(server: Server, **body: Any) -> httpx.Response:
    body.setdefault("sampling_params", {"max_new_tokens": MAX_TOKENS, "temperature": 0})
    return httpx.post(f"{server.url}/generate", json=body, headers=server.headers(), timeout=60)


def test_native_generate_image_data(server: Server, checkpoint: Path, hosted: Hosted,
                                    expected: Any) -> None:
    """A text prompt writes the model's image token once per image (here the chat template's
    text: the chat surfaces' prompt)."""
    from transformers import AutoTokenizer

    template = [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                 "text": QUESTION}]}]
    prompt = AutoTokenizer.from_pretrained(checkpoint).apply_chat_template(
        template, tokenize=False, add_generation_prompt=True)
    for image_data in (B64, DATA_URL, [str(hosted.folder / "pic.png")], {"url": DATA_URL}):
        out = native(server, text=prompt, image_data=image_data)
        assert out.status_code == 200, out.text
        assert out.json()["text"] == expected.text
        assert out.json()["meta_info"]["prompt_tokens"] == expected.prompt_tokens
    batch = native(server, text=[prompt, prompt], image_data=[B64, [hosted.url("/pic.png")]])
    assert [one["text"] for one in batch.json()] == [expected.text] * 2
    for image_data, words in ((NOT_IMAGE_URL, "not an image"),
                              ([B64, B64], "1 image tokens"), ("bm90IGFuIGltYWdl", "image 0")):
        out = native(server, text=prompt, image_data=image_data)
        assert out.status_code == 400 and words in out.json()["error"]["message"], out.text
        assert out.json()["error"]["param"] == "image_data"
    many = native(server, text=[prompt, prompt], image_data=[[B64] * 9, [B64] * 9])
    assert many.status_code == 400 and "18 images in one request" in many.text  # all prompts'
    logprobs = native(server, text=prompt, image_data=B64, return_logprob=True,
                      logprob_start_len=0)
    assert logprobs.status_code == 200, logprobs.text  # the image token's rows included
    assert len(logprobs.json()["meta_info"]["input_token_logprobs"]) == expected.prompt_tokens
    server.wait_idle()


def test_the_encoders_cache_and_the_decoded_pictures_in_server_info_and_metrics(
        server: Server, client: openai.OpenAI, expected: Any) -> None:
    """A picture whose prefix left the radix tree (flushed) is not encoded again: the vision
    encoder's cache has its features; the pictures decoded for requests are freed with them."""
    assert chat(client, DATA_URL).choices[0].message.content == expected.text  # encoded once
    before = server.info()
    assert before["images_encoded"] >= 1 and before["image_encode_seconds"] > 0
    httpx.post(f"{server.url}/flush_cache", headers=server.headers()).raise_for_status()
    again = chat(client, DATA_URL)
    assert again.choices[0].message.content == expected.text
    assert again.usage.prompt_tokens_details.cached_tokens == 0  # the tree had nothing
    after = server.info()
    assert after["images_encoded"] == before["images_encoded"], "encoded again"
    assert after["image_cache_hits"] == before["image_cache_hits"] + 1
    assert after["decoded_image_bytes"] == 0 and after["decoded_images_refused"] == 0
    text = httpx.get(f"{server.url}/metrics", headers=server.headers()).text
    assert f"radixrt_image_cache_hits {float(after['image_cache_hits'])}" in text
    assert "radixrt_decoded_image_bytes 0.0" in text
