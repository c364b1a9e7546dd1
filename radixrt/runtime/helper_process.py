"""Helper processes started by module path, never by re-importing the caller's script.

multiprocessing's spawn start method re-imports the parent's main module in every child (as
`__mp_main__`): a plain script that builds an Engine at top level, with no
`if __name__ == "__main__":` guard, runs again inside each helper and dies there ("an attempt has
been made to start a new process before the current process has finished its bootstrapping
phase"). A HelperProcess runs `python -m radixrt.runtime.helper_main` instead: the child imports
radixrt and its target's module, nothing of the caller's. Every process radixrt starts (the
server's scheduler and worker, tensor-parallel ranks, grammar compile workers, replicas, the
router) is one.

What crosses, in this order, on the child's stdin: an 8-byte length, then the target's one
argument as msgpack (a msgspec Struct or a dataclass of plain fields; never a pickle). The
target and the argument's type travel on the command line as `module:qualname`. File
descriptors the child needs (a listening socket, its end of a socket pair) pass by number
(`pass_fds`); nothing else is inherited.

The lifeline: after the argument, the child's stdin stays open in the parent, and no other
process holds it. When the parent ends, however it ends (returns, raises, is killed with
SIGKILL), the kernel closes it, the child reads end-of-file, sends itself SIGTERM (a target with
a SIGTERM handler drains, as the worker and the server do; the rest stop at once) and, if it is
still there LIFELINE_GRACE_S later, exits. So no helper outlives its owner. An owner that exits
normally (or drops the HelperProcess) stops its helpers itself first, the quiet way: SIGTERM,
then SIGKILL STOP_GRACE_S later.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

HELPER_MAIN = "radixrt.runtime.helper_main"
ARG_LENGTH_BYTES = 8  # the argument's length, little-endian, before its bytes
STOP_GRACE_S = 5.0  # a helper its owner stops at exit gets this long after SIGTERM
# the folder radixrt is imported from: first on the child's path, so it runs the same code
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def qualified_name(obj: Any) -> str:
    """`module:qualname` of a module-level function or class (what the child imports)."""
    name = f"{obj.__module__}:{obj.__qualname__}"
    if "<" in obj.__qualname__ or obj.__module__ in ("__main__", "__mp_main__"):
        raise ValueError(f"{name}: a helper's target and argument type must be module-level "
                         "names of an importable module")
    return name


class HelperProcess:
    """One helper process: `target(arg)` in a fresh interpreter started by module path.

    The interface of multiprocessing.Process that radixrt uses (start, pid, is_alive, exitcode,
    join, terminate, kill), so owners watch and stop their helpers as before. An exit code is
    the process's, or -N after signal N."""

    def __init__(self, target: Callable[[Any], object], arg: Any, name: str,
                 pass_fds: Sequence[int] = (), env: dict[str, str] | None = None) -> None:
        """env: variables to set in the child, beside the parent's."""
        self.name = name
        self._argv = [sys.executable, "-m", HELPER_MAIN, qualified_name(target),
                      qualified_name(type(arg)), name]
        self._arg = msgspec.msgpack.encode(arg)
        self._pass_fds = tuple(pass_fds)
        self._env = env or {}
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self._popen is not None:
            raise RuntimeError(f"helper {self.name} was started already")
        env = {**os.environ, **self._env}
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
        self._popen = subprocess.Popen(self._argv, stdin=subprocess.PIPE, env=env,
                                       pass_fds=self._pass_fds)
        weakref.finalize(self, stop_at_exit, self._popen)
        assert self._popen.stdin is not None
        try:
            self._popen.stdin.write(len(self._arg).to_bytes(ARG_LENGTH_BYTES, "little"))
            self._popen.stdin.write(self._arg)
            self._popen.stdin.flush()
        except BrokenPipeError:  # it died at once; exitcode says how
            pass

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while it runs (or before start)."""
        return None if self._popen is None else self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Wait until it exits, at most timeout seconds."""
        if self._popen is None:
            return
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return
        self._release()

    def terminate(self) -> None:
        if self.is_alive():
            assert self._popen is not None
            self._popen.terminate()

    def kill(self) -> None:
        if self.is_alive():
            assert self._popen is not None
            self._popen.kill()

    def _release(self) -> None:
        assert self._popen is not None
        close_lifeline(self._popen)


def close_lifeline(popen: subprocess.Popen[bytes]) -> None:
    """After the helper's exit: nothing is left to watch the pipe."""
    if popen.stdin is not None and not popen.stdin.closed:
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.close()


def stop_at_exit(popen: subprocess.Popen[bytes]) -> None:
    """The owner exits normally (or dropped the HelperProcess): stop a helper still running."""
    if popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    close_lifeline(popen)
