"""`duplex COMMAND ...`: dispatches to the package that owns each command.

It sits above them so that none imports another for the command line's sake: `serve` is the server's
(server/cli.py), `train` is training's (train/cli.py, handed its arguments whole and imported only
when asked for, so that serving never loads training code), `cluster` is deploy's (deploy/cli.py, the
same way). A new command adds its parser in the
package that owns it and one entry here.
"""

from __future__ import annotations

import argparse
import sys

from server.cli import add_serve_command
from server.cli import run as run_serve

# Commands whose package parses its own arguments: name -> help.
DELEGATED = {"train": "train the native interaction model (duplex train --help)",
             "cluster": "a local cluster: Redis, N replicas and HAProxy on loopback (duplex cluster --help)"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="duplex", description="duplex: a real-time full-duplex multimodal interaction server.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_serve_command(sub)
    for name, text in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        from train.cli import main as train_main

        return train_main(argv[1:])
    if argv[:1] == ["cluster"]:
        from deploy.cli import main as cluster_main

        return cluster_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return run_serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
