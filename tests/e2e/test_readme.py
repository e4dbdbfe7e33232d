"""The README's "Try it" section, run as written: each command line of its block, in order, as a
process, against `lowtide up` on a fresh data folder (`make up` is `lowtide up`, `.venv/bin/lowtide`
is this Python's `lowtide`; the commands name no address, so the shell's LOWTIDE_SCHEDULER_LISTEN
and LOWTIDE_SIGNAL_LISTEN point them at this test's free ports). Long-running commands (the
worker, `signal watch`) stay in the background, as in their own shells; a second `make up` is
preceded by Ctrl-C of the first, as its comment says. Then what the comments promise is checked:
the task ids the commands name are those of the tasks they mean, `train` is held while the
signal is high and runs on the plain `demo-worker` once it falls."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_up import Session, ctrl_c, read_until
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The first-task tutorial of the docs shows the same commands, explained step by step.
TUTORIAL = ROOT / "docs/tutorials/first-task.md"
BACKGROUND = (["demo-worker"], ["signal", "watch"])


@pytest.fixture
async def session(tmp_path: Path, embedded_data_dir: Path) -> AsyncIterator[Session]:
    """The shells of the README's commands: a fresh data folder, free ports, every process
    stopped at the end."""
    running = Session(tmp_path, embedded_data_dir)
    try:
        yield running
    finally:
        await running.close()


def try_it_commands() -> list[str]:
    """The command lines of the first shell block under "## Try it" (comment lines left out)."""
    section = README.read_text().split("\n## Try it\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_first_task_tutorial_shows_the_readme_try_it_commands() -> None:
    # The tutorial's block is the one this test runs: it may not drift from the README's.
    tutorial = TUTORIAL.read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line for line in tutorial.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert commands == try_it_commands()


def parse(command: str) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, lowtide arguments) of a command line."""
    words = shlex.split(command, comments=True)
    env: dict[str, str] = {}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if words[:2] == ["make", "up"]:
        return env, ["up", *words[2:]]
    assert words[0] == ".venv/bin/lowtide", f"not a lowtide command: {command}"
    return env, words[1:]


async def run(session: Session, args: list[str]) -> str:
    process = await session.spawn(*args, log="commands.log")
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 60)
    except TimeoutError:
        raise AssertionError(f"lowtide {shlex.join(args)} did not finish within 60 s") from None
    assert process.returncode == 0, (
        f"lowtide {shlex.join(args)}: exit {process.returncode}\n{session.log('commands.log')}"
    )
    return out.decode()


async def task(session: Session, task_id: int) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(await run(session, ["task", "get", str(task_id), "--json"]))
    return result


@pytest.mark.slow
async def test_the_readme_try_it_section_runs_as_written(session: Session) -> None:
    commands = try_it_commands()
    assert any("task submit train" in command for command in commands), commands
    up: asyncio.subprocess.Process | None = None
    background: dict[str, asyncio.subprocess.Process] = {}
    printed: dict[str, str] = {}
    for command in commands:
        env, args = parse(command)
        session.env.update(env)
        if args[0] == "up":
            if up is not None:
                await ctrl_c(session, up)  # shell 1: Ctrl-C, then the new command
            up = await session.spawn(*args, log="up.log", group=True)
            await read_until(up, "lowtide is up", within=120)
        elif any(args[: len(prefix)] == prefix for prefix in BACKGROUND):
            background[args[0] if args[0] != "signal" else "watch"] = await session.spawn(*args, log=f"{args[0]}.log")
            if args[0] == "signal":
                # `signal watch` prints the current value first: it is subscribed.
                await read_until(background["watch"], "grid", within=60)
        else:
            printed[command] = await run(session, args)
    assert up is not None

    def output_of(fragment: str) -> str:
        return next(text for command, text in printed.items() if fragment in command)

    echo = json.loads(output_of("submit echo --payload hi --json"))
    assert (echo["id"], echo["state"], echo["result"]) == (1, "completed", "hi")
    # The ids the README names are those of the tasks its comments speak of.
    cancelled, train = await task(session, 2), await task(session, 3)
    assert (cancelled["activity_type"], cancelled["state"]) == ("sleep", "cancelled"), cancelled
    assert train["activity_type"] == "train", train
    # While the signal was 520, over the threshold, `train` was held, as explain said.
    explained = output_of("task explain 3")
    assert "cost-deferrable" in explained and "520" in explained, explained
    # `signal watch` (shell 3) showed the change.
    watch = background["watch"]
    await read_until(watch, "520", within=30)
    # The plain demo-worker runs `train`: once the signal fell, it completed.
    assert any("signal set 100" in command for command in commands), commands

    async def completed() -> bool:
        return bool((await task(session, 3))["state"] == "completed")

    await eventually(completed, within=60, interval=0.5)
    for process in background.values():
        process.send_signal(signal.SIGTERM)
    await ctrl_c(session, up)
