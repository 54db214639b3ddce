"""``twinstream-stack up|status|down``: the Docker-free local stack (used by the Makefile)."""

from __future__ import annotations

import argparse
import logging
import sys

from twinstream.platform.kafka import TopicShapeError
from twinstream.platform.settings import SettingsError, load_settings
from twinstream.stack import core


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinstream-stack", description=__doc__)
    parser.add_argument("command", choices=["up", "status", "down"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        if args.command == "up":
            core.up(settings, echo=_echo)
            return 0
        if args.command == "status":
            return core.status(settings, echo=_echo)
        core.down(settings, echo=_echo)
        return 0
    except (SettingsError, core.StackError, TopicShapeError, ValueError) as exc:
        print(f"twinstream-stack {args.command}: {exc}", file=sys.stderr)
        return 2


def _echo(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
