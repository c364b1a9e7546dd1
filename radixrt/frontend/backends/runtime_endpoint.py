"""RuntimeEndpoint: the one public name for "a radixrt runtime at this address"; the address
says which backend it is (a tcp:// or ipc:// address: ZeroMQ, zmq_endpoint.py; http://: the HTTP
port, http_endpoint.py; a list: replicas, replica_endpoint.py). This module sits above the three,
so none of them needs to know the others."""

from __future__ import annotations

from typing import Any

from radixrt.frontend.backends.http_endpoint import HttpRuntimeEndpoint
from radixrt.frontend.backends.replica_endpoint import ReplicaEndpoint
from radixrt.frontend.backends.zmq_endpoint import ZmqRuntimeEndpoint


class RuntimeEndpoint(ZmqRuntimeEndpoint):
    """`RuntimeEndpoint("tcp://127.0.0.1:PORT")` for `radixrt serve --dsl-port PORT`, or the
    ipc:// address its log names; `api_key`: the server's `--api-key`, if it has one.
    `RuntimeEndpoint("http://host:port")` (SGLang's form) talks to the HTTP port instead: it
    returns an HttpRuntimeEndpoint. A list of addresses, one per replica
    (`RuntimeEndpoint(["tcp://127.0.0.1:A", "tcp://127.0.0.1:B"])`), returns a ReplicaEndpoint:
    each program runs on one replica, chosen by cached prefix and load."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        address = args[0] if args else kwargs.get("address")
        if cls is RuntimeEndpoint and isinstance(address, (list, tuple)):
            kwargs.pop("address", None)
            return ReplicaEndpoint(address, *args[1:], **kwargs)
        if cls is RuntimeEndpoint and isinstance(address, str) and address.startswith(
                ("http://", "https://")):
            if args[1:] or set(kwargs) - {"api_key", "address"}:
                raise TypeError("RuntimeEndpoint(http://...) takes only api_key=")
            return HttpRuntimeEndpoint(address, kwargs.get("api_key"))
        return super().__new__(cls)
