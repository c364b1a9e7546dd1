"""How the model's processes have their OpenMP threads wait: a short spin unless the user set
the wait; what the worker reports of it. (The runtime's worker reporting it:
tests/frontend/lang/test_api.py; the effect beside a busy neighbour:
benchmarks/shared_machine.py.)"""

from __future__ import annotations

from radixrt.runtime.worker.cpu_waiting import WAIT_SPINS, model_process_env, openmp_wait


def test_a_model_process_spins_briefly_unless_the_user_set_the_wait() -> None:
    assert model_process_env({}) == {"GOMP_SPINCOUNT": str(WAIT_SPINS)}
    assert model_process_env({"OMP_WAIT_POLICY": "active"}) == {}
    assert model_process_env({"GOMP_SPINCOUNT": "infinity", "PATH": "/bin"}) == {}


def test_the_wait_is_described_as_the_environment_set_it() -> None:
    assert openmp_wait({"GOMP_SPINCOUNT": "1000"}) == "GOMP_SPINCOUNT=1000"
    assert openmp_wait({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "5"}) == \
        "OMP_WAIT_POLICY=passive, GOMP_SPINCOUNT=5"
    assert openmp_wait({}).startswith("libgomp's default")

