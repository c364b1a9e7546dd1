"""Image references a client sent (OpenAI `image_url.url`, an Anthropic image `source`, a DSL
path) turned into validated bytes and a decoded PIL image, without opening an SSRF hole.

Each refusal is a MediaError (a ValueError: the HTTP layer answers a 400) naming the problem and
the fix. The rules:

- `data:[<mime>][;base64],<payload>`: base64 (strict) or percent-encoded, bounded by `max_bytes`
  before decoding (from the payload's length) and after.
- `http://`, `https://` only. The host is resolved once; if any of its addresses is loopback,
  private, link-local, reserved, multicast, unspecified or otherwise not public (IPv4-mapped,
  6to4 and NAT64 forms too), the fetch is refused unless the host (exact name or IP literal) is
  in `allowed_domains`. The connection goes to the checked address (no second lookup, no DNS
  rebinding), with the URL's Host header and, for https, SNI and the certificate checked
  against the URL's host. Redirects are followed by hand, at most `max_redirects`, each hop
  checked alike; one to another scheme (file:, data:, ...) is refused. A final status outside
  2xx is refused; at most `max_bytes` are read. `timeout_s` bounds the whole fetch: lookups,
  connects, TLS, headers and bodies of every hop.
- Local files (`file://` URLs, plain paths, relative ones from the current directory): only
  regular files whose real path (symlinks resolved) lies in the real `allowed_local_path`.
- Decoding checks width * height against `max_pixels` before decoding pixels (PIL's global
  MAX_IMAGE_PIXELS is left alone); the image comes back RGB, fully loaded.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import http.client
import io
import ipaddress
import os
import re
import socket
import ssl
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, unquote_to_bytes, urljoin, urlsplit

from radixrt.runtime.server_options import DEFAULT_MEDIA_FETCH_TIMEOUT_S

if TYPE_CHECKING:
    from PIL import Image


DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_REDIRECTS = 3
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")  # what decode_image reads (PIL's others not)
MAX_ASPECT_RATIO = 200  # the longer side at most this many times the shorter (Qwen2-VL's bound)
HTTP_SCHEMES = ("http", "https")
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
READ_CHUNK_BYTES = 64 * 1024
REQUEST_HEADERS = (("User-Agent", "radixrt-media-fetch"), ("Accept", "image/*, */*;q=0.5"),
                   ("Accept-Encoding", "identity"), ("Connection", "close"))
NAT64_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")
SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
SHOWN_REF_CHARS = 120  # a data: URL in an error message is cut to this many characters
DOMAINS_FLAG = "--allowed-media-domains"
LOCAL_PATH_FLAG = "--allowed-local-media-path"

AddrInfo = list[tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]]


class MediaError(ValueError):
    """An image reference that cannot be used; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class MediaPolicy:
    """What may be fetched or read, and the bounds on it.

    `allowed_domains` does not restrict public hosts (always allowed): it lifts the refusal of
    non-public addresses for the hosts it lists (names or IP literals, case-insensitive)."""

    allowed_domains: tuple[str, ...] = ()
    allowed_local_path: str | None = None
    timeout_s: float = DEFAULT_MEDIA_FETCH_TIMEOUT_S
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __post_init__(self) -> None:
        if min(self.timeout_s, self.max_bytes, self.max_pixels) <= 0 or self.max_redirects < 0:
            raise ValueError(f"{self}: the bounds must be positive (max_redirects >= 0)")


def load_media_bytes(ref: str, policy: MediaPolicy) -> bytes:
    """The bytes `ref` names (a data:, http(s):, file: URL or a local path), under `policy`."""
    if not (ref := ref.strip()):
        raise MediaError("empty image reference: send a data:, http:// or https:// URL")
    match = SCHEME_RE.match(ref)
    scheme = match.group(1).lower() if match else None
    if scheme == "data":
        return _data_url(ref, policy)
    if scheme in HTTP_SCHEMES:
        return _fetch_http(ref, policy)
    if scheme is None or scheme == "file":
        return _local_file(ref, scheme == "file", policy)
    raise MediaError(f"unsupported URL scheme {scheme!r} in {_shown(ref)}: send a data:, "
                     "http:// or https:// URL")


async def fetch_media_bytes(ref: str, policy: MediaPolicy) -> bytes:
    """load_media_bytes on a worker thread: the event loop never waits on the network or disk."""
    return await asyncio.to_thread(load_media_bytes, ref, policy)


def image_size(data: bytes, policy: MediaPolicy) -> tuple[int, int]:
    """The (width, height) `data`'s header gives, checked against the policy's bounds (bytes,
    pixels, aspect ratio) before any pixel is decoded."""
    with _opened(data, policy) as img:
        return img.size


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """`data` decoded as an RGB image, fully loaded; its size is checked before its pixels."""
    from PIL import ImageOps

    with _opened(data, policy) as img:
        try:
            img.load()
            # as transformers' load_image: a photo's EXIF orientation applied
            return ImageOps.exif_transpose(img).convert("RGB")
        except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, EOFError, ...
            raise _undecodable(e, len(data)) from e


@contextlib.contextmanager
def _opened(data: bytes, policy: MediaPolicy) -> Iterator[Image.Image]:
    """`data` opened (its header read), its size within the policy's bounds."""
    from PIL import Image

    if len(data) > policy.max_bytes:
        raise MediaError(f"the image is larger than {policy.max_bytes} bytes: send a smaller one")
    try:
        img = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except Exception as e:
        raise _undecodable(e, len(data)) from e
    with img:
        width, height = img.size
        if width * height > policy.max_pixels:
            raise MediaError(f"the image is {width}x{height} pixels, more than "
                             f"{policy.max_pixels}: send a smaller one")
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise MediaError(f"the image is {width}x{height} pixels: one side more than "
                             f"{MAX_ASPECT_RATIO} times the other; crop it")
        yield img


def _undecodable(e: Exception, size: int) -> MediaError:
    from PIL import Image

    if isinstance(e, MediaError):
        return e
    if isinstance(e, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return MediaError(f"the image is too large to decode ({e}): send a smaller one")
    if isinstance(e, Image.UnidentifiedImageError):  # its message names an in-memory file
        return MediaError(f"not an image (PNG, JPEG, GIF, WebP, BMP ...): its {size} bytes are "
                          "in no image format")
    return MediaError(f"not an image (PNG, JPEG, GIF, WebP, BMP ...): {e}")


def load_image(ref: str | bytes, policy: MediaPolicy) -> Image.Image:
    """Bytes are decoded as they are; a string is loaded by load_media_bytes, then decoded."""
    if isinstance(ref, str):
        return decode_image(load_media_bytes(ref, policy), policy)
    return decode_image(bytes(ref), policy)


def _shown(ref: str) -> str:
    return ref if len(ref) <= SHOWN_REF_CHARS else ref[:SHOWN_REF_CHARS] + "..."


def _too_big(what: str, policy: MediaPolicy) -> MediaError:
    return MediaError(f"{what} is larger than {policy.max_bytes} bytes: send a smaller image")


def _data_url(ref: str, policy: MediaPolicy) -> bytes:
    head, comma, payload = ref[len("data:"):].partition(",")
    if not comma:
        raise MediaError(f"malformed data: URL {_shown(ref)}: expected data:<mime>;base64,<data>")
    is_base64 = head.split(";")[-1].strip().lower() == "base64"
    payload = payload.strip() if is_base64 else payload
    if len(payload) * (3 if is_base64 else 4) // 4 > policy.max_bytes:  # before decoding
        raise _too_big("the data: URL's image", policy)
    try:
        data = base64.b64decode(payload, validate=True) if is_base64 else unquote_to_bytes(payload)
    except binascii.Error as e:
        raise MediaError(f"the data: URL's payload is not valid base64 ({e}): encode the "
                         "image with standard base64, padding included") from e
    if len(data) > policy.max_bytes:
        raise _too_big("the data: URL's image", policy)
    return data


def _local_file(ref: str, is_url: bool, policy: MediaPolicy) -> bytes:
    if policy.allowed_local_path is None:
        raise MediaError(f"local files are refused ({_shown(ref)}): start the server with "
                         f"{LOCAL_PATH_FLAG}")
    parts = urlsplit(ref) if is_url else None
    if parts and parts.netloc not in ("", "localhost"):
        raise MediaError(f"{_shown(ref)} names a remote host: a file: URL must be local")
    path = unquote(parts.path) if parts else ref
    try:
        real, root = os.path.realpath(path), os.path.realpath(policy.allowed_local_path)
        if os.path.commonpath([real, root]) != root:
            raise MediaError(f"{_shown(ref)} is outside the folder {LOCAL_PATH_FLAG} allows "
                             f"({policy.allowed_local_path}): refused")
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)  # a FIFO: no wait
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise MediaError(f"{_shown(ref)} is not a regular file: name an image file")
        with os.fdopen(fd, "rb") as f:
            data = f.read(policy.max_bytes + 1)
    except MediaError:
        raise
    except FileNotFoundError as e:
        raise MediaError(f"{_shown(ref)}: no such file: check the path") from e
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        raise MediaError(f"{_shown(ref)} cannot be read ({e}): check the path") from e
    if len(data) > policy.max_bytes:
        raise _too_big(_shown(ref), policy)
    return data


class _Deadline:
    """The end of a fetch: `left()` before each blocking step, and a timer that shuts the
    current connection down at the end (socket timeouts bound each read, not their sum: a server
    dribbling its answer would outlast them)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s, self.end = url, timeout_s, time.monotonic() + timeout_s
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def guard(self, sock: socket.socket | None) -> None:
        """The connection to shut down at the deadline (None before closing it)."""
        with self._lock:
            self._sock = sock

    def _fire(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            if self._sock is not None:
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def stop(self) -> None:
        self._timer.cancel()

    def passed(self) -> bool:
        return time.monotonic() >= self.end

    def expired(self) -> MediaError:
        return MediaError(f"{_shown(self.url)} did not answer in {self.timeout_s:g} s: check "
                          "that it is reachable, or send the image as a data: URL")

    def left(self) -> float:
        if (remaining := self.end - time.monotonic()) <= 0:
            raise self.expired()
        return remaining


def _refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address may not be fetched without being allowed (None: it is public)."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (
            ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in NAT64_PREFIX else None)
        if inner is not None and (why := _refusal(inner)):
            return why
    for kind in ("loopback", "link_local", "unspecified", "multicast", "private", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if ip.is_global else "non-public"


def _norm_host(host: str) -> str:
    host = host.strip().strip("[]").rstrip(".").lower()
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    return host


def _resolve(url: str, host: str, port: int, policy: MediaPolicy, deadline: _Deadline) -> AddrInfo:
    """getaddrinfo on a thread (it has no timeout of its own); every address checked."""
    box: list[AddrInfo | Exception] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            box.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except Exception as e:  # gaierror, or UnicodeError for a malformed name
            box.append(e)
        done.set()

    threading.Thread(target=lookup, daemon=True, name="media-dns").start()
    if not done.wait(deadline.left()):
        raise deadline.expired()
    if isinstance(found := box[0], Exception):
        raise MediaError(f"cannot resolve the host {host!r} of {_shown(url)} ({found}): check it")
    allowed = _norm_host(host) in {_norm_host(d) for d in policy.allowed_domains}
    for *_, sockaddr in found:
        why = _refusal(ipaddress.ip_address(sockaddr[0].split("%")[0]))
        if why and not allowed:
            raise MediaError(f"{_shown(url)} resolves to a {why} address ({sockaddr[0]}): "
                             f"refused; allow it with {DOMAINS_FLAG} {host}")
    return found


def _connect(url: str, host: str, port: int, addrs: AddrInfo, deadline: _Deadline
             ) -> socket.socket:
    """A TCP connection to the first of the checked addresses that answers."""
    failure: OSError | None = None
    for family, kind, proto, _, sockaddr in addrs:
        timeout, sock = deadline.left(), socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            return sock
        except OSError as e:
            sock.close()
            if isinstance(e, TimeoutError):
                raise deadline.expired() from e
            failure = e
    raise MediaError(f"cannot connect to {host} port {port} for {_shown(url)} ({failure}): "
                     "check the URL")


def _get(url: str, policy: MediaPolicy, deadline: _Deadline) -> tuple[bytes, str | None]:
    """One GET: (the body, None), or (b"", where it redirects to)."""
    parts, https = urlsplit(url), url[:6].lower() == "https:"
    try:
        host, port = parts.hostname, parts.port or (443 if https else 80)
    except ValueError as e:
        raise MediaError(f"malformed URL {_shown(url)} ({e}): check it") from e
    if not host or parts.username is not None:
        raise MediaError(f"{_shown(url)} names no host, or carries credentials (not "
                         "supported): send http(s)://host[:port]/path")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline.url = url
    sock = _connect(url, host, port, _resolve(url, host, port, policy, deadline), deadline)
    deadline.guard(sock)
    conn: http.client.HTTPConnection | None = None
    try:
        sock.settimeout(deadline.left())
        if https:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            deadline.guard(sock)
        conn = (http.client.HTTPSConnection if https else http.client.HTTPConnection)(host, port)
        conn.sock = sock  # connected to the checked address: http.client never looks it up
        conn.request("GET", target, headers=dict(REQUEST_HEADERS))
        resp = conn.getresponse()
        if resp.status in REDIRECT_STATUSES:
            location = resp.getheader("Location")
            if not location:
                raise MediaError(f"{_shown(url)} redirects ({resp.status}) without a Location")
            return b"", location
        if not 200 <= resp.status < 300:
            raise MediaError(f"{_shown(url)} answered HTTP {resp.status} {resp.reason}: check it")
        if resp.length is not None and resp.length > policy.max_bytes:
            raise _too_big(f"{_shown(url)} (Content-Length {resp.length})", policy)
        body = bytearray()
        while len(body) <= policy.max_bytes and deadline.left():  # left() raises when past
            if not (chunk := resp.read(min(READ_CHUNK_BYTES, policy.max_bytes + 1 - len(body)))):
                break
            body += chunk
        if deadline.passed():  # the body may have been cut at the deadline
            raise deadline.expired()
        if len(body) > policy.max_bytes:
            raise _too_big(_shown(url), policy)
        return bytes(body), None
    except MediaError:
        raise
    except (OSError, http.client.HTTPException) as e:
        if deadline.passed() or isinstance(e, TimeoutError):
            raise deadline.expired() from e
        if isinstance(e, ssl.SSLError):
            raise MediaError(f"TLS with {host} failed for {_shown(url)} ({e}): the server "
                             "needs a valid certificate for its name") from e
        raise MediaError(f"fetching {_shown(url)} failed ({e}): check the URL") from e
    finally:
        deadline.guard(None)
        (conn or sock).close()


def _fetch_http(ref: str, policy: MediaPolicy) -> bytes:
    deadline, url = _Deadline(ref, policy.timeout_s), ref
    try:
        for _ in range(policy.max_redirects + 1):
            body, location = _get(url, policy, deadline)
            if location is None:
                return body
            target = urljoin(url, location.strip())
            if (scheme := urlsplit(target).scheme.lower()) not in HTTP_SCHEMES:
                raise MediaError(f"{_shown(url)} redirects to a {scheme}: URL ({_shown(target)})"
                                 ": refused, only http(s) redirects are followed")
            url = target
    finally:
        deadline.stop()
    raise MediaError(f"{_shown(ref)} redirects more than {policy.max_redirects} times: refused; "
                     "send the image's final URL")
