"""`duplex serve`'s native-model options: the command line over the environment over the built-in defaults."""

from __future__ import annotations

import pytest

from models.interaction.options import NativeOptions
from server.cli import build_parser, config_from_args

ENV = ("DUPLEX_NATIVE_DETERMINISTIC", "DUPLEX_TORCH_THREADS", "DUPLEX_NATIVE_MATMUL", "DUPLEX_NATIVE_GRAPHS",
       "DUPLEX_GRAPH_MAX_BATCH", "DUPLEX_KV_BUDGET_MB", "DUPLEX_NATIVE_VOICE", "DUPLEX_NATIVE_ONSET",
       "DUPLEX_NATIVE_DELEGATE", "DUPLEX_NATIVE_QUERY", "DUPLEX_NATIVE_TURN_CHECK",
       "DUPLEX_NATIVE_OVERLAP_CHECK")


def test_native_options_come_from_the_command_line_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    assert config_from_args(build_parser().parse_args(["serve"])).native == NativeOptions()
    monkeypatch.setenv("DUPLEX_TORCH_THREADS", "3")
    monkeypatch.setenv("DUPLEX_NATIVE_MATMUL", "bf16")
    monkeypatch.setenv("DUPLEX_NATIVE_DELEGATE", "0.3")
    monkeypatch.setenv("DUPLEX_NATIVE_QUERY", "heard")
    monkeypatch.setenv("DUPLEX_NATIVE_TURN_CHECK", "off")
    monkeypatch.setenv("DUPLEX_NATIVE_OVERLAP_CHECK", "off")
    assert config_from_args(build_parser().parse_args(["serve"])).native == NativeOptions(
        threads=3, matmul="bf16", delegate=0.3, query="heard", turn_check="off", overlap_check="off")
    args = build_parser().parse_args(["serve", "--torch-threads", "2", "--no-native-deterministic", "--native-graphs",
                                      "eager", "--graph-max-batch", "8", "--kv-budget-mb", "64",
                                      "--native-delegate", "0.2", "--native-query", "whisper",
                                      "--native-turn-check", "words", "--native-overlap-check", "words"])
    assert config_from_args(args).native == NativeOptions(deterministic=False, threads=2, matmul="bf16", graphs="eager",
                                                          graph_max_batch=8, kv_budget_mb=64.0, delegate=0.2,
                                                          query="whisper", turn_check="words", overlap_check="words")
    for option, bad in (("--native-matmul", "int4"), ("--native-query", "guess"), ("--native-turn-check", "maybe"),
                        ("--native-overlap-check", "yes")):
        with pytest.raises(SystemExit):  # argparse refuses a mode that does not exist
            build_parser().parse_args(["serve", option, bad])
    monkeypatch.setenv("DUPLEX_NATIVE_QUERY", "guess")
    with pytest.raises(ValueError, match=r"--native-query 'guess' \(DUPLEX_NATIVE_QUERY\)"):
        NativeOptions.from_env()
    monkeypatch.setenv("DUPLEX_NATIVE_QUERY", "heard")
    monkeypatch.setenv("DUPLEX_NATIVE_TURN_CHECK", "maybe")
    with pytest.raises(ValueError, match=r"--native-turn-check 'maybe' \(DUPLEX_NATIVE_TURN_CHECK\)"):
        NativeOptions.from_env()
    monkeypatch.setenv("DUPLEX_NATIVE_TURN_CHECK", "off")
    monkeypatch.setenv("DUPLEX_NATIVE_OVERLAP_CHECK", "yes")
    with pytest.raises(ValueError, match=r"--native-overlap-check 'yes' \(DUPLEX_NATIVE_OVERLAP_CHECK\)"):
        NativeOptions.from_env()


def test_an_environment_variable_that_is_not_a_number_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DUPLEX_NATIVE_ONSET", "0.55")
    assert NativeOptions.from_env().onset == 0.55
    bad_values = (("DUPLEX_NATIVE_ONSET", "half"), ("DUPLEX_KV_BUDGET_MB", "lots"), ("DUPLEX_TORCH_THREADS", "2.5"))
    for name, bad in bad_values:
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=f"\\${name}='{bad}' is not"):
            NativeOptions.from_env()
        with pytest.raises(SystemExit, match=f"duplex: \\${name}="):
            build_parser()  # the command line says which variable, without a traceback
        monkeypatch.delenv(name)
