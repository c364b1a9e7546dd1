"""Text that is not Unicode is refused at the door, on every route.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`): Python decodes it into a str that no
tokenizer, detokenizer or JSON encoder can take, so it has to be refused before a model (or an
error message) sees it. `CheckedTextRoute` is the app's route class: before a route parses its
JSON body it looks for such strings, values and keys alike, and answers 400 naming the first
field that holds one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from radixrt.runtime.server.core.error_shapes import APIError

# Every lone surrogate in a JSON text is an escape: `\ud800` to `\udfff`, any case. Bodies
# without this prefix are never parsed twice.
SURROGATE_ESCAPE = b"\\ud"


def lone_surrogate_at(value: Any, path: tuple[str, ...] = ()) -> tuple[tuple[str, ...], int] | None:
    """(the path of the first string in `value` that is not valid Unicode, the index of its
    first bad character), or None when every string (and every object key) is valid."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return path, exc.start
        return None
    if isinstance(value, list):
        items: Any = ((str(i), item) for i, item in enumerate(value))
    elif isinstance(value, dict):
        items = value.items()
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and lone_surrogate_at(key, path) is not None:
            return (*path, key.encode("utf-8", "backslashreplace").decode()), 0
        found = lone_surrogate_at(item, (*path, key))
        if found is not None:
            return found
    return None


def check_text(body: bytes) -> None:
    """Raise APIError (400) when the JSON `body` holds a string that is not valid Unicode.
    A body that is not JSON is left to the route (it says so itself)."""
    if SURROGATE_ESCAPE not in body.lower():
        return
    try:
        found = lone_surrogate_at(json.loads(body))
    except ValueError:
        return
    if found is None:
        return
    path, index = found
    field = ".".join(path) or "body"
    raise APIError(f"invalid request: {field}: the text is not valid Unicode (a lone UTF-16 "
                   f"surrogate at character {index}): send text, not half of a character pair",
                   param=path[0] if path else None)


class CheckedTextRoute(APIRoute):
    """An APIRoute whose requests' JSON bodies are checked by `check_text` first."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            check_text(await request.body())  # read once: the handler reads the cached body
            return await handler(request)

        return checked
