"""The CPU kernels' library: built by the machine's compiler into a cache named by its sources,
compiler and CPU; a failed build says why (NativeUnavailable); it shares torch's OpenMP runtime;
and the code paths a machine without AVX-512 takes (the portable vector code) compute what the
references do: the sources built for AVX2 (x86-64-v3) and run here."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixrt.kernels import native
from radixrt.kernels.native import NativeUnavailable, build, load, native_library
from radixrt.kernels.packed_reference import PackedTensors, dequantize_ref


def test_the_library_is_cached_by_its_sources_and_shares_torchs_openmp() -> None:
    # loaded afresh: an earlier test of this process may have loaded it under another
    # RADIXRT_CACHE_DIR (its own folder, set for that test)
    native_library.cache_clear()
    lib = native_library()
    assert native_library() is lib  # one load per process
    path = Path(lib._name)
    assert path.parent == native.cache_dir() and path.exists()
    sources = sorted([*native.SOURCES.glob("*.cpp"), *native.SOURCES.glob("*.h")])
    assert path.name == f"radixrt_cpu_{native._digest(sources, native.compiler())}.so"
    # one libgomp.so.1 in a process that loads torch and the library: torch's (checked in a
    # process of its own: a test before this one in the same process may have loaded another
    # library's OpenMP runtime)
    code = ("import torch\nfrom radixrt.kernels.native import native_library\n"
            "import json\nnative_library()\nprint(json.dumps(sorted({line.split()[-1] for line in "
            "open('/proc/self/maps') if line.rstrip().endswith('libgomp.so.1')})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    gomp = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(gomp) == 1 and "torch" in gomp[0], gomp


def test_a_source_that_does_not_compile_is_refused_with_the_compilers_message(
        tmp_path: Path) -> None:
    bad = tmp_path / "bad.cpp"
    bad.write_text("int main( {\n")
    with pytest.raises(NativeUnavailable, match="(?s)could not compile.*bad.cpp"):
        build([bad], tmp_path / "out.so", native.compiler())
    assert not (tmp_path / "out.so").exists()


def test_a_machine_without_a_compiler_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    native_library.cache_clear()
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    try:
        with pytest.raises(NativeUnavailable, match="no C\\+\\+ compiler"):
            native_library()
    finally:
        native_library.cache_clear()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86-64 build level")
def test_the_portable_code_paths_compute_what_the_references_do(tmp_path: Path) -> None:
    """Built for AVX2 without AVX-512 (-march=x86-64-v3 after -march=native): the vector code
    GCC lowers to 256-bit halves, the fallbacks of every #if __AVX512F__."""
    from radixrt.kernels.cpu_attention import native_available
    from radixrt.kernels.reference import decode_attention_ref

    assert native_available()
    sources = sorted([*native.SOURCES.glob("*.cpp"), *native.SOURCES.glob("*.h")])
    out = tmp_path / "avx2.so"
    build(sources, out, native.compiler(), ("-march=x86-64-v3", "-mtune=generic"))
    lib = load(out)
    gen = torch.Generator().manual_seed(0)
    for kind, group, code in (("u4", 32, 0), ("i8", 16, 1)):
        codes = (torch.randint(0, 256, (40, 256), dtype=torch.uint8, generator=gen)[:, :128]
                 if kind == "u4" else
                 torch.randint(-128, 128, (40, 256), dtype=torch.int8, generator=gen))
        scales = torch.rand(40, 256 // group, generator=gen).half()
        w = PackedTensors(codes.contiguous(), scales, (scales * 0.5).contiguous(), kind, group,
                          256)
        x = torch.randn(3, 256, generator=gen)
        y = torch.empty(3, 40)
        assert lib.rx_packed_gemm(x.data_ptr(), 3, 256, w.codes.data_ptr(), w.scales.data_ptr(),
                                  w.biases.data_ptr(), code, group, 1, 40, y.data_ptr()) == 0
        torch.testing.assert_close(y, x @ dequantize_ref(w).T, rtol=1e-5, atol=1e-4)
        rows = torch.empty(40, 256)
        lib.rx_packed_rows(w.codes.data_ptr(), w.scales.data_ptr(), w.biases.data_ptr(), code,
                           group, 1, 256, 0, 40, rows.data_ptr())
        assert torch.equal(rows, dequantize_ref(w))
    k_cache, v_cache = torch.randn(2, 50, 2, 64, generator=gen)
    q = torch.randn(2, 6, 64, generator=gen)
    indptr, indices = torch.tensor([0, 17, 40]), torch.randperm(50, generator=gen)[:40]
    o, ref = torch.empty_like(q), torch.empty_like(q)
    assert lib.rx_decode_attention(q.data_ptr(), o.data_ptr(), k_cache.data_ptr(),
                                   v_cache.data_ptr(), None, indptr.data_ptr(),
                                   indices.data_ptr(), 2, 6, 2, 64, 0.125, 0, 0.0, None,
                                   None) == 0
    decode_attention_ref(q, ref, k_cache, v_cache, indptr, indices, 0.125)
    torch.testing.assert_close(o, ref, rtol=1e-5, atol=1e-5)
