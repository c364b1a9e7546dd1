"""HttpClient: an HTTP backend's requests, blocking where a program runs on a thread (`run`), and
made on the event loop where it runs as a greenlet (`arun`: lang/runners.py), so that thousands of
asyncio programs on an OpenAI-compatible server wait without a thread each.

The backend's code is written once, blocking: `request` and `stream` look at the greenlet they
are called from; in an arun program they switch to the loop (`await_`) while an
`httpx.AsyncClient` of that loop does the I/O. Each loop gets its own AsyncClient (an httpx
client belongs to the loop it was used on); they are dropped with their loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import weakref
from collections.abc import Iterator
from typing import Any

import httpx

from radixrt.frontend.lang.backend import BackendError
from radixrt.frontend.lang.runners import await_, in_loop_program


def error_message(response: httpx.Response) -> str:
    """What a refusing server said: its OpenAI-shaped error's message, else status and body."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:500]}"


class HttpClient:
    def __init__(self, headers: dict[str, str], timeout: float,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._sync = httpx.Client(headers=headers, timeout=timeout, transport=transport)
        self._headers, self._timeout = headers, timeout
        # an async client can use the transport only if it is async too (httpx's own and
        # MockTransport are both); with a blocking one, loop calls run on a worker thread
        self._async_transport = transport if transport is None or isinstance(
            transport, httpx.AsyncBaseTransport) else False
        self._loop_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop,
                                                      httpx.AsyncClient] = (
            weakref.WeakKeyDictionary())

    def request(self, method: str, url: str, json: Any = None) -> httpx.Response:
        if not in_loop_program():
            return self._sync.request(method, url, json=json)
        client = self._loop_client()
        if client is None:
            return await_(asyncio.to_thread(self._sync.request, method, url, json=json))
        return await_(client.request(method, url, json=json))

    @contextlib.contextmanager
    def stream(self, url: str, json: Any) -> Iterator[StreamedResponse]:
        """POST and read the response as it comes: `.status_code`, `.read()`, `.lines()`."""
        client = self._loop_client() if in_loop_program() else None
        if client is None:
            with self._sync.stream("POST", url, json=json) as response:
                yield StreamedResponse(response, on_loop=False)
            return
        response = await_(client.send(client.build_request("POST", url, json=json),
                                       stream=True))
        try:
            yield StreamedResponse(response, on_loop=True)
        finally:
            await_(response.aclose())

    def events(self, url: str, json: Any) -> Iterator[dict[str, Any]]:
        """POST and read the response's server-sent events as they come: each `data:` line's
        JSON, up to `data: [DONE]`. BackendError when the server refuses (its message) or does
        not answer."""
        try:
            with self.stream(url, json) as resp:
                if resp.status_code != 200:
                    raise BackendError(error_message(resp.read()))
                for line in resp.lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        yield jsonlib.loads(line[len("data: "):])
        except httpx.HTTPError as exc:
            raise BackendError(f"{url} did not answer: {exc}") from None

    def close(self) -> None:
        self._sync.close()

    def _loop_client(self) -> httpx.AsyncClient | None:
        if self._async_transport is False:
            return None
        loop = asyncio.get_running_loop()
        client = self._loop_clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(headers=self._headers, timeout=self._timeout,
                                       transport=self._async_transport)
            self._loop_clients[loop] = client
        return client


class StreamedResponse:
    def __init__(self, response: httpx.Response, on_loop: bool) -> None:
        self.response = response
        self.status_code = response.status_code
        self._on_loop = on_loop

    def read(self) -> httpx.Response:
        if self._on_loop:
            await_(self.response.aread())
        else:
            self.response.read()
        return self.response

    def lines(self) -> Iterator[str]:
        if not self._on_loop:
            yield from self.response.iter_lines()
            return
        lines = self.response.aiter_lines()
        while True:
            try:
                yield await_(lines.__anext__())
            except StopAsyncIteration:
                return
