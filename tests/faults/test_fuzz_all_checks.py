"""Schema and behaviour agree: schemathesis with ALL its checks (server errors, status codes and content
types the schema documents, response schemas, negative data rejected, positive data accepted, unsupported
methods, ...) against a replica of the default topology (2 workers, AgentGym sessions in Redis). The count of
cases and failures is printed with the other figures; any failure fails the test with schemathesis' report.

Derandomized (a failure reproduces), 40 generated examples per operation, no deadline.
"""

from __future__ import annotations

import pytest
import requests
import schemathesis
from _faults import FUZZ, start
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig

from agent_envs import cluster

pytestmark = pytest.mark.slow
load_all_checks()
ALL_CHECKS = list(CHECKS.get_all())


@pytest.fixture(scope="module")
def fuzz_target(conformance_catalog_dir, tmp_path_factory):
    record = start(conformance_catalog_dir, tmp_path_factory.mktemp("fuzz"), replicas=1, workers=2)
    try:
        yield record["replicas"][0]["url"]
    finally:
        cluster.down(record["run_dir"], quiet=True)


# The one thing a schema cannot say: whether a `state` token carries a valid HMAC signature. A well-formed
# string that is not a token the server signed is rejected with 400 invalid_token, by design; every other
# operation uses schemathesis' default expectations.
TOKEN_OPERATIONS = {
    # also under /webshop; and OpenEnv's stateless step (its action carries the token)
    "include-path-regex": "^((/webshop)?/v1/step(_batch)?|/webshop/openenv/step)$",
    "checks": {
        "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "401", "403", "404", "409", "5xx"]}
    },
}


@pytest.fixture(scope="module")
def api_schema(fuzz_target):
    config = SchemathesisConfig.from_dict({"operations": [TOKEN_OPERATIONS]})
    return schemathesis.openapi.from_url(fuzz_target + "/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api_schema")
session = requests.Session()


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_schema_and_behaviour_agree(case) -> None:
    FUZZ["cases"] += 1
    try:
        case.call_and_validate(session=session, checks=ALL_CHECKS)
    except BaseException:  # schemathesis raises a FailureGroup (a BaseExceptionGroup)
        FUZZ["failures"] += 1
        raise
