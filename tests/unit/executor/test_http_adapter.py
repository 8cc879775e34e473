import pytest

from executor.agents import HttpTool
from executor.errors import ErrorClass, classify
from executor.tools.http import HttpToolAdapter

TOOL = HttpTool(name="t", kind="http", url="http://127.0.0.1:1/t", remote_id_field="ref")
ADAPTER = HttpToolAdapter(TOOL, session=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("status", "body", "code", "error_class"), [
    (429, '{"error": "slow down"}', "rate_limited", ErrorClass.RETRYABLE_TRANSIENT),
    (409, '{"error": "stale_fence"}', "stale_fence", ErrorClass.DEFINITE_NO_EFFECT),
    (409, '{"error": "conflict"}', "refused", ErrorClass.DEFINITE_NO_EFFECT),
    (422, "{}", "refused", ErrorClass.DEFINITE_NO_EFFECT),
    (408, "", "timeout", ErrorClass.UNKNOWN_OUTCOME),
    (500, "oops", "server_error", ErrorClass.UNKNOWN_OUTCOME),
    (503, "", "server_error", ErrorClass.UNKNOWN_OUTCOME),
    (200, "<html>", "bad_response", ErrorClass.UNKNOWN_OUTCOME),
    (302, "", "bad_response", ErrorClass.UNKNOWN_OUTCOME),
])
def test_http_answers_map_to_their_error_class(status, body, code, error_class):
    outcome = ADAPTER._classify(status, body, None)
    assert not outcome.ok and outcome.error_code == code and classify(code) is error_class


def test_a_2xx_json_body_is_the_result_with_its_remote_id():
    outcome = ADAPTER._classify(201, '{"ref": 17, "x": [1]}', None)
    assert outcome.ok and outcome.response == {"ref": 17, "x": [1]} and outcome.remote_resource_id == "17"
    assert ADAPTER._classify(204, "", None).ok
