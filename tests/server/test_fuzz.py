"""HTTP bodies generated from /openapi.json (schemathesis, with hypothesis): valid and invalid
ones alike must never get a 5xx. The server runs with a small context so that any generated
max_tokens ends quickly."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from conftest import Server

_server = Server("-np", "2", "-c", "96")
schema = schemathesis.openapi.from_url(_server.url + "/openapi.json")
# bodies that follow the schema and bodies that break it
schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE], max_examples=40)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    r = case.call(timeout=30)
    assert r.status_code < 500, (case.method, case.path, case.body, r.status_code, r.text[:300])


def teardown_module(_):
    _server.stop()
