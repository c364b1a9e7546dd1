"""Media fetching (radixrt/runtime/tokenizer/media_fetch.py) against a real HTTP server on
127.0.0.1: what is refused (SSRF targets, other schemes, files outside the allowed folder, images
too large), what is followed (redirects, each hop re-checked), and the bounds on time and size."""

from __future__ import annotations

import asyncio
import base64
import io
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image, ImageFile

from radixrt.runtime.tokenizer.media_fetch import (
    MediaError,
    MediaPolicy,
    decode_image,
    fetch_media_bytes,
    load_image,
    load_media_bytes,
)

LOOPBACK = MediaPolicy(allowed_domains=("127.0.0.1",), timeout_s=2.0)


def png(width: int = 4, height: int = 3, mode: str = "RGBA") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height), "red").save(buf, "PNG")
    return buf.getvalue()


PNG = png()


class Handler(BaseHTTPRequestHandler):
    """The routes: an image, redirects, errors, oversized, slow and dribbled bodies."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        port = self.server.server_address[1]
        redirects = {"/redirect": "/img.png", "/to-file": "file:///etc/passwd",
                     "/to-data": "data:image/png;base64,AAAA", "/loop": "/loop",
                     "/to-localhost": f"http://localhost:{port}/img.png"}
        bodies = {"/img.png": PNG, "/slow": PNG, "/text": b"hello, this is not an image",
                  "/big": b"x" * 2000, "/big-unsized": b"x" * 2000, "/dribble": b"x" * 20}
        if self.path in redirects:
            self.send_response(302)
            self.send_header("Location", redirects[self.path])
            self.end_headers()
            return
        if (body := bodies.get(self.path)) is None:
            self.send_error(404)
            return
        time.sleep(1.0 if self.path == "/slow" else 0)  # past a 0.5 s timeout
        self.send_response(200)
        if self.path != "/big-unsized":  # HTTP/1.0 without Content-Length: read until close
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        step = 1 if self.path == "/dribble" else len(body)  # dribble: every read answers
        for i in range(0, len(body), step):  # quickly, the whole never does
            self.wfile.write(body[i:i + step])
            self.wfile.flush()
            time.sleep(0.1 if step == 1 else 0)

    def log_message(self, *args: object) -> None:
        pass  # quiet


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the slow handlers write to a client that gave up


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = QuietServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_loopback_is_refused_unless_its_host_is_allowed(base: str) -> None:
    """The server's own address is an SSRF target: refused, the message naming the flag."""
    with pytest.raises(MediaError, match=r"resolves to a loopback address \(127\.0\.0\.1\): "
                       r"refused; allow it with --allowed-media-domains 127\.0\.0\.1"):
        load_media_bytes(f"{base}/img.png", MediaPolicy())
    assert load_media_bytes(f"{base}/img.png", LOOPBACK) == PNG
    img = load_image(f"{base}/img.png", LOOPBACK)
    assert img.mode == "RGB" and img.size == (4, 3)


def test_a_name_is_allowed_only_by_that_name(base: str) -> None:
    """`localhost` is refused even when 127.0.0.1 is allowed; listing it (any case) allows it."""
    url = base.replace("127.0.0.1", "localhost") + "/img.png"
    with pytest.raises(MediaError, match="loopback address.*--allowed-media-domains localhost"):
        load_media_bytes(url, LOOPBACK)
    assert load_media_bytes(url, MediaPolicy(allowed_domains=("LocalHost",))) == PNG


@pytest.mark.parametrize(("url", "kind"), [
    ("http://10.0.0.1/x.png", "private"),
    ("http://192.168.1.1:8080/x.png", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::1]:9/x.png", "loopback"),
    ("http://[::ffff:127.0.0.1]/x.png", "loopback"),
    ("http://[::ffff:10.1.2.3]/x.png", "private"),
    ("http://0.0.0.0/x.png", "unspecified"),
    ("http://224.0.0.1/x.png", "multicast"),
    ("http://100.64.0.1/x.png", "non-public"),
    ("https://2130706433/x.png", "loopback"),  # 127.0.0.1 as one number
])
def test_non_public_addresses_are_refused_before_any_connection(url: str, kind: str) -> None:
    """Each is refused by its address alone, so with a tiny timeout a connect attempt would
    show up as a timeout message instead."""
    with pytest.raises(MediaError, match=f"resolves to a {kind} address"):
        load_media_bytes(url, MediaPolicy(timeout_s=0.5))


@pytest.mark.parametrize("ref", ["ftp://example.com/x.png", "gopher://example.com:70/_x",
                                 "javascript:alert(1)", "FILE2://x"])
def test_other_schemes_are_refused_by_name(ref: str) -> None:
    scheme = ref.split(":")[0].lower()
    with pytest.raises(MediaError, match=f"unsupported URL scheme '{scheme}'"):
        load_media_bytes(ref, LOOPBACK)


def test_redirects_are_followed_by_hand_and_each_hop_rechecked(base: str) -> None:
    """A redirect on the allowed host is followed; to another name, another scheme, or in a loop
    it is refused; max_redirects=0 follows none."""
    assert load_media_bytes(f"{base}/redirect", LOOPBACK) == PNG
    with pytest.raises(MediaError, match="redirects more than 0 times"):
        load_media_bytes(f"{base}/redirect", MediaPolicy(("127.0.0.1",), max_redirects=0))
    with pytest.raises(MediaError, match="--allowed-media-domains localhost"):
        load_media_bytes(f"{base}/to-localhost", LOOPBACK)
    with pytest.raises(MediaError, match="redirects to a file: URL .*only http"):
        load_media_bytes(f"{base}/to-file", LOOPBACK)
    with pytest.raises(MediaError, match="redirects to a data: URL"):
        load_media_bytes(f"{base}/to-data", LOOPBACK)
    with pytest.raises(MediaError, match="redirects more than 3 times"):
        load_media_bytes(f"{base}/loop", LOOPBACK)


def test_statuses_sizes_and_bodies_are_checked(base: str) -> None:
    small = MediaPolicy(allowed_domains=("127.0.0.1",), max_bytes=1000)
    with pytest.raises(MediaError, match="answered HTTP 404"):
        load_media_bytes(f"{base}/missing.png", LOOPBACK)
    with pytest.raises(MediaError, match=r"Content-Length 2000\) is larger than 1000 bytes"):
        load_media_bytes(f"{base}/big", small)
    with pytest.raises(MediaError, match="big-unsized is larger than 1000 bytes"):
        load_media_bytes(f"{base}/big-unsized", small)
    with pytest.raises(MediaError, match=r"not an image \(PNG, JPEG"):
        load_image(f"{base}/text", LOOPBACK)


@pytest.mark.parametrize("path", ["/slow", "/dribble"])
def test_the_whole_fetch_is_bounded_by_the_timeout(base: str, path: str) -> None:
    """A server that sleeps, and one that sends a byte every 0.1 s (no single read times out):
    both cut off at the deadline."""
    start = time.monotonic()
    with pytest.raises(MediaError, match=f"{path} did not answer in 0.5 s"):
        load_media_bytes(base + path, MediaPolicy(("127.0.0.1",), timeout_s=0.5))
    assert time.monotonic() - start < 1.0


def test_unreachable_and_unknown_hosts_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(MediaError, match=f"cannot connect to 127.0.0.1 port {port}"):
        load_media_bytes(f"http://127.0.0.1:{port}/x.png", LOOPBACK)

    def no_dns(*args: object, **kwargs: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(MediaError, match="cannot resolve the host 'images.example'"):
        load_media_bytes("https://images.example/x.png", MediaPolicy())
    with pytest.raises(MediaError, match="carries credentials"):
        load_media_bytes("http://127.0.0.1@images.example/x.png", MediaPolicy())


def test_data_urls() -> None:
    """base64 (strict) and percent-encoded payloads; the size is refused before decoding."""
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert load_media_bytes(url, MediaPolicy()) == PNG
    assert load_image(url, MediaPolicy()).size == (4, 3)
    assert load_media_bytes("data:,hello%20world", MediaPolicy()) == b"hello world"
    with pytest.raises(MediaError, match="not valid base64"):
        load_media_bytes("data:image/png;base64,iVBOR!!w0KGgo=", MediaPolicy())
    with pytest.raises(MediaError, match="larger than 100 bytes"):  # checked before decoding
        load_media_bytes("data:image/png;base64," + "!" * 200, MediaPolicy(max_bytes=100))
    with pytest.raises(MediaError, match="larger than 100 bytes"):
        load_media_bytes("data:text/plain," + "a" * 101, MediaPolicy(max_bytes=100))
    text = "data:image/png;base64," + base64.b64encode(b"not a png").decode()
    with pytest.raises(MediaError, match="not an image"):
        load_image(text, MediaPolicy())
    assert asyncio.run(fetch_media_bytes(url, MediaPolicy())) == PNG


def test_local_files_only_inside_the_allowed_folder(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside: by path, relative path or file:// URL. Outside, via a symlink escaping it, in a
    sibling folder sharing its prefix, or with no folder allowed: refused."""
    media, sibling = tmp_path / "media", tmp_path / "media2"
    for image in [media / "a.png", sibling / "b.png", tmp_path / "secret.png"]:
        image.parent.mkdir(exist_ok=True)
        image.write_bytes(PNG)
    (media / "escape.png").symlink_to(tmp_path / "secret.png")
    (media / "inner.png").symlink_to(media / "a.png")
    policy = MediaPolicy(allowed_local_path=str(media))
    assert load_media_bytes(str(media / "a.png"), policy) == PNG
    assert load_media_bytes((media / "a.png").as_uri(), policy) == PNG
    assert load_media_bytes(str(media / "inner.png"), policy) == PNG
    monkeypatch.chdir(media)
    assert load_media_bytes("a.png", policy) == PNG
    refused = [(tmp_path / "secret.png", "outside the folder --allowed-local-media-path"),
               (media / "escape.png", "outside"), (sibling / "b.png", "outside"),
               (media / ".." / "secret.png", "outside"), ("file:///etc/passwd", "outside"),
               (media / "nope.png", "no such file"), (media, "not a regular file")]
    for ref, why in refused:
        with pytest.raises(MediaError, match=why):
            load_media_bytes(str(ref), policy)
    with pytest.raises(MediaError, match="larger than 10 bytes"):
        load_media_bytes(str(media / "a.png"), MediaPolicy(allowed_local_path=str(media),
                                                            max_bytes=10))
    with pytest.raises(MediaError, match="start the server with --allowed-local-media-path"):
        load_media_bytes(str(media / "a.png"), MediaPolicy())


def test_decode_checks_the_pixel_count_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """An image over max_pixels is refused from its header (load is never called); one beyond
    PIL's own bomb bound too; palette and alpha images come back RGB."""
    assert decode_image(png(8, 8, "P"), MediaPolicy()).mode == "RGB"
    assert load_image(png(10, 10), MediaPolicy(max_pixels=100)).size == (10, 10)

    def no_load(self: ImageFile.ImageFile) -> None:
        raise AssertionError("pixels decoded before the size was checked")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_load)
    with pytest.raises(MediaError, match="is 100x100 pixels, more than 5000"):
        decode_image(png(100, 100), MediaPolicy(max_pixels=5000))
    monkeypatch.undo()
    head = bytearray(png(1, 1))  # its IHDR rewritten to 60000 x 60000
    head[16:24] = (60000).to_bytes(4, "big") * 2
    head[29:33] = zlib.crc32(bytes(head[12:29])).to_bytes(4, "big")
    with pytest.raises(MediaError, match="too large to decode|more than"):
        decode_image(bytes(head), MediaPolicy())
    with pytest.raises(MediaError, match="not an image"):
        decode_image(b"", MediaPolicy())


def self_signed_localhost(folder: Path) -> tuple[Path, Path]:
    """A certificate (its own CA) for the name `localhost` only, and its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key, now = ec.generate_private_key(ec.SECP256R1()), datetime.now(timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now - timedelta(1))
            .not_valid_after(now + timedelta(1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                       serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return folder / "cert.pem", folder / "key.pem"


def test_https_checks_the_certificate_against_the_urls_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Connected to the checked address, TLS still sends the URL's name (SNI) and verifies the
    certificate against it: a certificate for `localhost` is good for https://localhost only,
    and an untrusted one is refused."""
    cert, key = self_signed_localhost(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    names: list[str | None] = []
    server_ctx.sni_callback = lambda sock, sni, ctx: names.append(sni)
    server = QuietServer(("127.0.0.1", 0), Handler)
    server.socket = server_ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, both = server.server_address[1], MediaPolicy(("localhost", "127.0.0.1"), timeout_s=2)
    try:
        with pytest.raises(MediaError, match="TLS with localhost failed.*certificate"):
            load_media_bytes(f"https://localhost:{port}/img.png", both)  # not trusted yet
        trusting = ssl.create_default_context(cafile=str(cert))
        monkeypatch.setattr(ssl, "create_default_context", lambda: trusting)
        assert load_media_bytes(f"https://localhost:{port}/img.png", both) == PNG
        assert names[-1] == "localhost"
        with pytest.raises(MediaError, match="TLS with 127.0.0.1 failed"):
            load_media_bytes(f"https://127.0.0.1:{port}/img.png", both)
    finally:
        server.shutdown()
        server.server_close()
