"""The soak's Go worker (soak/go_worker/main.go), built by clients/go/build.sh with Debian's Go
toolchain where it is installed (`make test` installs it, see tests/deploy/go_toolchain.py);
where it is not, the soak says why and goes on with its Python and Node workers."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

GOCODE = Path("/usr/share/gocode/src")
PACKAGES = (
    "golang-go",
    "protobuf-compiler",
    "protoc-gen-go-grpc",
    "golang-google-protobuf-dev",
    "golang-google-grpc-dev",
)
REPO = Path(__file__).resolve().parents[1]


def missing() -> list[str]:
    """The tools and Go modules build.sh needs that this machine lacks."""
    tools = [tool for tool in ("go", "protoc", "protoc-gen-go-grpc") if shutil.which(tool) is None]
    modules = [
        package
        for package, folder in (
            ("golang-google-protobuf-dev", "google.golang.org/protobuf"),
            ("golang-google-grpc-dev", "google.golang.org/grpc"),
        )
        if not (GOCODE / folder).is_dir()
    ]
    return tools + modules


def build_env() -> dict[str, str]:
    """The environment build.sh runs in: Debian's tools, and one Go build cache for every build
    (the tests' Go builds share it)."""
    return {"PATH": "/usr/bin:/bin", "GOCACHE": str(Path(tempfile.gettempdir()) / "lowtide-go-build-cache")}


async def build(folder: Path, within: float = 600) -> tuple[Path | None, str]:
    """The Go worker built into `folder`, or None and why not."""
    absent = missing()
    if absent:
        return None, f"no Go worker: the Go toolchain is not installed (missing: {', '.join(absent)})"
    binary = folder / "soak-go-worker"
    process = await asyncio.create_subprocess_exec(
        "sh",
        str(REPO / "clients" / "go" / "build.sh"),
        str(binary),
        str(REPO / "soak" / "go_worker" / "main.go"),
        cwd=REPO / "clients" / "go",
        env=build_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), within)
    except TimeoutError:
        process.kill()
        return None, f"no Go worker: its build took longer than {within:g} s"
    if process.returncode != 0:
        return None, f"no Go worker: its build failed: {out.decode(errors='replace')[-500:]}"
    return binary, "Go worker built from soak/go_worker/main.go"
