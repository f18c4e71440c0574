"""bench.reliability.chaos: each fault under load must leave the other sessions alone, tell every closed session why,
lose nothing acknowledged, and let the server exit 0 within its drain time."""

from __future__ import annotations

import pytest

from bench.reliability import chaos

pytestmark = pytest.mark.serial  # it measures what a fault does to the other sessions: run alone (Makefile)


@pytest.mark.parametrize("scenario", chaos.SCENARIOS)
def test_fault_under_load(scenario: str) -> None:
    [r] = chaos.run_chaos([scenario], n_bystanders=2, quiet=True)
    assert r.ok, f"{scenario}: {r.failures} (told: {r.told}; notes: {r.notes})"
    assert r.bystander_echoes > 0, "the bystanders never streamed"
    assert r.exit_code == 0
