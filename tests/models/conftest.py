"""Fixtures shared by the model tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from models.cascade import CascadeModel, load_cascade


@pytest.fixture(scope="session")
def default_cascade() -> Iterator[CascadeModel]:
    """One cascade with the default options for every module that drives it in process: loading it
    (Whisper, Smart Turn, Piper, the probe, the worker threads) takes ~5 s. Each test opens sessions of
    its own: a conversation's state is per session, so tests share the weights and threads only."""
    m = load_cascade("")
    yield m
    m.shutdown()
