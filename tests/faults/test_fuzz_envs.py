"""The other environments' routes (native and AgentGym, under /textcraft, /babyai; native only under /sokoban, which
has no AgentGym server): schemathesis with ALL its checks against a replica that serves them (2 workers, AgentGym
sessions in Redis), as test_fuzz_all_checks does for WebShop's. Any server error, undocumented status or response that breaks its schema fails the test.
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
ENVS = "textcraft,babyai,sokoban"

# A `state` token must carry our HMAC signature: a well-formed string that is not one is refused with 400, by
# design. The AgentGym routes answer an unknown session id with HTTP 200 and {"error": ...}, as AgentGym's
# servers do (their clients check for 200 only): a random id is "positive" data that gets that answer.
OPERATIONS = [
    {
        "include-path-regex": r"^/(textcraft|babyai|sokoban)/v1/(step|close)$",
        "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "409", "503"]}},
    },
    {  # OpenEnv's stateless step (its action carries the token)
        "include-path-regex": r"^/(textcraft|babyai|sokoban)/openenv/step$",
        "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "409", "503"]}},
    },
    {
        "include-path-regex": r"^/(textcraft|babyai|sokoban)/v1/(reset|tasks/.*)$",
        "checks": {"positive_data_acceptance": {"expected-statuses": ["2xx", "404"]}},
    },
    {
        "include-path-regex": r"^/(textcraft|babyai)/(commands|goal)$",
        "checks": {"positive_data_acceptance": {"expected-statuses": ["404"]}},
    },
]


@pytest.fixture(scope="module")
def fuzz_target(conformance_catalog_dir, tmp_path_factory):
    record = start(conformance_catalog_dir, tmp_path_factory.mktemp("fuzz-envs"), replicas=1, workers=2,
                   env={"AGENTRL_ENVS": ENVS})  # fmt: skip
    try:
        yield record["replicas"][0]["url"]
    finally:
        cluster.down(record["run_dir"], quiet=True)


@pytest.fixture(scope="module")
def api_schema(fuzz_target):
    config = SchemathesisConfig.from_dict({"operations": OPERATIONS})
    return schemathesis.openapi.from_url(fuzz_target + "/openapi.json", config=config).include(
        path_regex=r"^/(textcraft|babyai|sokoban)/"
    )


schema = schemathesis.pytest.from_fixture("api_schema")
session = requests.Session()


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_env_routes_schema_and_behaviour_agree(case) -> None:
    FUZZ["cases"] += 1
    try:
        case.call_and_validate(session=session, checks=ALL_CHECKS)
    except BaseException:
        FUZZ["failures"] += 1
        raise
