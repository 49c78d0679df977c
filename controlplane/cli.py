"""Control-plane commands of the ``edgepop`` CLI (registered by ``edgepop.cli``)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the control-plane sub-commands (``edgepop place``)."""
    from controlplane.placement import cli as placement_cli

    placement_cli.register(sub)
