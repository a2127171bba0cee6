"""Schemathesis fuzzing of the published OpenAPI schema against a real replica: never a 5xx.

Schemathesis runs its coverage phase (boundary and negative cases per parameter, unexpected methods) and then
its fuzzing phase, bounded at 40 generated examples per operation, derandomized (a failure reproduces), no
shrinking phase and no deadline (tests never assert on time).
"""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api_schema(replica):
    return schemathesis.openapi.from_url(replica.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")
session = requests.Session()  # keep-alive: the fuzzer's time goes into generating cases, not connecting


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case) -> None:
    case.call_and_validate(session=session, checks=[not_a_server_error])
