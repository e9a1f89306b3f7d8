"""Settings read from the environment: queue names, broker key prefixes, Triton endpoints,
and when the API asks for a token."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from maskops_core.settings import Settings, is_loopback, split_endpoint


def _settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]


def test_environment_variables_are_read_with_the_maskops_prefix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MASKOPS_QUEUE_PREFIX", "s1_")
    monkeypatch.setenv("MASKOPS_STACK_ID", "lab-a")
    monkeypatch.setenv("MASKOPS_PRETRAINED_DIRS", '["/opt/weights"]')
    settings = _settings()
    assert (settings.gpu_queue, settings.cpu_queue) == ("s1_gpu", "s1_cpu")
    assert settings.broker_key_prefix == "lab-a:"
    assert [str(p) for p in settings.pretrained_dirs] == ["/opt/weights"]


def test_no_stack_id_means_no_broker_key_prefix() -> None:
    assert _settings().broker_key_prefix == ""


@pytest.mark.parametrize("stack_id", ["a b", "x/y", "k" * 65])
def test_a_stack_id_that_cannot_prefix_a_redis_key_is_refused(stack_id: str) -> None:
    with pytest.raises(ValidationError, match="stack_id"):
        _settings(stack_id=stack_id)


def test_triton_replicas_are_a_comma_separated_list_of_host_port() -> None:
    settings = _settings(triton_url=" triton-0:8000, http://triton-1:8000/ ,")
    assert settings.triton_endpoints == ["triton-0:8000", "http://triton-1:8000/"]
    assert settings.has_triton and not _settings().has_triton
    with pytest.raises(ValidationError, match="'triton-0' is not host:port"):
        _settings(triton_url="triton-0")
    with pytest.raises(ValidationError, match="one host:port, not a list"):
        _settings(triton_dns="a:8000,b:8000")


def test_triton_gpu_ids_need_the_gpu_device() -> None:
    assert _settings(triton_device="gpu", triton_gpus=[0, 1]).triton_gpus == [0, 1]
    with pytest.raises(ValidationError, match="triton_device is not gpu"):
        _settings(triton_gpus=[0])


def test_split_endpoint_takes_an_optional_scheme() -> None:
    assert split_endpoint("http://triton:8000/") == ("triton", "8000")
    assert split_endpoint("[::1]:8001") == ("[::1]", "8001")


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("myhost")
    assert not _settings(host="127.0.0.1").auth_required
    assert _settings(host="127.0.0.1", auth="required").auth_required
    assert _settings(host="0.0.0.0").auth_required
