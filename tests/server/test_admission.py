"""Start-up's admission figure: calibration, the model's cap, then the reasoner's, and why."""

from __future__ import annotations

import pytest

from models.background.factory import ReasonerSpec, make_reasoner
from server.admission import admitted


def test_the_in_process_reasoner_lowers_admission_only_when_the_operator_did_not_choose() -> None:
    pytest.importorskip("llama_cpp", reason="the in-process reasoner needs llama-cpp-python")
    reasoner = make_reasoner(ReasonerSpec(kind="llamacpp"))  # weights load on the first request, not here
    assert reasoner is not None
    try:
        n, why = admitted(40, None, 6, "cascade", reasoner, delegates=True)
        assert n == 3 and "answers well at once" in why and "llama-server" in why, why
        # The operator's --max-sessions stands; a model that never asks the reasoner is not lowered.
        assert admitted(8, 8, None, "cascade", reasoner, delegates=True) == (8, "set by --max-sessions")
        assert admitted(40, None, None, "echo", reasoner, delegates=False) == (40, "measured at start-up")
        n, why = admitted(40, None, 2, "cascade", reasoner, delegates=True)
        assert n == 2 and "model's own cap" in why
    finally:
        import asyncio
        asyncio.run(reasoner.aclose())


def test_no_reasoner_leaves_the_models_cap() -> None:
    assert admitted(40, None, 6, "cascade", None, delegates=True) == (
        6, "the model's own cap: cascade, max_sessions=6")
