"""`duplex serve`'s native-model options: the command line over the environment over the built-in defaults."""

from __future__ import annotations

import pytest

from models.registry import NativeOptions
from server.cli import build_parser, config_from_args

ENV = ("DUPLEX_NATIVE_DETERMINISTIC", "DUPLEX_TORCH_THREADS", "DUPLEX_NATIVE_MATMUL", "DUPLEX_NATIVE_GRAPHS",
       "DUPLEX_GRAPH_MAX_BATCH", "DUPLEX_KV_BUDGET_MB")


def test_native_options_come_from_the_command_line_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    assert config_from_args(build_parser().parse_args(["serve"])).native == NativeOptions()
    monkeypatch.setenv("DUPLEX_TORCH_THREADS", "3")
    monkeypatch.setenv("DUPLEX_NATIVE_MATMUL", "bf16")
    assert config_from_args(build_parser().parse_args(["serve"])).native == NativeOptions(threads=3, matmul="bf16")
    args = build_parser().parse_args(["serve", "--torch-threads", "2", "--no-native-deterministic", "--native-graphs",
                                      "eager", "--graph-max-batch", "8", "--kv-budget-mb", "64"])
    assert config_from_args(args).native == NativeOptions(deterministic=False, threads=2, matmul="bf16", graphs="eager",
                                                          graph_max_batch=8, kv_budget_mb=64.0)
    with pytest.raises(SystemExit):  # argparse refuses a mode that does not exist
        build_parser().parse_args(["serve", "--native-matmul", "int4"])
