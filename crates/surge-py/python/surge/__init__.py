"""Surge, the open burst buffer, from Python.

Three parts, all over Surge's own Rust libraries (no FUSE, no subprocess):

- **Staging inside a job** started by ``surge run`` (what ``surge stage`` and libdatawarp do):
  :func:`stage_in`, :func:`stage_out` (now, or at the job's end), :func:`wait`,
  :func:`wait_path`, :func:`query`, :func:`tasks`, :func:`cancel`.
- **The manager's views**: :class:`Manager` (pools, servers, instances, sessions, stage tasks),
  the JSON of ``surge ... ls --json``.
- **The native instance API**: :class:`Instance` reads, writes, stats and lists the files of an
  instance directly on its servers (for staging tools and data loaders).

Errors are :class:`OSError` (``FileNotFoundError``, ... by errno) with Surge's message.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from . import _native

__all__ = [
    "StageCounts",
    "stage_in",
    "stage_out",
    "wait",
    "wait_path",
    "query",
    "tasks",
    "cancel",
    "in_job",
    "Manager",
    "Instance",
]

Task = Dict[str, Any]
"""A stage task, as ``surge stage status --json`` prints it (``id``, ``state``, ``bytes_done``...)."""


@dataclass(frozen=True)
class StageCounts:
    """Stage tasks naming a path, by state (DataWarp's ``dw_query_*_stage`` counts)."""

    complete: int
    pending: int
    deferred: int
    failed: int


def in_job() -> bool:
    """Whether this process runs inside a job started by ``surge run``."""
    return _native.in_job()


def stage_in(bb: os.PathLike | str, pfs: os.PathLike | str, *, directory: bool = False) -> Task:
    """Start copying ``pfs`` (a file, or a directory's contents) to ``bb`` under a mount of the job.

    Returns the task once planned; a missing source raises ``FileNotFoundError``.
    """
    return json.loads(_native.stage_in(os.fspath(bb), os.fspath(pfs), directory))


def stage_out(
    bb: os.PathLike | str,
    pfs: os.PathLike | str,
    *,
    directory: bool = False,
    at_job_end: bool = False,
) -> Task:
    """Start copying ``bb`` (under a mount of the job) to ``pfs``.

    With ``at_job_end`` the copy is deferred: it runs after the job's script exits, with the
    content the file has then, before the job's instances are released.
    """
    return json.loads(
        _native.stage_out(os.fspath(bb), os.fspath(pfs), directory, at_job_end)
    )


def wait(task: int | Task) -> Task:
    """Block until a stage task ends and return it; a failed task raises ``OSError``."""
    tid = task["id"] if isinstance(task, dict) else task
    return json.loads(_native.wait(int(tid)))


def wait_path(path: os.PathLike | str, *, directory: bool = False) -> None:
    """Block until every stage naming ``path`` has ended (deferred ones run at job end)."""
    _native.wait_path(os.fspath(path), directory)


def query(path: os.PathLike | str, *, directory: bool = False) -> StageCounts:
    """Count the stages naming a file (its latest) or a directory (all inside it)."""
    return StageCounts(*_native.query(os.fspath(path), directory))


def tasks() -> List[Task]:
    """Every stage task of this job, with live progress."""
    return json.loads(_native.tasks())


def cancel(task: int | Task) -> Task:
    """Terminate a task (deferred, queued or running); files not finished are removed."""
    tid = task["id"] if isinstance(task, dict) else task
    return json.loads(_native.cancel(int(tid)))


def _manager_addr(addr: Optional[str]) -> str:
    found = addr or os.environ.get("SURGE_MANAGER")
    if not found:
        raise OSError(
            22,
            "no manager given: pass one (host:port) or set SURGE_MANAGER "
            "(inside a job started by `surge run`, it is set)",
        )
    return found


class Manager:
    """The views of a manager (gRPC ``host:port``; default ``$SURGE_MANAGER``)."""

    def __init__(self, addr: Optional[str] = None) -> None:
        self.addr: str = _manager_addr(addr)

    def _view(self, what: str) -> List[Dict[str, Any]]:
        return json.loads(_native.manager_view(self.addr, what))

    def pools(self) -> List[Dict[str, Any]]:
        """Pools with granularity, servers and free capacity (``surge pool ls --json``)."""
        return self._view("pools")

    def servers(self) -> List[Dict[str, Any]]:
        """Registered servers with their state and use."""
        return self._view("servers")

    def instances(self) -> List[Dict[str, Any]]:
        """Job and persistent instances (``surge instance ls --json``)."""
        return self._view("instances")

    def sessions(self) -> List[Dict[str, Any]]:
        """Sessions, ended ones included (``surge session ls --all --json``)."""
        return self._view("sessions")

    def stages(self) -> List[Dict[str, Any]]:
        """Every stage task the manager knows."""
        return self._view("stages")


class Instance:
    """One namespace of an instance, used directly on its servers (no FUSE).

    ``instance`` is an instance id or a persistent instance's name; paths are absolute from
    the instance's root (``/input/a.dat``).
    """

    def __init__(self, instance: int | str, *, manager: Optional[str] = None, ns: int = 0) -> None:
        self._inner = _native.Instance(_manager_addr(manager), str(instance), ns)

    def stat(self, path: str) -> Dict[str, Any]:
        """``kind`` (file, directory, symlink), ``size``, ``mode``, ``uid``, ``gid``, ``mtime``..."""
        return json.loads(self._inner.stat(path))

    def listdir(self, path: str = "/") -> List[str]:
        """Names in a directory."""
        return self._inner.listdir(path)

    def read(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        """``size`` bytes of a file from ``offset`` (to its end when ``size`` is negative)."""
        return self._inner.read(path, offset, size)

    def write(self, path: str, data: bytes) -> int:
        """Create a file holding ``data``; its parent must exist and the file must not."""
        return self._inner.write(path, data)

    def mkdir(self, path: str) -> None:
        """Create a directory; its parent must exist."""
        self._inner.mkdir(path)
