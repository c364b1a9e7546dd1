"""deploy/: the Grafana dashboard and the Prometheus alerting rules, proved with a real Prometheus
(Debian's `prometheus` package: prometheus and promtool) scraping a real `radixrt serve` that
serves real traffic (plain, prefix-sharing, grammar-constrained, tenants and priorities, a
priority preemption, KV moved to the host tier, an embedding, a refused request). Every panel's
every expression returns data through Prometheus's HTTP API, every rule evaluates without error
on metrics that exist, and the replica-down alert goes off for a target that does not answer.
`promtool test rules` runs the rules' unit tests (deploy/prometheus/alerts_test.yml).

Without prometheus / promtool the tests skip, saying how to install them; with
RADIXRT_REQUIRE_TOOLS=1 (the Makefile's) they fail instead."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from required_tools import require_tool
from test_server import API_KEY, Server, free_port

pytestmark = pytest.mark.slow  # a server and Prometheus as real processes

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "radixrt.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
EXAMPLE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
JOB = "radixrt"
DOWN_JOB = "radixrt-replica-down"  # a second scrape job on a port nobody listens on
RATE_INTERVAL = "30s"  # what $__rate_interval and $__interval stand for in the panels' queries
DEADLINE_S = 20


def tools() -> tuple[str, str]:
    """prometheus and promtool; without them a skip, or with RADIXRT_REQUIRE_TOOLS=1 a failure."""
    return (require_tool(shutil.which("prometheus"), "Prometheus", "prometheus"),
            require_tool(shutil.which("promtool"), "promtool", "prometheus"))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tools()[1], *args], capture_output=True, text=True, timeout=60)


def panel_targets() -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel, rows' panels included."""
    out = []
    stack = list(json.loads(DASHBOARD.read_text())["panels"])
    while stack:
        panel = stack.pop(0)
        stack.extend(panel.get("panels", []))
        out.extend((panel["title"], t["expr"]) for t in panel.get("targets", []))
    return out


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


# --- no server --------------------------------------------------------------------------------


def test_rules_are_valid_and_their_unit_tests_pass(tmp_path: Path) -> None:
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", str(ALERTS_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every alert has a unit test that makes it fire
    tested_alerts = {case["alertname"] for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
                     for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert tested_alerts == {rule["alert"] for rule in alert_rules()}
    for rule in alert_rules():
        assert rule.get("for") and rule["labels"]["severity"] in {"warning", "critical"}, rule
        assert {"summary", "description"} <= set(rule["annotations"]), rule
    # the example scrape config is valid once its key file exists
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(example_config(tmp_path, "127.0.0.1:30000")))
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboard_shape() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
    for title, expr in panel_targets():
        # windows follow the dashboard's interval, never a fixed one
        assert "rate(" not in expr or "[$__rate_interval]" in expr, (title, expr)
        assert not re.search(r"\[\d+[smhd]\]", expr), (title, expr)
        assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, (title, expr)


# --- a real server and a real Prometheus ------------------------------------------------------


def example_config(tmp: Path, target: str) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml with the key in a file of tmp, scraping target."""
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    (tmp / "radixrt.key").write_text(API_KEY)
    config["rule_files"] = [str(ALERTS)]
    [job] = config["scrape_configs"]
    assert job["job_name"] == JOB
    job["authorization"]["credentials_file"] = str(tmp / "radixrt.key")
    job["static_configs"] = [{"targets": [target]}]
    return config


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tools()  # skip (or fail) before starting anything
    # one running slot (a more urgent request preempts), a small pool over a host tier (cached
    # prefixes move to the host), speculative decoding on (the default)
    srv = Server("--max-total-tokens", "512", "--host-cache-tokens", "1024",
                 "--max-running-requests", "1", "--api-key", API_KEY, "--log-level", "warning",
                 "--tenant-weights", "alice:2")
    yield srv
    srv.stop()


class Prometheus:
    def __init__(self, tmp: Path, target: str) -> None:
        config = example_config(tmp, target)
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        down = json.loads(json.dumps(config["scrape_configs"][0]))
        down["job_name"] = DOWN_JOB
        down["static_configs"] = [{"targets": [f"127.0.0.1:{free_port()}"]}]
        config["scrape_configs"].append(down)
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [tools()[0], f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.log_path = tmp / "prometheus.log"
        self.wait(lambda: httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200,
                  "Prometheus ready")

    def wait(self, check: Any, what: str, timeout: float = DEADLINE_S) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_path.read_text()
            try:
                result = check()
            except httpx.HTTPError:
                result = None
            if result:
                return result
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}\n{self.log_path.read_text()[-3000:]}")

    def api(self, path: str, **params: Any) -> Any:
        body = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        assert body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def prometheus(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{server.port}")
    yield prom
    prom.stop()


def send_traffic(server: Server, prom: Prometheus) -> None:
    """What makes every labelled series appear and every rate move."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError):  # refused: radixrt_rejected_requests_total
        client.completions.create(model="default", prompt="x", max_tokens=1,
                                  extra_body={"priority": 2 ** 30})
    # a long generation of tenant alice at priority 5, seen running by a scrape; then bob's
    # urgent request (priority -1) preempts it: the server has one running slot
    long = threading.Thread(target=client.completions.create, kwargs=dict(
        model="default", prompt="Write a long story about a lighthouse keeper.", max_tokens=200,
        temperature=0.8, seed=1, user="alice", extra_body={"priority": 5, "ignore_eos": True}))
    long.start()
    try:
        prom.wait(lambda: prom.query('radixrt_tenant_running_requests{tenant="alice"} > 0'),
                  "a scrape while alice's request runs")
        client.completions.create(model="default", prompt="Urgent: say hi.", max_tokens=4,
                                  user="bob", extra_body={"priority": -1})
    finally:
        long.join(timeout=120)
    assert server.info()["preemptions_by_cause"].get("priority", 0) >= 1  # bob preempted her
    # a shared prefix (the second request hits the radix cache), then prompts enough to push
    # cached prefixes out of the 512-token pool into the host tier, and the first one again
    shared = "The three most spoken languages in the world are English, Mandarin and"
    for _ in range(2):
        client.completions.create(model="default", prompt=shared, max_tokens=8, temperature=0)
    for i in range(4):
        client.completions.create(model="default", prompt=f"Document {i}: " + " ".join(
            f"word{i}x{j}" for j in range(40)), max_tokens=2, temperature=0)
    client.completions.create(model="default", prompt=shared, max_tokens=4, temperature=0)
    # grammars: a regex and a JSON schema
    client.completions.create(model="default", prompt="A number:", max_tokens=6,
                              extra_body={"regex": "[0-9]{3}"})
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    client.chat.completions.create(
        model="default", max_tokens=16, messages=[{"role": "user", "content": "JSON please"}],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    client.embeddings.create(model="default", input=["pooling: one embedding"])


def test_every_panel_and_rule_has_data(request: pytest.FixtureRequest) -> None:
    tools()  # a failure of this test, not of a fixture's set-up, where they are required
    server: Server = request.getfixturevalue("server")
    prom: Prometheus = request.getfixturevalue("prometheus")
    prom.wait(lambda: prom.query(f'up{{job="{JOB}"}} == 1'), "the first scrape of the server")
    start = time.time()
    send_traffic(server, prom)
    sent = time.time()
    # two scrapes after the last request (a series that appeared late has two samples: a rate)
    prom.wait(lambda: [s for s in prom.query(f'timestamp(up{{job="{JOB}"}})')
                       if float(s["value"][1]) > sent + 1.5], "two scrapes after the traffic")

    # every panel's every expression, as Grafana asks (a range query over the traffic), has a
    # series with a number in it
    instance = f"127.0.0.1:{server.port}"
    empty = []
    for title, expr in panel_targets():
        query = (expr.replace("$__rate_interval", RATE_INTERVAL)
                 .replace("$__interval", RATE_INTERVAL).replace("$job", JOB)
                 .replace("$instance", instance))
        result = prom.api("query_range", query=query, start=start - 2, end=time.time(),
                          step="1s")["result"]
        if not any(not math.isnan(float(v)) for s in result for _, v in s["values"]):
            empty.append(f"{title}: {query}")
    assert not empty, "panels without data:\n" + "\n".join(empty)

    # every rule evaluated, healthy, on metrics that exist
    names = {rule["alert"] for rule in alert_rules()}

    def evaluated() -> list[dict[str, Any]]:
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        done = {r["name"] for r in rules if not r["lastEvaluation"].startswith("0001")}
        return rules if done >= names else []

    rules = prom.wait(evaluated, "every rule evaluated")
    assert {r["name"] for r in rules} == names
    for rule in rules:
        assert rule["health"] == "ok" and not rule.get("lastError"), rule
        metrics = set(re.findall(r"\b(radixrt_[a-z_]+|up)\b", rule["query"]))
        assert metrics, rule["query"]
        for metric in metrics:
            assert prom.query(f'{metric}{{job="{JOB}"}}'), f"{rule['name']}: no {metric}"

    # a scrape target that does not answer: the replica-down alert, for that job only
    def down_alerts() -> list[dict[str, Any]]:
        return [a for a in prom.api("alerts")["alerts"]
                if a["labels"]["alertname"] == "RadixrtReplicaDown"]

    [alert] = prom.wait(down_alerts, "RadixrtReplicaDown")
    assert alert["labels"]["job"] == DOWN_JOB and alert["state"] in {"pending", "firing"}
    assert alert["labels"]["severity"] == "critical"
