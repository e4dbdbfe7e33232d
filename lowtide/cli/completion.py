"""`lowtide completion bash|zsh`: print a shell completion script made from the command's own
parser (by shtab), so that it never lags behind the commands and options."""

from __future__ import annotations

import argparse

import shtab

from lowtide.cli.common import Commands, Parents
from lowtide.config import Config


async def _completion(args: argparse.Namespace, config: Config) -> int:
    print(shtab.complete(args.root, shell=args.shell), end="", flush=True)
    return 0


def register(commands: Commands, parents: Parents, root: argparse.ArgumentParser) -> None:
    """`lowtide completion bash|zsh`."""
    completion = commands.add_parser(
        "completion",
        parents=[parents.common],
        help="print a shell completion script",
        description='Print a completion script: `eval "$(lowtide completion bash)"` in ~/.bashrc, or '
        "`lowtide completion zsh > ~/.zfunc/_lowtide` with ~/.zfunc on $fpath.",
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(handler=_completion, root=root)
