"""The CPU kernels' shared library: kernels/cpu/*.cpp compiled on first use with the machine's
C++ compiler (g++, or $CXX) for this very CPU (-march=native), cached, and loaded with ctypes.

The library is built once per source text, compiler and CPU: its name is a digest of them, in
$RADIXRT_CACHE_DIR/kernels (default ~/.cache/radixrt/kernels). A build writes a temporary file
and renames it, so processes that build at once (tensor-parallel ranks, test workers) never load
half a library; the compile takes a few seconds, once.

It links OpenMP by its soname, libgomp.so.1: torch (imported first) has loaded its own copy
under that name, so the kernels run on torch's OpenMP threads, never on a second pool that would
spin against them.

`native_library()` raises NativeUnavailable (with the compiler's message) where no compiler works;
callers say so and take the PyTorch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401 - loads torch's libgomp before the library asks for libgomp.so.1

CACHE_DIR_ENV = "RADIXRT_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/radixrt"
SOURCES = Path(__file__).resolve().parent / "cpu"
CXX_FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-std=c++17", "-shared",
             "-fPIC", "-fno-strict-aliasing")
BUILD_TIMEOUT_S = 300

_C = ctypes
# argument types of every exported function (kernels/cpu/*.cpp, extern "C")
SIGNATURES: dict[str, list[type]] = {
    "rx_packed_gemm": [_C.c_void_p, _C.c_int64, _C.c_int64, _C.c_void_p, _C.c_void_p,
                       _C.c_void_p, _C.c_int, _C.c_int, _C.c_int, _C.c_int64, _C.c_void_p],
    "rx_packed_gather": [_C.c_void_p, _C.c_void_p, _C.c_void_p, _C.c_int, _C.c_int, _C.c_int,
                         _C.c_int64, _C.c_void_p, _C.c_int64, _C.c_void_p],
    "rx_packed_rows": [_C.c_void_p, _C.c_void_p, _C.c_void_p, _C.c_int, _C.c_int, _C.c_int,
                       _C.c_int64, _C.c_int64, _C.c_int64, _C.c_void_p],
    "rx_decode_attention": [_C.c_void_p, _C.c_void_p, _C.c_void_p, _C.c_void_p, _C.c_void_p,
                            _C.c_void_p, _C.c_void_p, _C.c_int64, _C.c_int64, _C.c_int64,
                            _C.c_int64, _C.c_float, _C.c_int64, _C.c_float, _C.c_void_p,
                            _C.c_void_p],
    "rx_store_kv": [_C.c_void_p, _C.c_void_p, _C.c_void_p, _C.c_void_p, _C.c_int64, _C.c_int64,
                    _C.c_void_p, _C.c_int64, _C.c_int64],
    "rx_rotate_qk": [_C.c_void_p, _C.c_int64, _C.c_int64, _C.c_void_p, _C.c_int64, _C.c_int64,
                     _C.c_int64, _C.c_void_p, _C.c_void_p, _C.c_int64, _C.c_int64],
    "rx_rmsnorm": [_C.c_void_p, _C.c_int64, _C.c_void_p, _C.c_void_p, _C.c_int64, _C.c_int64,
                   _C.c_float, _C.c_float],
    "rx_act_mul": [_C.c_int, _C.c_void_p, _C.c_int64, _C.c_int64, _C.c_void_p, _C.c_int64],
    "rx_decode_layers": [_C.c_void_p, _C.c_int64, _C.c_void_p],
    "rx_argmax_lse": [_C.c_void_p, _C.c_int64, _C.c_int64, _C.c_void_p, _C.c_void_p],
}
RESTYPES: dict[str, type | None] = {"rx_store_kv": None, "rx_rotate_qk": None,
                                     "rx_rmsnorm": None, "rx_act_mul": None,
                                     "rx_argmax_lse": None}


class NativeUnavailable(RuntimeError):
    """The CPU kernels could not be built or loaded here."""


def compiler() -> str:
    return os.environ.get("CXX") or "g++"


def _cpu_flags() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("flags", "model name", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def _digest(sources: list[Path], cxx: str) -> str:
    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    h.update(" ".join(CXX_FLAGS).encode() + version.stdout.encode() + _cpu_flags().encode())
    return h.hexdigest()[:24]


def cache_dir() -> Path:
    root = os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR
    return Path(root).expanduser() / "kernels"


def build(sources: list[Path], out: Path, cxx: str, extra_flags: tuple[str, ...] = ()) -> None:
    """Compile sources into the shared library `out` (written whole, then renamed into place):
    each translation unit on its own, all at once (the machine's cores), then linked."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        units = [p for p in sources if p.suffix == ".cpp"]  # headers: in the digest only
        objects = [Path(work) / f"{p.stem}.o" for p in units]
        compiles = [subprocess.Popen([cxx, *CXX_FLAGS, *extra_flags, "-c", str(src), "-o",
                                      str(obj)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
                    for src, obj in zip(units, objects)]
        errors = []
        for proc in compiles:
            _, err = proc.communicate(timeout=BUILD_TIMEOUT_S)
            if proc.returncode != 0:
                errors.append(err[-4000:])
        if errors:
            raise NativeUnavailable(f"{cxx} could not compile the CPU kernels:\n{errors[0]}")
        tmp = Path(work) / "lib.so"
        link = subprocess.run([cxx, *CXX_FLAGS, *extra_flags, *map(str, objects), "-o",
                               str(tmp)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S)
        if link.returncode != 0:
            raise NativeUnavailable(f"{cxx} could not link the CPU kernels:\n{link.stderr[-4000:]}")
        os.replace(tmp, out)


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = RESTYPES.get(name, ctypes.c_int)
    return lib


@functools.cache
def native_library() -> ctypes.CDLL:
    """The CPU kernels, built here on first use. NativeUnavailable where that cannot be done.
    Threads or processes that build at once each write their own file and rename it into
    place: the same bytes, whichever lands."""
    cxx = compiler()
    if shutil.which(cxx) is None:
        raise NativeUnavailable(f"no C++ compiler ({cxx!r}) to build the CPU kernels; install "
                                "g++ or set CXX")
    sources = sorted([*SOURCES.glob("*.cpp"), *SOURCES.glob("*.h")])
    try:
        path = cache_dir() / f"radixrt_cpu_{_digest(sources, cxx)}.so"
        if not path.exists():
            build(sources, path, cxx)
        return load(path)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeUnavailable(f"the CPU kernels could not be built or loaded: {exc}") from exc
