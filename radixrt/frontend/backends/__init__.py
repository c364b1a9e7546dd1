"""Where DSL programs run: a local runtime (local_runtime), a radixrt runtime over ZeroMQ or HTTP
(zmq_endpoint, http_endpoint; runtime_endpoint picks by address), several replicas with each
program on one (replica_endpoint, program_replica, replica_choice), or any OpenAI-compatible
server (openai_backend). Each implements lang's Backend interface."""
