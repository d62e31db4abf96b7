"""Containers for tests: podman (rootful, runc), images built here, compose run by podman-compose.

No image registry is reachable from the test machines, and no Docker engine runs on them; Debian's
podman does (../shared/DESIGN.md, "fourth round"). What this module does, each step a thin call of
the real tool:

* :func:`podman` runs podman with the test's own ``containers.conf`` (``CONTAINERS_CONF``: runc,
  the cgroupfs manager, no default ulimits), leaving the machine's ``/etc/containers`` alone;
* :func:`build_base_image` makes a Debian 12 base image with ``debootstrap`` (from Debian's
  mirror, the one registry the machine has for it) and ``podman import``; :func:`build_image`
  builds a Containerfile on it, never pulling;
* :class:`ComposeStack` runs a compose project with ``podman-compose``: brought up in stages
  (podman 4.3 runs no healthchecks by itself and refuses a dependency chain through a finished
  one-shot container), healthchecks run by hand (``podman healthcheck run``: the service's own
  check, as Docker would run it), and the faults a test causes (kill, stop, start, restart).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "tests" / "stack"
CONTAINERS_CONF = STACK / "containers.conf"
BASE_IMAGE = "localhost/txn-stack/debian:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"


class ContainerError(RuntimeError):
    """A podman or podman-compose call failed; the message carries its output's tail."""


def _env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(
    *args: str,
    check: bool = True,
    timeout: float = 600,
    input: str | None = None,
    quiet: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``podman ARGS`` with the test's configuration; :class:`ContainerError` if it fails."""
    result = subprocess.run(
        ["podman", *args], capture_output=quiet, text=True, env=_env(), timeout=timeout, input=input
    )
    if check and result.returncode != 0:
        tail = "\n".join(((result.stderr or "") + (result.stdout or "")).splitlines()[-30:])
        raise ContainerError(f"podman {' '.join(args[:4])} … exited {result.returncode}:\n{tail}")
    return result


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def build_base_image(work: Path, name: str = BASE_IMAGE) -> str:
    """Debian 12 (minbase) from Debian's mirror as image ``name``; kept once built."""
    if image_exists(name):
        return name
    rootfs = work / "debian-rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    started = time.monotonic()
    subprocess.run(
        ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR],
        check=True,
        capture_output=True,
        timeout=900,
    )
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(
        ["podman", "import", "-", name],
        stdin=tar.stdout,
        env=_env(),
        capture_output=True,
        timeout=600,
    )
    tar.wait()
    shutil.rmtree(rootfs)
    if imported.returncode != 0 or tar.returncode != 0:
        raise ContainerError(
            f"podman import of the debootstrap root failed: {imported.stderr[-2000:].decode()}"
        )
    log.info("base image %s built in %.0f s", name, time.monotonic() - started)
    return name


def build_image(
    containerfile: Path,
    tag: str,
    context: Path,
    build_args: dict[str, str] | None = None,
    timeout: float = 3600,
) -> float:
    """``podman build`` (never pulling; its layer cache makes a rebuild of the same inputs quick).
    Returns the seconds it took."""
    started = time.monotonic()
    args = ["build", "--pull=never", "-f", str(containerfile), "-t", tag]
    for key, value in (build_args or {}).items():
        args += ["--build-arg", f"{key}={value}"]
    podman(*args, str(context), timeout=timeout)
    return time.monotonic() - started


class ComposeStack:
    """One compose project (``-p project``), its files and env file, run with podman-compose."""

    def __init__(self, project: str, files: Sequence[Path], env_file: Path) -> None:
        self.project = project
        self.files = list(files)
        self.env_file = env_file

    def compose(self, *args: str, timeout: float = 900, check: bool = True) -> str:
        exe = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
        argv = [exe, "-p", self.project, "--env-file", str(self.env_file)]
        for f in self.files:
            argv += ["-f", str(f)]
        result = subprocess.run(
            [*argv, *args], capture_output=True, text=True, env=_env(), timeout=timeout
        )
        if check and result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise ContainerError(
                f"podman-compose {' '.join(args)} exited {result.returncode}:\n{tail}"
            )
        return result.stdout

    def up(self, services: Iterable[str], *, no_deps: bool = True) -> None:
        """Create and start ``services`` (already built images; no pull, no build)."""
        args = ["up", "-d", "--no-build"]
        if no_deps:
            args.append("--no-deps")
        self.compose(*args, *services)

    def containers(self, service: str | None = None, *, all: bool = True) -> list[dict]:
        """This project's containers (``podman ps`` JSON), of ``service`` if given, by name."""
        args = [
            "ps",
            "--format",
            "json",
            "--filter",
            f"label=io.podman.compose.project={self.project}",
        ]
        if all:
            args.append("-a")
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        rows = json.loads(podman(*args).stdout or "[]")
        return sorted(rows, key=lambda r: r["Names"][0])

    def container_names(self, service: str) -> list[str]:
        return [r["Names"][0] for r in self.containers(service)]

    def healthy(self, container: str) -> bool:
        """Run the container's own healthcheck once (podman 4.3 runs none without systemd)."""
        result = podman("healthcheck", "run", container, check=False, timeout=120)
        return result.returncode == 0

    def wait_healthy(
        self, services: Iterable[str], timeout: float = 600, every: float = 5
    ) -> float:
        """Until every container of ``services`` passes its healthcheck; the seconds it took."""
        started = time.monotonic()
        pending = {name for s in services for name in self.container_names(s)}
        if not pending:
            raise ContainerError(f"no container of {sorted(services)} in {self.project}")
        while pending:
            pending = {name for name in pending if not self.healthy(name)}
            if not pending:
                break
            if time.monotonic() - started > timeout:
                logs = {name: self.logs(name, 40) for name in sorted(pending)}
                raise ContainerError(
                    f"not healthy after {timeout:.0f} s: {sorted(pending)}\n{logs}"
                )
            time.sleep(every)
        return time.monotonic() - started

    def wait_exited(self, container: str, timeout: float = 900) -> int:
        result = podman("wait", container, timeout=timeout)
        return int(result.stdout.strip().splitlines()[-1])

    def logs(self, container: str, lines: int = 100) -> str:
        result = podman("logs", "--tail", str(lines), container, check=False)
        return (result.stdout or "") + (result.stderr or "")

    def exec(
        self,
        container: str,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 600,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        args = ["exec", *(["-i"] if input is not None else []), container, *argv]
        return podman(*args, input=input, timeout=timeout, check=check)

    def kill(self, container: str) -> None:
        """SIGKILL: the container's processes die at once, as with a host lost."""
        podman("kill", "--signal", "KILL", container)

    def start(self, container: str) -> None:
        podman("start", container)

    def stop(self, container: str, timeout: int = 10) -> None:
        podman("stop", "-t", str(timeout), container, timeout=timeout + 120)

    def address(self, container: str) -> str:
        """The container's own address on the stack's network."""
        info = json.loads(podman("inspect", container).stdout)[0]
        networks = info["NetworkSettings"]["Networks"]
        return next(iter(networks.values()))["IPAddress"]

    def volume_path(self, volume: str) -> Path:
        """Where a named volume of this project lies on the host (rootful podman)."""
        info = json.loads(podman("volume", "inspect", f"{self.project}_{volume}").stdout)[0]
        return Path(info["Mountpoint"])

    def down(self, *, volumes: bool = True) -> None:
        args = ["down", "-t", "5"]
        if volumes:
            args.append("-v")
        self.compose(*args, check=False, timeout=600)
