"""Which Triton replicas the settings name, and the order inference tries them in.

Real sockets: the "down" replicas are free loopback ports nothing listens on. Two real
Triton replicas are in tests/integration/api/test_triton_replicas.py.
"""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from maskops.serving.circuit import ReplicasDown
from maskops.serving.client import TritonUnavailable
from maskops.serving.launcher import free_port
from maskops.serving.replicas import ReplicaPool, roll_out_all
from maskops_core.settings import ReplicaLookupError, Settings


def _settings(**values: str) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]


def test_triton_url_takes_a_comma_separated_list() -> None:
    settings = _settings(triton_url=" 10.0.0.1:8000, http://10.0.0.2:8000 ,")
    assert settings.triton_endpoints == ["10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert settings.triton_replicas() == settings.triton_endpoints
    assert _settings(triton_url="127.0.0.1:8000").triton_endpoints == ["127.0.0.1:8000"]
    assert not _settings().has_triton and _settings().triton_replicas() == []


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("triton_url", "127.0.0.1:8000,triton", "'triton' is not host:port"),
        ("triton_url", "triton:http", "'triton:http' is not host:port"),
        ("triton_dns", "a:1,b:2", "one host:port, not a list"),
    ],
)
def test_a_bad_endpoint_is_named(field: str, value: str, named: str) -> None:
    with pytest.raises(ValidationError, match=named) as raised:
        _settings(**{field: value})
    assert field in str(raised.value)


def test_triton_dns_adds_every_address_of_the_name() -> None:
    settings = _settings(triton_url="10.0.0.9:8000", triton_dns="localhost:8123")
    replicas = settings.triton_replicas()
    assert replicas[0] == "10.0.0.9:8000" and "127.0.0.1:8123" in replicas[1:]
    with pytest.raises(ReplicaLookupError, match=r"triton\.invalid does not resolve"):
        _settings(triton_dns="triton.invalid:8000").triton_replicas()


def test_rotation_is_round_robin_and_skips_an_open_circuit() -> None:
    pool = ReplicaPool(lambda: ["a:1", "b:2", "c:3"])
    assert [pool.rotation()[0] for _ in range(4)] == ["a:1", "b:2", "c:3", "a:1"]
    pool.circuits.trip("b:2", "it stalled")
    assert pool.rotation() == ["c:3", "a:1"]  # b's turn: skipped
    assert pool.rotation() == ["c:3", "a:1"]
    assert pool.refusal() is None  # a and c may take requests
    pool.circuits.close("b:2")
    assert pool.rotation() == ["a:1", "b:2", "c:3"]


def test_no_replica_answering_is_unavailable_naming_each() -> None:
    down = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    pool = ReplicaPool(lambda: down, down_for_s=60)
    with pytest.raises(ReplicasDown, match="no Triton replica is ready") as raised:
        pool.infer("shapes", [b"image"])
    assert all(url in str(raised.value) for url in down)
    # Both circuits open: refused at once, naming each, until the first health probe.
    refusal = pool.refusal()
    assert refusal is not None and refusal.retry_after_s == 60
    assert all(f"{url}: Triton is not reachable" in str(refusal) for url in down)
    assert "circuit open, next probe in 60 s" in str(refusal)
    started = time.monotonic()
    with pytest.raises(ReplicasDown, match=down[1]):
        pool.infer("shapes", [b"image"])
    assert time.monotonic() - started < 0.1
    with pytest.raises(TritonUnavailable, match="no Triton replica is configured"):
        ReplicaPool(lambda: []).infer("shapes", [b"image"])
    with pytest.raises(TritonUnavailable, match="does not resolve"):
        ReplicaPool(_settings(triton_dns="x.invalid:1").triton_replicas).replicas()


def test_an_open_circuit_is_probed_after_its_time_and_stays_open_while_down() -> None:
    down = f"127.0.0.1:{free_port()}"
    pool = ReplicaPool(lambda: [down], down_for_s=0.2)
    with pytest.raises(ReplicasDown):
        pool.infer("shapes", [b"image"])
    assert pool.rotation() == [] and pool.refusal() is not None
    time.sleep(0.3)
    assert pool.rotation() == [down] and pool.refusal() is None  # due for a probe
    with pytest.raises(ReplicasDown, match="the health probe found it not ready"):
        pool.infer("shapes", [b"image"])
    assert pool.rotation() == []  # open again for another 0.2 s


def test_roll_out_all_reports_each_replica() -> None:
    down = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    rollout = roll_out_all(down, "shapes", 3)
    assert set(rollout.failed) == set(down)
    assert all("not reachable" in state for state in rollout.states().values())


def test_a_failed_lookup_keeps_the_replicas_found_before() -> None:
    answers: list[list[str] | Exception] = [["a:1", "b:2"], OSError("DNS is away"), ["c:3"]]

    def resolve() -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    pool = ReplicaPool(resolve, refresh_s=0)
    assert pool.replicas() == ["a:1", "b:2"]
    assert pool.replicas() == ["a:1", "b:2"]  # the lookup failed
    assert pool.replicas() == ["c:3"]
