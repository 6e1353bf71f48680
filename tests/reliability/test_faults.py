"""Faults of the services under a load of 200 transcripts: worker killed, worker stopped,
Redis restarted with nothing persisted, PostgreSQL restarted and down for 90 s."""

from __future__ import annotations

import pytest

from tests.reliability.conftest import OpenScenario

pytestmark = [pytest.mark.slow, pytest.mark.reliability]

N = 200


def test_baseline(open_scenario: OpenScenario) -> None:
    sc = open_scenario("baseline", "Baseline: no fault")
    sc.record["what"] = "200 transcripts through one worker (4 children) and beat; no fault."
    sc.transcripts(N)
    sc.start()
    sc.enqueue()
    sc.step("enqueued 200")
    sc.wait_all(120)
    sc.step("all settled")
    figures = sc.verify()
    sc.check("one model call per transcript", figures["model_calls"]["total"] == N)
    sc.assert_checks()
