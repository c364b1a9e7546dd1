"""The Debian packages some tests drive (Chromium, Prometheus): `make test` installs them
(scripts/install_test_tools.sh) and sets RADIXRT_REQUIRE_TOOLS=1, under which a missing one is a
failure; under plain pytest it is a skip that says what to install."""

from __future__ import annotations

import os

import pytest


def require_tool(path: str | None, name: str, package: str) -> str:
    """`path` if the tool was found; else a skip, or a failure under RADIXRT_REQUIRE_TOOLS=1."""
    if path:
        return path
    message = f"{name} is not installed: apt-get install {package} (make test installs it)"
    if os.environ.get("RADIXRT_REQUIRE_TOOLS") == "1":
        pytest.fail(f"{message} (RADIXRT_REQUIRE_TOOLS=1)")
    pytest.skip(message)
