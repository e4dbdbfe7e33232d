"""The `lowtide` command as a user types it, against a real scheduler: bad input is refused with
one message and no traceback (and nothing is stored), payloads come from a file or stdin, the
version is printed, lists say that they leave results out, and a reader that goes away early
(`task list | head`) ends the command quietly."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import pty
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from lowtide_client import Client, TaskState, task_spec
from scheduler_service.server import Scheduler
from tests.helpers import worker_process

COMPLETED = TaskState.Value("TASK_STATE_COMPLETED")


@dataclass
class Run:
    code: int
    out: str
    err: str


async def lowtide(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> Run:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lowtide",
        *args,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), 60)
    return Run(process.returncode or 0, out.decode(), err.decode())


async def stored(target: str) -> list[int]:
    async with Client(target) as client:
        return [t.id for t in (await client.list(page_size=100)).tasks]


BAD_INPUT = [
    (["task", "submit", "echo", "--priority", "2147483648"], "argument --priority: must be from -2147483648 to"),
    (["task", "submit", "echo", "--priority", "high"], "argument --priority: not a whole number: 'high'"),
    (["task", "submit", "echo", "--max-attempts", "0"], "argument --max-attempts: must be from 1 to 2147483647, not 0"),
    (["task", "submit", ""], "argument type: must not be empty"),
    (["task", "submit", "echo", "--count", "0"], "argument --count: must be from 1 to 1000000, not 0"),
    (["task", "submit", "echo", "--backoff-coefficient", "nan"], "argument --backoff-coefficient: must be a finite"),
    (
        ["task", "submit", "echo", "--start-at", "9999-12-31T23:59:59-05:00"],
        "argument --start-at: '9999-12-31T23:59:59-05:00' is out of range: in UTC it is not within years 1 to 9999",
    ),
    (
        ["task", "submit", "echo", "--payload", "x", "--payload-file", "-"],
        "argument --payload-file: not allowed with argument --payload",
    ),
    (["task", "get", "9223372036854775808"], "argument id: must be from 1 to 9223372036854775807"),
    (["task", "cancel", "0"], "argument id: must be from 1 to 9223372036854775807, not 0"),
    (["task", "retry", "0"], "argument id: must be from 1 to 9223372036854775807, not 0"),
    (["task", "explain", "-1"], "argument id: must be from 1 to 9223372036854775807, not -1"),
    (["task", "list", "--limit", "0"], "argument --limit: must be from 1 to"),
    (["schedule", "create", "n", "--cron", "* * * * *", "--type", ""], "argument --type: must not be empty"),
    (["signal", "set", "nan"], "argument value: must be a finite number, not 'nan'"),
    (["health", "--timeout", "-1"], "argument --timeout: must be above 0 and at most 3600 seconds, not -1"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
async def test_bad_input_is_refused_with_a_message_and_no_traceback(
    scheduler: Scheduler, args: list[str], message: str
) -> None:
    run = await lowtide(*args, "--target", scheduler.target)
    assert run.code == 2
    assert message in run.err.splitlines()[-1]
    assert "Traceback" not in run.err
    assert await stored(scheduler.target) == []


async def test_a_start_at_the_end_of_year_9999_is_invalid_argument_naming_start_at(scheduler: Scheduler) -> None:
    args = ["task", "submit", "echo", "--start-at", "9999-12-31T23:59:59Z", "--estimated-duration", "1m"]
    run = await lowtide(*args, "--target", scheduler.target)
    assert (run.code, run.err) == (1, "lowtide: INVALID_ARGUMENT: start_at: must be at most 366 days ahead\n")
    run = await lowtide(*args, "--target", scheduler.target, "--json")
    assert json.loads(run.err) == {
        "error": {"code": "INVALID_ARGUMENT", "message": "start_at: must be at most 366 days ahead"}
    }
    assert await stored(scheduler.target) == []


async def test_count_submits_that_many_and_sums_them_up_in_one_line(scheduler: Scheduler) -> None:
    run = await lowtide("task", "submit", "echo", "--count", "3", "--target", scheduler.target)
    ids = sorted(await stored(scheduler.target))
    assert len(ids) == 3
    assert (run.code, run.out) == (0, f"submitted 3 task(s) of type echo: ids {ids[0]}-{ids[-1]}\n")
    # With --json, one object per task, as every streaming command prints.
    run = await lowtide("task", "submit", "echo", "--count", "3", "--target", scheduler.target, "--json")
    lines = [json.loads(line) for line in run.out.splitlines()]
    assert [(line["created"], line["id"] > ids[-1]) for line in lines] == [(True, True)] * 3


async def test_count_shows_a_progress_bar_on_a_terminal_and_nothing_on_a_pipe(scheduler: Scheduler) -> None:
    args = ["task", "submit", "echo", "--count", "1500", "--no-wait", "--target", scheduler.target]
    piped = await lowtide(*args)
    assert piped.code == 0 and piped.out.count("submitted") == 1 and piped.out.startswith("submitted 1,500 task(s)")
    # No progress bar: only why the tasks wait (nothing runs echo here).
    assert piped.err.splitlines() == [
        "lowtide: tasks of type echo are pending: no connected worker runs activity type echo on queue default"
    ]
    # stderr a terminal (the pty's other end), stdout still a pipe.
    controller, terminal = pty.openpty()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lowtide", *args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=terminal
        )
        os.close(terminal)
        out, _ = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0 and out.decode().startswith("submitted 1,500 task(s) of type echo: ids ")
        screen = b""
        while select.select([controller], [], [], 0)[0]:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the other end is closed and everything read
                break
            if not chunk:
                break
            screen += chunk
    finally:
        os.close(controller)
    frames = screen.decode().replace("\r\n", "\n").split("\r")
    assert "1000/1500 submitted" in frames[-2]
    bar, notice = frames[-1].split("\n", 1)
    assert bar.endswith("] 1500/1500 submitted") and "[" + "#" * 10 in bar
    assert notice.startswith("lowtide: tasks of type echo are pending: no connected worker")


def _script(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lowtide", "completion", shell], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr == ""
    return done.stdout


def _complete(script: str, line: str) -> list[str]:
    """What bash's completion of `line` (the cursor at its end) offers, with the script loaded."""
    words = line.split(" ")
    program = f"""
{script}
COMP_WORDS=({" ".join(repr(w) for w in words)})
COMP_CWORD={len(words) - 1}
COMP_LINE={line!r}
COMP_POINT={len(line)}
complete -p lowtide >/dev/null || exit 3
function=$(complete -p lowtide | sed -E 's/.*-F ([^ ]+).*/\\1/')
"$function" lowtide "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    bash = ["bash", "--norc", "--noprofile"]
    done = subprocess.run(bash, check=False, input=program, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return sorted(set(done.stdout.split()))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to load the completion script")
def test_bash_completion_offers_the_commands_and_their_options() -> None:
    script = _script("bash")
    assert _complete(script, "lowtide ta") == ["task"]
    assert _complete(script, "lowtide task ") == ["cancel", "explain", "get", "list", "retry", "submit"]
    assert "--count" in _complete(script, "lowtide task submit --co")
    assert _complete(script, "lowtide task list --state pe") == ["pending"]


def test_zsh_completion_is_a_zsh_completion_function() -> None:
    script = _script("zsh")
    assert script.startswith("#compdef lowtide")
    assert "--count" in script and "submit" in script
    if shutil.which("zsh") is not None:
        parsed = subprocess.run(["zsh", "-n"], check=False, input=script, capture_output=True, text=True, timeout=60)
        assert parsed.returncode == 0, parsed.stderr


async def test_the_payload_comes_from_a_file_or_stdin_as_bytes(scheduler: Scheduler, tmp_path: Path) -> None:
    target = scheduler.target
    raw = bytes(range(256)) * 40  # not UTF-8, and too long for comfort on a command line
    path = tmp_path / "payload.bin"
    path.write_bytes(raw)
    from_file = await lowtide(
        "task", "submit", "echo", "--payload-file", str(path), "--no-wait", "--json", "--target", target
    )
    from_stdin = await lowtide(
        "task",
        "submit",
        "echo",
        "--payload-file",
        "-",
        "--no-wait",
        "--json",
        "--target",
        target,
        stdin=b"\x00from stdin",
    )
    assert (from_file.code, from_stdin.code) == (0, 0), from_file.err + from_stdin.err
    async with Client(target) as client:
        assert (await client.get(json.loads(from_file.out)["id"])).payload == raw
        assert (await client.get(json.loads(from_stdin.out)["id"])).payload == b"\x00from stdin"


async def test_a_payload_file_over_the_limit_is_refused_before_it_is_read_whole(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * 1001)
    limit = {"LOWTIDE_SCHEDULER_MAX_PAYLOAD_BYTES": "1000"}
    run = await lowtide("task", "submit", "echo", "--payload-file", str(path), "--target", scheduler.target, env=limit)
    assert (run.code, run.err) == (
        2,
        f"lowtide: --payload-file: {path} is over the payload limit of 1000 bytes ([scheduler] max_payload_bytes)\n",
    )
    # stdin: the command stops reading at the limit, however much is still coming.
    run = await lowtide(
        "task", "submit", "echo", "--payload-file", "-", "--target", scheduler.target, env=limit, stdin=b"y" * 5_000_000
    )
    assert run.code == 2 and "stdin is over the payload limit of 1000 bytes" in run.err
    run = await lowtide("task", "submit", "echo", "--payload-file", str(tmp_path / "missing"), "--target", "x:1")
    assert run.code == 2 and "--payload-file: cannot read" in run.err and "No such file or directory" in run.err
    assert await stored(scheduler.target) == []


async def test_version_prints_the_version() -> None:
    run = await lowtide("--version")
    assert (run.code, run.out) == (0, f"lowtide {importlib.metadata.version('lowtide')}\n")


async def test_task_list_says_results_are_left_out_and_task_get_shows_them(scheduler: Scheduler) -> None:
    target = scheduler.target
    worker = worker_process(target)
    try:
        async with Client(target) as client:
            task = await client.submit("echo", b"the result")
            done = await client.wait(task.id, timeout=timedelta(seconds=60))
        assert done.state == COMPLETED
        listed = await lowtide("task", "list", "--target", target)
        assert listed.out == (
            f"task {task.id} completed type=echo queue=default attempt=1 "
            f"result=(not in lists: lowtide task get {task.id})\n"
        )
        listed_json = json.loads((await lowtide("task", "list", "--json", "--target", target)).out)
        assert listed_json["state"] == "completed"
        assert "result" not in listed_json and "payload" not in listed_json
        got = await lowtide("task", "get", str(task.id), "--target", target)
        assert "result='the result'" in got.out
    finally:
        worker.terminate()
        # Off the event loop: the scheduler runs on it, and the stopping worker awaits its answer.
        await asyncio.to_thread(worker.wait, 30)


async def test_task_retry_runs_a_cancelled_task_again_and_says_why_a_pending_one_is_not(scheduler: Scheduler) -> None:
    target = scheduler.target
    async with Client(target) as client:
        task = await client.submit("nobody-runs-this")
        refused = await lowtide("task", "retry", str(task.id), "--target", target)
        assert refused.code != 0
        assert f"task {task.id} cannot be retried: the task is pending" in refused.err
        await client.cancel(task.id)
    retried = json.loads((await lowtide("task", "retry", str(task.id), "--json", "--target", target)).out)
    assert (retried["id"], retried["state"]) == (task.id, "pending")
    # Run again naming the end it saw (attempt 0, cancelled): the task moved on, and that is no error.
    again = await lowtide("task", "retry", str(task.id), "--if-attempt", "0", "--json", "--target", target)
    assert again.code == 0, again.err
    assert json.loads(again.out)["state"] == "pending"


async def test_a_reader_that_goes_away_ends_the_list_quietly(scheduler: Scheduler) -> None:
    async with Client(scheduler.target) as client:
        # Far more than a pipe holds (64 KiB), so the command is still writing when the reader goes.
        await client.submit_many([task_spec("echo") for _ in range(400)])
    args = ["task", "list", "--json", "--limit", "400", "--target", scheduler.target]
    # In a thread: the scheduler serving the command runs on this test's event loop.
    first, code, err = await asyncio.to_thread(_read_one_line_and_close, args)
    assert json.loads(first)["activity_type"] == "echo"
    assert (code, err) == (0, "")


def _read_one_line_and_close(args: list[str]) -> tuple[str, int, str]:
    """What `lowtide ... | head -1` does to the command: read a line, close the pipe."""
    process = subprocess.Popen(
        [sys.executable, "-m", "lowtide", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read()
    return first, process.wait(timeout=60), err
