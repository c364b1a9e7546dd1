"""HelperProcess: a target run in a fresh interpreter by module path, its argument typed on the
child's stdin, its exit code the target's, the file descriptors it was given and no others, and
the lifeline: a helper whose owner is SIGKILLed ends on its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec
import psutil
import pytest

from radixrt.runtime.helper_main import LIFELINE_GRACE_S
from radixrt.runtime.helper_process import HelperProcess, qualified_name

TESTS = str(Path(__file__).resolve().parent)


class Probe(msgspec.Struct, frozen=True):
    fd: int
    words: list[str]


def report(probe: Probe) -> None:
    """A target: tells its parent what it got, and what it sees of its world."""
    conn = Connection(probe.fd)
    main = sys.modules["__main__"]
    conn.send_bytes(msgspec.msgpack.encode({
        "words": probe.words, "main": getattr(main, "__file__", ""),
        "stdin": sys.stdin.read(), "argv0": sys.argv[0]}))


def fail(message: str) -> None:
    raise RuntimeError(message)


def start(target, arg, **kwargs) -> HelperProcess:
    proc = HelperProcess(target, arg, name="radixrt-test", env={"PYTHONPATH": TESTS}, **kwargs)
    proc.start()
    return proc


def test_the_argument_crosses_typed_and_the_child_runs_no_caller_code() -> None:
    ours, theirs = socket.socketpair()
    proc = start(report, Probe(theirs.fileno(), ["a", "b"]), pass_fds=(theirs.fileno(),))
    theirs.close()
    conn = Connection(os.dup(ours.fileno()))
    ours.close()
    assert conn.poll(60), "the helper did not answer"
    got = msgspec.msgpack.decode(conn.recv_bytes())
    proc.join(30)
    assert proc.exitcode == 0 and not proc.is_alive()
    assert got["words"] == ["a", "b"]
    assert got["main"].endswith("helper_main.py")  # radixrt's entry, never the caller's script
    assert got["stdin"] == ""  # the lifeline is not the target's stdin


def test_exit_codes_are_the_targets() -> None:
    exits = start(sys.exit, 3)
    raises = start(fail, "the target failed")
    exits.join(60)
    raises.join(60)
    assert exits.exitcode == 3 and raises.exitcode == 1
    sleeper = start(time.sleep, 600.0)
    sleeper.terminate()
    sleeper.join(30)
    assert sleeper.exitcode == -signal.SIGTERM


def test_a_target_must_be_importable_by_name() -> None:
    def local(_: int) -> None:
        pass

    with pytest.raises(ValueError, match="module-level"):
        qualified_name(local)
    assert qualified_name(report) == "test_helper_process:report"


@pytest.mark.parametrize("owner_ends", ["killed", "returns"])
def test_a_helper_ends_with_its_owner(owner_ends: str, tmp_path: Path) -> None:
    """The owner holds a sleeping helper and is SIGKILLed (the lifeline ends it) or returns
    (the owner stops it on its way out)."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(f"""\
        import time
        from radixrt.runtime.helper_process import HelperProcess
        helper = HelperProcess(time.sleep, 600.0, name="radixrt-sleeper")
        helper.start()
        print(helper.pid, flush=True)
        if {owner_ends!r} == "killed":
            time.sleep(600)
    """))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             stderr=subprocess.PIPE, cwd=tmp_path)
    assert owner.stdout is not None
    pid = int(owner.stdout.readline())
    if owner_ends == "killed":
        owner.send_signal(signal.SIGKILL)
    owner.wait(30)
    deadline = time.monotonic() + LIFELINE_GRACE_S + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        if time.monotonic() > deadline:
            psutil.Process(pid).kill()
            pytest.fail(f"the helper outlived its owner ({owner_ends})")
        time.sleep(0.1)
    assert owner_ends == "returns" or "the process that started it is gone" in (
        owner.stderr.read() if owner.stderr else "")
