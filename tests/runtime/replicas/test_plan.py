"""Replica planning: each replica of `--dp-size N` gets a disk KV tier of its own (a folder per
replica under --disk-cache-dir), since a disk tier is one server's."""

from __future__ import annotations

import os

from radixrt.runtime.config import EngineConfig
from radixrt.runtime.replicas.plan import plan_replicas
from radixrt.runtime.server_options import ServerOptions


def test_each_replica_gets_its_own_disk_tier_folder(tmp_path) -> None:
    config = EngineConfig(device="cpu", disk_cache_dir=str(tmp_path), disk_cache_tokens=64)
    specs = plan_replicas(config, ServerOptions(dp_size=2))
    dirs = [spec.config.disk_cache_dir for spec in specs]
    assert dirs == [os.path.join(str(tmp_path), f"replica-{i}") for i in range(2)]
    plain = plan_replicas(EngineConfig(device="cpu"), ServerOptions(dp_size=2))
    assert [spec.config.disk_cache_dir for spec in plain] == [None, None]
