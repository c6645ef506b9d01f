"""The `surge` Python package against real Surge: `surge run` jobs (embedded manager and
servers, FUSE mounts) whose body is a Python script using the package."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import surge

ROOT = Path(__file__).resolve().parents[3]
SURGE = os.environ.get("SURGE_BIN", str(ROOT / "target" / "debug" / "surge"))


def fuse_missing() -> str | None:
    if not Path("/dev/fuse").exists():
        return "/dev/fuse does not exist"
    if os.geteuid() != 0 and subprocess.run(["which", "fusermount3"], capture_output=True).returncode:
        return "not root and fusermount3 is not installed"
    return None


def run_job(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """Runs `body` (Python) as the job of a `surge run` with a 128 MiB striped instance."""
    (tmp_path / "job.py").write_text(textwrap.dedent(body))
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=128MiB\n"
        f'exec {sys.executable} job.py\n'
    )
    env = dict(os.environ)
    env.update(
        SURGE_FAST_DIR=str(tmp_path / "fast"),
        SURGE_SERVERS="2",
        SURGE_SERVER_CAPACITY="1GiB",
        SURGE_GRANULARITY="64MiB",
    )
    env.pop("SURGE_MANAGER", None)
    return subprocess.run(
        [SURGE, "run", "job.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_python_job_stages_reads_natively_and_stages_out(tmp_path: Path) -> None:
    why = fuse_missing()
    if why:
        pytest.skip(f"needs FUSE: {why}")
    data = os.urandom(5 << 20)
    (tmp_path / "in.dat").write_bytes(data)
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "a.txt").write_text("a\n")
    out = run_job(
        tmp_path,
        """
        import hashlib, json, os, surge
        bb = os.environ["DW_JOB_STRIPED"]
        assert surge.in_job()
        t = surge.stage_in(f"{bb}/in.dat", "in.dat")
        surge.stage_in(f"{bb}/tree", "tree", directory=True)
        polls = 0
        while True:  # compute while the copy runs
            sum(i * i for i in range(20000))
            polls += 1
            c = surge.query(f"{bb}/in.dat")
            if c.complete or c.failed:
                break
        done = surge.wait(t)
        assert done["state"] == "done" and done["bytes_done"] == 5 << 20, done
        surge.wait_path(f"{bb}/tree", directory=True)
        assert surge.query(bb, directory=True) == surge.StageCounts(2, 0, 0, 0)

        # The native instance API sees what the mount sees, without FUSE.
        inst = surge.Instance(os.environ["SURGE_JOB_INSTANCE"])
        assert sorted(inst.listdir("/")) == ["in.dat", "tree"], inst.listdir("/")
        assert inst.stat("/in.dat")["size"] == 5 << 20
        assert inst.stat("/tree")["kind"] == "directory"
        native = inst.read("/in.dat")
        with open(f"{bb}/in.dat", "rb") as f:
            assert f.read() == native
        assert inst.read("/in.dat", offset=10, size=5) == native[10:15]
        inst.mkdir("/made")
        assert inst.write("/made/native.bin", native[:1000] * 3) == 3000
        try:
            inst.read("/nope")
            raise SystemExit("reading a missing path must fail")
        except FileNotFoundError as e:
            assert "/nope" in str(e), e

        # Results: one now, one at the job's end (with its content then).
        with open(f"{bb}/sum.txt", "w") as f:
            f.write(hashlib.sha256(native).hexdigest() + "\\n")
        surge.wait(surge.stage_out(f"{bb}/sum.txt", "out/sum.txt"))
        with open(f"{bb}/late.txt", "w") as f:
            f.write("draft\\n")
        late = surge.stage_out(f"{bb}/late.txt", "out/late.txt", at_job_end=True)
        assert late["state"] == "deferred", late
        assert surge.query(f"{bb}/late.txt").deferred == 1
        with open(f"{bb}/late.txt", "w") as f:
            f.write("final\\n")
        surge.stage_out("/" + bb.strip("/") + "/made", "out/made", directory=True, at_job_end=True)

        # The manager's views.
        m = surge.Manager()
        mine = [s for s in m.sessions() if s["state"] == "active"]
        assert len(mine) == 1 and mine[0]["job"] == "job.sh", mine
        assert m.pools()[0]["servers_up"] == 2
        assert any(i["id"] == int(os.environ["SURGE_JOB_INSTANCE"]) for i in m.instances())
        assert len([t for t in surge.tasks() if t["state"] == "done"]) == 3
        with open("report.json", "w") as f:
            json.dump({"polls": polls}, f)
        """,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out" / "sum.txt").read_text() == hashlib.sha256(data).hexdigest() + "\n"
    assert (tmp_path / "out" / "late.txt").read_text() == "final\n"
    assert (tmp_path / "out" / "made" / "native.bin").read_bytes() == data[:1000] * 3
    assert "stage at job end" in out.stderr


def test_outside_a_job_staging_fails_with_a_reason() -> None:
    env_run_dir = os.environ.pop("SURGE_RUN_DIR", None)
    try:
        assert not surge.in_job()
        with pytest.raises(OSError) as e:
            surge.stage_in("/tmp/x", "/tmp/y")
        assert e.value.errno == errno.ENODEV
        assert "surge run" in str(e.value)
    finally:
        if env_run_dir is not None:
            os.environ["SURGE_RUN_DIR"] = env_run_dir


def test_a_manager_must_be_named() -> None:
    saved = os.environ.pop("SURGE_MANAGER", None)
    try:
        with pytest.raises(OSError) as e:
            surge.Manager()
        assert "SURGE_MANAGER" in str(e.value)
    finally:
        if saved is not None:
            os.environ["SURGE_MANAGER"] = saved
