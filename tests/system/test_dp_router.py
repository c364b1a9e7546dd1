"""`radixrt serve --dp-size 2` behind the real SGLang router, as a user runs it, inside a network
namespace of its own (`unshare -n`: loopback only, so a router that reached for a model hub would
fail, and its log would say so). The test joins that namespace for its own requests (setns on
this thread), and sends them through the official openai client.

Shown: multi-turn conversations each stay on one replica (the x-radixrt-replica header) and both
replicas serve; the cache_aware policy reuses more cached tokens than random on the same
workload; a client killed mid-stream frees its KV on its replica; the router is given local
paths only; a dead replica takes the deployment down non-zero (fail-stop); SIGTERM leaves no
process. Two deployments in all (about 25 s each to start on 2 cores); the tests that end one
come last in the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from radixrt.runtime.replicas.router import ROUTER_INSTALL_HINT
from radixrt.runtime.server.core.http_replica import REPLICA_HEADER

pytestmark = pytest.mark.slow  # starts real processes

CLONE_NEWNET = 0x40000000  # setns(2)
STARTUP_S = 240
ROUTER_PORT = 30080  # inside the namespace: nothing else is there
CONVERSATIONS = 4
TURNS = 4
WORDS = ("river", "copper", "lantern", "orbit", "meadow", "cipher", "harbor", "violet", "granite",
         "falcon", "ember", "quartz", "tundra", "saffron", "beacon", "willow", "nebula", "anchor")


def poll(value: Callable[[], Any], timeout: float, what: str) -> Any:
    """value() once it is truthy, polled every 0.2 s; AssertionError after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not (result := value()):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.2)
    return result


def netns_problem() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare(1) and ip(8) for a network namespace"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a network namespace (unshare -n; root?): {probe.stderr.strip()}"
    return None


def router_missing() -> str | None:
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        return f"the SGLang router is not installed: {ROUTER_INSTALL_HINT}"
    return None


class Deployment:
    """`radixrt serve --dp-size 2` started under `unshare -n`; `inside()` joins its namespace."""

    def __init__(self, log_path: Path, *args: str) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        command = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
                   sys.executable, "-m", "radixrt", "serve", "--dp-size", "2",
                   "--port", str(ROUTER_PORT), "--log-level", "warning", *args]
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{ROUTER_PORT}"
        self.netns = self._open_netns()
        try:
            poll(lambda: self.ready() or self.proc.poll() is not None, STARTUP_S, "readiness")
            assert self.proc.poll() is None, "the launcher exited"
        except AssertionError as exc:
            self.stop()
            raise RuntimeError(f"{exc}; its log:\n{self.output()[-4000:]}") from None
        top = psutil.Process(self.proc.pid)  # psutil.Process: safe against a reused pid
        self.family = [top, *top.children(recursive=True)]
        with self.inside():
            workers = httpx.get(f"{self.url}/workers", timeout=10).json()["workers"]
            self.replicas = {httpx.get(f"{w['url']}/health", timeout=10).headers[REPLICA_HEADER]:
                             w["url"] for w in workers}

    def _open_netns(self) -> int:
        """The namespace `unshare -n` made (same pid: unshare and sh exec, they do not fork)."""
        own = os.stat("/proc/self/ns/net").st_ino
        for _ in range(200):
            path = f"/proc/{self.proc.pid}/ns/net"
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino != own:
                    return os.open(path, os.O_RDONLY)
            time.sleep(0.05)
        raise RuntimeError("the server never entered a network namespace of its own")

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """This thread in the deployment's network namespace (and the processes it starts)."""
        libc = ctypes.CDLL(None, use_errno=True)
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            if libc.setns(self.netns, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            yield
        finally:
            libc.setns(own, CLONE_NEWNET)
            os.close(own)

    def ready(self) -> bool:
        with self.inside():
            try:
                r = httpx.get(f"{self.url}/readiness", timeout=2)
                return r.status_code == 200 and r.json()["healthy_workers"] == 2
            except (httpx.HTTPError, ValueError, KeyError):
                return False

    def info(self, name: str) -> dict[str, Any]:
        with self.inside():
            return httpx.get(f"{self.replicas[name]}/server_info", timeout=30).json()

    def cached_tokens(self) -> int:
        return sum(self.info(name)["cached_tokens"] for name in self.replicas)

    def wait_idle(self, name: str) -> dict[str, Any]:
        def idle() -> dict[str, Any] | None:
            info = self.info(name)
            return info if info["running"] == info["kv_private"] == info["kv_locked"] == 0 else None

        return poll(idle, 30, f"idle {name}")

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> list[psutil.Process]:
        def running(proc: psutil.Process) -> bool:
            try:
                return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        return [proc for proc in self.family if running(proc)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for proc in getattr(self, "family", []):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()  # a no-op for a pid reused since (psutil checks)
        self.log.close()
        if hasattr(self, "netns"):
            os.close(self.netns)


def deployment(tmp_path_factory: pytest.TempPathFactory, policy: str) -> Iterator[Deployment]:
    problem = netns_problem() or router_missing()
    if problem:
        pytest.skip(problem)
    dep = Deployment(tmp_path_factory.mktemp("dp") / f"{policy}.log", "--router-policy", policy)
    try:
        yield dep
    finally:
        dep.stop()


@pytest.fixture(scope="module")
def cache_aware(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from deployment(tmp_path_factory, "cache_aware")


@pytest.fixture(scope="module")
def random_policy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from deployment(tmp_path_factory, "random")


def run_serve(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys\n{prelude}\nfrom radixrt.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "serve", *args], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def test_without_the_router_dp_size_exits_2_saying_what_to_install():
    hide = ("class Hide:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.partition('.')[0] == 'sglang_router':\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Hide())")
    done = run_serve("--dp-size", "2", prelude=hide)
    assert done.returncode == 2 and ROUTER_INSTALL_HINT in done.stderr, done.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--dp-size", "0"], "--dp-size=0 is invalid: use 1..64"),
    (["--dp-size", "2", "--dist-init-addr", "127.0.0.1:29999"], "--dist-init-addr"),
    (["--dp-size", "2", "--port", "31001", "--dsl-port", "31000"], "dsl-port + i"),
])
def test_plans_that_cannot_work_exit_2_before_anything_starts(args, fragment):
    done = run_serve(*args)
    assert done.returncode == 2 and fragment in done.stderr, done.stderr


def converse(dep: Deployment) -> tuple[list[list[str]], int]:
    """CONVERSATIONS chats of TURNS turns each, the chats at once (a thread each; the router
    places a chat it has no prefix of on the least loaded replica), the turns of a chat one
    after the other (greedy, 8 tokens each): the replica that served each turn, and the cached
    tokens the replicas reused meanwhile."""
    before = dep.cached_tokens()
    served: list[list[str]] = [[] for _ in range(CONVERSATIONS)]
    failures: list[BaseException] = []
    with dep.inside():  # threads start in the namespace of the thread that starts them
        client = openai.OpenAI(base_url=f"{dep.url}/v1", api_key="none", max_retries=0)

        def chat(c: int) -> None:
            words = random.Random(c).choices(WORDS, k=120)  # a long system prompt of its own
            messages = [{"role": "system", "content": f"You are guide {c}. " + " ".join(words)}]
            try:
                for turn in range(TURNS):
                    messages.append({"role": "user", "content": f"Question {turn}: which word?"})
                    raw = client.chat.completions.with_raw_response.create(
                        model="default", messages=messages, max_tokens=8, temperature=0)
                    served[c].append(raw.headers[REPLICA_HEADER])
                    messages.append({"role": "assistant",
                                     "content": raw.parse().choices[0].message.content})
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in the test
                failures.append(exc)

        threads = [threading.Thread(target=chat, args=(c,)) for c in range(CONVERSATIONS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]
    return served, dep.cached_tokens() - before


@pytest.fixture(scope="module")
def cache_aware_run(cache_aware: Deployment) -> tuple[list[list[str]], int]:
    return converse(cache_aware)


def test_conversations_stay_on_one_replica_and_both_replicas_serve(cache_aware_run):
    served, _ = cache_aware_run
    assert all(len(set(replicas)) == 1 for replicas in served), served
    assert {replicas[0] for replicas in served} == {"replica-0", "replica-1"}, served


def test_cache_aware_reuses_more_cached_tokens_than_random(cache_aware_run, random_policy):
    _, aware = cache_aware_run
    served, scattered = converse(random_policy)
    assert aware > scattered, (aware, scattered, served)


def test_the_router_gets_local_paths_only_and_reads_the_loads(cache_aware):
    with cache_aware.inside():
        workers = httpx.get(f"{cache_aware.url}/workers", timeout=10).json()["workers"]
        loads = httpx.get(f"{cache_aware.url}/get_loads", timeout=10).json()["workers"]
        infos = [httpx.get(f"{url}/model_info", timeout=10).json()
                 for url in cache_aware.replicas.values()]
    for worker in workers:
        assert worker["model_id"] == "default"
        assert os.path.isdir(worker["metadata"]["model_path"])  # a folder here, never a name
    assert all(os.path.exists(info["tokenizer_path"]) for info in infos)
    assert all(load["load"] >= 0 for load in loads), loads  # /get_load parsed
    assert "HuggingFace" not in cache_aware.output() and "hf.co" not in cache_aware.output()


def test_client_killed_mid_stream_frees_its_kv_on_its_replica(cache_aware):
    code = (
        "import httpx\n"
        f"with httpx.stream('POST', '{cache_aware.url}/v1/completions', json={{'model': "
        "'default', 'prompt': 'Tell a long story', 'max_tokens': 2000, 'ignore_eos': True, "
        "'stream': True}, timeout=60) as r:\n"
        "    for i, line in enumerate(r.iter_lines()):\n"
        "        if i == 6:\n"
        f"            print(r.headers['{REPLICA_HEADER}'], flush=True)\n"
    )
    before = {name: cache_aware.wait_idle(name)["generated_tokens"]
              for name in cache_aware.replicas}
    with cache_aware.inside():  # the client process starts in the namespace too
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    assert name in cache_aware.replicas
    assert cache_aware.info(name)["running"] == 1
    proc.kill()
    proc.wait()
    info = cache_aware.wait_idle(name)
    assert info["kv_free"] + info["kv_evictable"] == info["kv_total"]
    assert info["generated_tokens"] - before[name] < 200  # aborted, not run to 2000 tokens


def test_a_dead_replica_takes_the_deployment_down(random_policy):
    """Fail-stop (this test ends the random deployment): SIGKILL to one replica's process."""
    replica = next(p for p in psutil.Process(random_policy.proc.pid).children()
                   if "radixrt::tokenizer" in " ".join(p.cmdline()))
    replica.kill()
    assert random_policy.proc.wait(timeout=60) == 1
    poll(lambda: not random_policy.alive(), 30, "end of every process")
    assert "exited with code -9; stopping every replica and the router" in random_policy.output()


def test_sigterm_leaves_no_process(cache_aware):
    """This test ends the cache_aware deployment."""
    assert len(cache_aware.alive()) >= 8  # launcher, 2 x (tokenizer, scheduler, worker), router
    cache_aware.proc.send_signal(signal.SIGTERM)
    assert cache_aware.proc.wait(timeout=60) == 0
    poll(lambda: not cache_aware.alive(), 30, "end of every process")
