"""The child side of a HelperProcess (helper_process.py): `python -m radixrt.runtime.helper_main
MODULE:TARGET MODULE:ARGTYPE NAME`. Reads the argument off stdin, keeps stdin as the lifeline to
its parent (end-of-file: SIGTERM to itself, then an exit after LIFELINE_GRACE_S), and calls the
target. Its exit code is the target's: 0 when it returns, SystemExit's code, 1 on an exception
(the traceback on stderr)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
import time
from typing import Any

import msgspec

from radixrt.runtime.helper_process import ARG_LENGTH_BYTES

# after its parent is gone, a helper gets this long to stop on its SIGTERM before it exits
LIFELINE_GRACE_S = 10.0
LIFELINE_EXIT_CODE = 1


def resolve(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def read_exactly(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("the parent closed the helper's stdin before its argument was read")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def watch_lifeline(fd: int, name: str) -> None:
    """Block until the parent's end of the pipe closes (the parent never writes after the
    argument), then stop this process."""
    while os.read(fd, 1 << 12):
        pass
    print(f"radixrt helper {name} (pid {os.getpid()}): the process that started it is gone; "
          "stopping", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(LIFELINE_GRACE_S)
    os._exit(LIFELINE_EXIT_CODE)


def main() -> None:
    target_path, arg_path, name = sys.argv[1:4]
    size = int.from_bytes(read_exactly(0, ARG_LENGTH_BYTES), "little")
    arg = msgspec.msgpack.decode(read_exactly(0, size), type=resolve(arg_path))
    lifeline = os.dup(0)  # fd 0 becomes /dev/null: nothing the target runs reads the lifeline
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    threading.Thread(target=watch_lifeline, args=(lifeline, name), daemon=True,
                     name="radixrt-lifeline").start()
    resolve(target_path)(arg)


if __name__ == "__main__":
    main()
