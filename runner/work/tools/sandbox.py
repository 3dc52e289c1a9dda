"""The bubblewrap jail of the agent's processes, and the fallback that tracks them where bwrap cannot run.

    Jail.for_goal(goal)   -> the argv prefix `shell`, command tools and MCP stdio servers run under
    sandbox_status(goal)  -> one line for people: jailed, or off and why
    contained()           -> every process started inside it is killed when it ends, however it detached

In the jail (Linux, `bwrap` works): the filesystem is read-only but the workdir; protected paths and check
inputs are read-only inside it; `.env` reads empty and the state folder is an empty tmpfs; /tmp is private;
a private PID namespace with --die-with-parent and --new-session, so nothing outlives the call and
runner's own process, environment and key are invisible; `sandbox.network: false` unshares the network.

The fallback (no bwrap, or `sandbox: off`): runner becomes a child subreaper, so processes that detach
(double fork, setsid, nohup) stay its descendants; `contained()` kills every process of its scope
(by process group, session, the RUNNER_SCOPE token in the environment, or adoption) and reaps them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...config import ALWAYS_PROTECTED, Goal
from ...errors import SandboxError
from .paths import check_inputs, check_scripts
from .process import SCOPE_VAR, Scope, current_scope, known_children, run_env

HIDDEN_FILES = (".env",)
STATE_FOLDERS = (".runner",)
MAX_BINDS = 500
"""Protected paths bound read-only, at most (globs matching more are left to the tamper lock)."""
FALLBACK = "the fallback tracks and kills the agent's processes and scrubs their environment"

_probes: dict[str, str | None] = {}
"""bwrap path -> None when it works, else why not (probed once per process)."""


class Jail:
    """The argv prefix of a goal's jailed processes; empty when the sandbox is off. The bind list is made when
    the first process needs it (a run whose tools start none never stats its protected paths for it)."""

    def __init__(self, goal: Goal | None, status: str) -> None:
        self.goal, self.status = goal, status

    @classmethod
    def for_goal(cls, goal: Goal) -> Jail:
        """Raises SandboxError when the goal requires bwrap (`sandbox: bwrap`) and it cannot run."""
        why_not = _why_not(goal)
        return cls(goal if why_not is None else None, _status(goal, why_not))

    @functools.cached_property
    def prefix(self) -> tuple[str, ...]:
        return tuple(_bwrap_argv(self.goal)) if self.goal is not None else ()

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix, *argv]


def jail_argv(goal: Goal, argv: Sequence[str]) -> list[str]:
    """`argv` as it runs in the goal's jail (unchanged when the sandbox is off): for MCP stdio servers."""
    return Jail.for_goal(goal).wrap(argv)


def sandbox_status(goal: Goal) -> str:
    """One line for `runner validate` and a run's first line: jailed, or off and why."""
    try:
        return _status(goal, _why_not(goal))
    except SandboxError as exc:
        return f"sandbox: error: {exc}"


def jail_refused(goal: Goal) -> str | None:
    """Why the goal cannot run here at all (`sandbox: bwrap` where bwrap cannot run), or None."""
    try:
        _status(goal, _why_not(goal))
    except SandboxError as exc:
        return str(exc)
    return None


def _status(goal: Goal, why_not: str | None) -> str:
    """Jailed, or off and why (without building the jail's bind list); SandboxError when bwrap is required."""
    if why_not is None:
        return f"sandbox: bubblewrap jail (network {'on' if goal.sandbox.network else 'off'})"
    if goal.sandbox.mode == "bwrap":
        raise SandboxError(f"goal {goal.name}: `sandbox: bwrap` is required but {why_not}")
    return f"sandbox: off ({why_not}); {FALLBACK}"


def _why_not(goal: Goal) -> str | None:
    if goal.sandbox.mode == "off":
        return "`sandbox: off`"
    if os.environ.get("RUNNER_SANDBOX") == "off":
        return "RUNNER_SANDBOX=off in the environment"
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux, this is {sys.platform}"
    bwrap = _bwrap()
    if bwrap is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    if bwrap not in _probes:
        _probes[bwrap] = _probe(bwrap)
    return _probes[bwrap]


def _probe(bwrap: str) -> str | None:
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid"]
    argv += ["--die-with-parent", "--new-session", "--", "/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap cannot run: {exc}"
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"bwrap cannot create namespaces here ({detail})"
    return None


def _bwrap() -> str | None:
    """Where bwrap is on PATH: looked up again only when PATH changed or the file found is gone."""
    path = os.environ.get("PATH", os.defpath)
    found = _found.get(path)
    if found is None or not os.access(found, os.X_OK):
        found = _found[path] = shutil.which("bwrap")
    return found


_found: dict[str, str | None] = {}


def _bwrap_argv(goal: Goal) -> list[str]:
    root, workdir = goal.rootpath, goal.workpath
    argv = [_bwrap() or "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    argv += ["--tmpfs", "/tmp"]
    for kept in _kept_in_tmp(root):
        argv += ["--ro-bind", str(kept), str(kept)]
    argv += ["--bind", str(workdir), str(workdir)]
    for path in _read_only(goal, root, workdir):
        argv += ["--ro-bind", str(path), str(path)]
    for base in {root, workdir}:
        for name in HIDDEN_FILES:
            if (base / name).exists():
                argv += ["--ro-bind", "/dev/null", str(base / name)]
        for name in STATE_FOLDERS:
            if (base / name).is_dir():
                argv += ["--tmpfs", str(base / name), *_run_files(base / name), "--remount-ro", str(base / name)]
    argv += ["--unshare-pid", "--die-with-parent", "--new-session", "--chdir", str(workdir)]
    if not goal.sandbox.network:
        argv.append("--unshare-net")
    return [*argv, "--"]


def _kept_in_tmp(root: Path) -> list[Path]:
    """What the jail's private /tmp must still show, read-only: the project (`root`, resolved), and the Python
    and the runner installation the agent's commands run with, when they live under /tmp (a checkout or a venv
    there)."""
    kept = {*_installation(), root}
    kept = {path for path in kept if path.is_relative_to("/tmp") and path != Path("/tmp")}
    return sorted(path for path in kept if not any(path != other and path.is_relative_to(other) for other in kept))


@functools.cache
def _installation() -> tuple[Path, ...]:
    """The Python and the runner installation this process runs (they do not move while it runs)."""
    wanted = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent, Path(__file__).parents[3]}
    return tuple(path.resolve() for path in wanted if path.exists())


def _run_files(state: Path) -> list[str]:
    """Binds of the files of the run that the state folder holds for the agent (RUNNER_TRIGGER_FILE)."""
    binds: list[str] = []
    for value in (run_env.get() or {}).values():
        path = Path(value)
        if path.is_absolute() and path.is_file() and path.resolve().is_relative_to(state.resolve()):
            binds += ["--ro-bind", str(path.resolve()), str(path.resolve())]
    return binds


def _read_only(goal: Goal, root: Path, workdir: Path) -> list[Path]:
    """Existing protected paths and check inputs inside the workdir (outside it all is read-only already)."""
    patterns = [p for p in ALWAYS_PROTECTED if p not in (*HIDDEN_FILES, *STATE_FOLDERS)]
    patterns += [*goal.protect, *check_scripts(goal), *check_inputs(goal)]
    found: set[Path] = set()
    for pattern in patterns:
        rel = pattern.removesuffix("/**").strip("/")
        matches = root.glob(pattern) if any(c in rel for c in "*?[") else [root / rel]
        for path in matches:
            if len(found) >= MAX_BINDS:
                break
            if path.exists() and not path.is_symlink():
                full = path.resolve()
                if full.is_relative_to(workdir) and full != workdir:
                    found.add(full)
    return sorted(found)


# the fallback, and the end of every attempt
_subreaper = False


def become_subreaper() -> bool:
    """Make runner the child subreaper (Linux): orphans of its children are re-parented to it, not to init."""
    global _subreaper
    if _subreaper or not sys.platform.startswith("linux"):
        return _subreaper
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


@contextlib.asynccontextmanager
async def contained(run_id: str = "") -> AsyncIterator[Scope]:
    """A scope (an attempt, a round of checks): every process started inside it is gone when it ends.

    Its token starts with `run_id`, so that `kill_leftovers(run_id)` finds what a killed runner left."""
    become_subreaper()
    scope = Scope(f"{run_id}:{secrets.token_hex(8)}", time.time(), set())
    token = current_scope.set(scope)
    try:
        yield scope
    finally:
        current_scope.reset(token)
        # reading /proc takes milliseconds: off the event loop, and finished even if the wait is cancelled
        await asyncio.shield(asyncio.to_thread(end_scope, scope))


def end_scope(scope: Scope) -> list[int]:
    """Kill every process of the scope, however it detached; the pids killed."""
    for leader in scope.leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
    killed: list[int] = []
    if not scope.leaders or not os.path.isdir("/proc"):
        return killed  # nothing started in the scope, so nothing can carry its token or descend from it
    since = _first_possible_pid(scope)
    for _ in range(10):  # a process forking as it dies is caught on the next pass
        procs = _processes(since)
        victims = _members(scope, procs)
        if not victims:
            _reap(procs)
            break
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed += victims
        time.sleep(0.005)
    return killed


def kill_leftovers(run_id: str) -> list[int]:
    """Kill the processes of a run whose runner died (kill -9) that left their process group: every process
    whose environment names one of the run's scopes, and its descendants. Linux; the pids killed."""
    if not run_id or not os.path.isdir("/proc"):
        return []
    prefix = f"{SCOPE_VAR}={run_id}:".encode()
    procs = _processes()
    chosen = {p.pid for p in procs.values() if p.state != "Z" and (_scope_of(p.pid) or b"").startswith(prefix)}
    chosen = _with_descendants(chosen, procs)
    for pid in chosen:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return sorted(chosen)


@dataclass
class _Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    started: float


FULL_SCAN_AFTER = 60.0
"""A scope older than this is ended with a scan of every process (pids may have wrapped around meanwhile)."""


def _first_possible_pid(scope: Scope) -> int:
    """The lowest pid a process of the scope can have: its first leader's, since every process of the scope
    descends from a leader and pids are handed out in increasing order; 0 (all) when the scope is old or the
    pid counter went round since (a short attempt in a busy daemon skips reading the machine's other processes)."""
    if not scope.leaders or time.time() - scope.started > FULL_SCAN_AFTER:
        return 0
    first = min(scope.leaders)
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as file:
            last = int(file.read().strip())
    except (OSError, ValueError):
        return 0
    return first if last >= first else 0


def _processes(since: int = 0) -> dict[int, _Proc]:
    """Every process of the machine (pid `since` and above), read from /proc."""
    found: dict[int, _Proc] = {}
    boot, tick = _boot_time(), os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) < since:
            continue
        try:
            fd = os.open(f"/proc/{entry}/stat", os.O_RDONLY)
            try:
                fields = os.read(fd, 4096).rsplit(b")", 1)[1].split()
            finally:
                os.close(fd)
        except (OSError, IndexError):
            continue
        pid = int(entry)
        found[pid] = _Proc(
            pid, int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode(), boot + int(fields[19]) / tick
        )
    return found


def _members(scope: Scope, procs: dict[int, _Proc]) -> list[int]:
    """Processes of the scope: its groups and sessions, its token, adopted orphans, and their descendants.

    Only processes started since the scope began can be its own (start times have 1 s of slack)."""
    me = os.getpid()
    marker = f"{SCOPE_VAR}={scope.token}".encode()
    chosen: set[int] = set()
    my_sid = os.getsid(0)
    for proc in procs.values():
        if proc.pid == me or proc.state == "Z" or proc.started < scope.started - 2:
            continue
        if proc.pgid in scope.leaders or proc.sid in scope.leaders:
            chosen.add(proc.pid)
            continue
        scope_var = _scope_of(proc.pid)
        if scope_var == marker:
            chosen.add(proc.pid)
        elif (
            _subreaper
            and proc.ppid == me
            and proc.pid not in known_children
            and scope_var is None
            and proc.sid != my_sid
        ):
            chosen.add(proc.pid)  # adopted, and it dropped its scope from the environment: it is hiding
    return sorted(_with_descendants(chosen, procs))


def _with_descendants(chosen: set[int], procs: dict[int, _Proc]) -> set[int]:
    me = os.getpid()
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    pending = list(chosen)
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in chosen and child != me:
                chosen.add(child)
                pending.append(child)
    chosen.discard(me)
    return chosen


def _scope_of(pid: int) -> bytes | None:
    """`RUNNER_SCOPE=...` from a process's initial environment; None when it has none (or is unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as file:
            environ = file.read()
    except OSError:
        return b"unreadable"
    for item in environ.split(b"\0"):
        if item.startswith(SCOPE_VAR.encode() + b"="):
            return item
    return None


def _reap(procs: dict[int, _Proc]) -> None:
    """Collect adopted orphans that ended (zombies runner did not start itself)."""
    me, my_sid = os.getpid(), os.getsid(0)
    for proc in procs.values():
        if proc.ppid == me and proc.state == "Z" and proc.pid not in known_children and proc.sid != my_sid:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(proc.pid, os.WNOHANG)


@functools.cache
def _boot_time() -> float:
    try:
        with open("/proc/stat", "rb") as file:
            for line in file:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0
