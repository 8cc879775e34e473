import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from scheduler.config import SchedulerSettings, SubmitQuota
from shared import errors


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.InvalidArgument("input_json", "bad"), grpc.StatusCode.INVALID_ARGUMENT),
        (errors.LeaseLost("gone"), grpc.StatusCode.FAILED_PRECONDITION),
        (errors.VersionConflict("v"), grpc.StatusCode.ABORTED),
        (errors.NotFound("n"), grpc.StatusCode.NOT_FOUND),
        (errors.AlreadyExists("a"), grpc.StatusCode.ALREADY_EXISTS),
        (errors.Unavailable("u"), grpc.StatusCode.UNAVAILABLE),
        (errors.RunCancelled("c"), grpc.StatusCode.FAILED_PRECONDITION),
    ],
)
def test_each_error_maps_to_one_status_with_error_info(error, code):
    status = errors.to_grpc_status(error)
    assert status.code == code
    (key, raw), = status.trailing_metadata
    assert key == "grpc-status-details-bin"
    detail = status_pb2.Status.FromString(raw).details[0]
    info = error_details_pb2.ErrorInfo()
    detail.Unpack(info)
    assert info.reason == error.reason and info.domain == errors.ERROR_DOMAIN


def test_every_error_class_is_in_the_table():
    classes = {cls for cls in vars(errors).values()
               if isinstance(cls, type) and issubclass(cls, errors.AgentrtError)}
    assert classes <= set(errors.STATUS_CODES)
    assert len({cls.reason for cls in classes}) == len(classes), "reasons must be unique"


def test_settings_come_from_env_then_file(tmp_path, monkeypatch):
    config = tmp_path / "agentrt.yaml"
    config.write_text("common:\n  log_level: DEBUG\nscheduler:\n  lease_duration_ms: 5000\n"
                      "  listen_addr: 127.0.0.1:6000\n")
    monkeypatch.setenv("AGENTRT_CONFIG_FILE", str(config))
    monkeypatch.setenv("AGENTRT_LISTEN_ADDR", "127.0.0.1:7000")
    settings = SchedulerSettings()
    assert settings.lease_duration_ms == 5000
    assert settings.log_level == "DEBUG"
    assert settings.listen_addr == "127.0.0.1:7000"  # the environment wins over the file


def test_toml_config_file(tmp_path, monkeypatch):
    config = tmp_path / "agentrt.toml"
    config.write_text("[scheduler]\nbackoff_cap_ms = 1234\n")
    monkeypatch.setenv("AGENTRT_CONFIG_FILE", str(config))
    assert SchedulerSettings().backoff_cap_ms == 1234


def test_bad_settings_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRT_LEASE_DURATION_MS", "5")
    with pytest.raises(ValueError, match="lease_duration_ms"):
        SchedulerSettings()
    monkeypatch.delenv("AGENTRT_LEASE_DURATION_MS")
    monkeypatch.setenv("AGENTRT_CONFIG_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="no such file"):
        SchedulerSettings()


def test_an_invalid_argument_rebuilt_from_a_status_names_its_field_once() -> None:
    sent = errors.InvalidArgument("run_id", "is not a UUID: 'x'")
    status = errors.to_grpc_status(sent)

    class Failed(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return status.code  # type: ignore[no-any-return]

        def details(self) -> str:
            return status.details  # type: ignore[no-any-return]

        def trailing_metadata(self) -> object:
            return status.trailing_metadata

    got = errors.from_rpc_error(Failed())
    assert isinstance(got, errors.InvalidArgument) and got.field == "run_id"
    assert got.message == "run_id: is not a UUID: 'x'" == sent.message


def test_a_resource_exhausted_error_carries_retry_info_both_ways() -> None:
    sent = errors.QuotaExceeded("tenant full", retry_after_s=1.25, limit="max_queued_runs")
    status = errors.to_grpc_status(sent)
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    (_, raw), = status.trailing_metadata
    details = status_pb2.Status.FromString(raw).details
    retry = error_details_pb2.RetryInfo()
    assert details[1].Unpack(retry) and retry.retry_delay.ToMilliseconds() == 1250

    class Failed(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return status.code  # type: ignore[no-any-return]

        def details(self) -> str:
            return status.details  # type: ignore[no-any-return]

        def trailing_metadata(self) -> object:
            return status.trailing_metadata

    got = errors.from_rpc_error(Failed())
    assert isinstance(got, errors.QuotaExceeded) and got.retry_after_s == 1.25
    assert got.metadata["limit"] == "max_queued_runs" and got.retryable


def test_tenant_limits_override_the_scheduler_wide_quotas() -> None:
    settings = SchedulerSettings(max_queued_runs_per_tenant=100, max_submits_per_s_per_tenant=10,
                                 tenant_limits={"big": {"max_queued_runs": 0}, "slow": {"max_submits_per_s": 1}})
    assert settings.submit_quota("anyone") == SubmitQuota(100, 10)
    assert settings.submit_quota("big") == SubmitQuota(0, 10)
    assert settings.submit_quota("slow") == SubmitQuota(100, 1)
    assert not SchedulerSettings().submit_quota("anyone").active
    with pytest.raises(ValueError, match="max_queued_runs"):
        SchedulerSettings(tenant_limits={"bad": {"max_queued_runs": -1}})
