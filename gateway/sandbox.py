"""Sandboxed tools (`endpoint.type: sandbox`, SPEC §11): a command run under bubblewrap.

The command reads the validated input as JSON on standard input and writes JSON on
standard output. It runs in namespaces of its own (user, PID, IPC, UTS, cgroup, and
network unless the profile is `egress`), with every capability dropped, a new session,
an empty environment but for `PATH`, `HOME`, `LANG`, `TMPDIR` and the leased credential,
read-only system directories and only the parts of `/etc` a runtime needs, its own empty
`/tmp` (a size-bounded tmpfs), and read-only mounts only from `EAI_SANDBOX_ROOTS`. Limits
come from setrlimit in the child (`prlimit`: address space, CPU time, processes, file
size), from a memory cgroup of its own where one can be made (`_Cgroups`: the profile's
memory for the whole tree) and from the gateway (wall time, output bytes). When the
gateway runs as root the sandbox runs as an unprivileged uid of its own (one per sandbox
running on the machine, `_claimed_uid`), so the process limit counts that sandbox alone;
killing bwrap kills the whole PID namespace, double-forked children included.

Calls run outside any database transaction (the pipeline's rule), one process each,
bounded in number per process and per tenant (`EAI_SANDBOX_SLOTS`,
`EAI_SANDBOX_TENANT_SLOTS`): the excess waits at most 0.25 s, then answers 503.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import selectors
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils.translation import gettext_lazy as _

from eai.errors import Text

# Parts of /etc a runtime needs (dynamic linker cache, locale, time zone, users for
# getpwuid, certificates and name service for egress). Never shadow, sudoers, ssh, …
ETC_ALLOWED = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "timezone",
    "mime.types",
    "nsswitch.conf",
    "hosts",
    "resolv.conf",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "python3",
    "python3.11",
)
SYSTEM_DIRS = ("/usr",)
ENV_NAME_RE = r"^[A-Z_][A-Z0-9_]{0,63}$"
STDERR_LIMIT = 64 * 1024
# Inside the sandbox: its own empty tmpfs, nothing of the host's /tmp.
SANDBOX_TMP = "/tmp"  # noqa: S108
WAIT_FOR_SLOT_S = 0.25
# What setpriv, prlimit and bwrap run with on the host: nothing of the gateway's, nothing
# of the tool's.
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
UID_BASE = 2_000_000  # sandbox uids when the gateway runs as root: one per sandbox
UID_POOL = 4096
UID_LOCK_DIR = "/run/eai-sandbox-uids"  # root's: only root runs sandboxes as other uids
CGROUP_PREFIX = "eai-sandbox-"
# Joins the cgroup named by $0 before running the sandbox: written by the process itself
# before any of the tool's code exists, so no allocation escapes the bound.
# A join that fails says nothing of the host's paths (its stderr would reach the tool's
# diagnostic) and exits 125.
CGROUP_JOIN = (
    '{ echo $$ > "$0/cgroup.procs"; } 2>/dev/null || exit 125; unset PWD OLDPWD; exec "$@"'
)


@dataclass(frozen=True)
class Profile:
    """What a sandbox may use. `network` is "none" or "host"."""

    name: str
    network: str = "none"
    memory_mb: int = 256
    cpu_seconds: int = 30
    processes: int = 64
    output_bytes: int = 1024 * 1024
    tmp_mb: int = 64
    mounts: tuple[tuple[str, str], ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "network": self.network,
            "memory_mb": self.memory_mb,
            "cpu_seconds": self.cpu_seconds,
            "processes": self.processes,
            "output_bytes": self.output_bytes,
            "tmp_mb": self.tmp_mb,
            "mounts": [{"source": s, "target": t} for s, t in self.mounts],
        }


BUILTIN = {
    "strict": Profile("strict", network="none"),
    "egress": Profile("egress", network="host"),
}


def maxima() -> dict[str, int]:
    """The platform's bounds on any profile (settings)."""
    return {
        "memory_mb": settings.EAI_SANDBOX_MAX_MEMORY_MB,
        "cpu_seconds": settings.EAI_SANDBOX_MAX_CPU_S,
        "processes": settings.EAI_SANDBOX_MAX_PROCESSES,
        "output_bytes": settings.EAI_SANDBOX_MAX_OUTPUT_BYTES,
        "tmp_mb": settings.EAI_SANDBOX_MAX_TMP_MB,
    }


def profile_errors(spec: dict[str, Any]) -> list[dict[str, str]]:
    """A `kind: SandboxProfile` spec's breaches of the platform's maxima and mount roots."""
    errors = []
    for key, bound in maxima().items():
        value = spec.get(key)
        if isinstance(value, int) and value > bound:
            errors.append({"path": f"/spec/{key}", "message": f"at most {bound} on this platform"})
    for index, mount in enumerate(spec.get("mounts") or []):
        source = Path(mount["source"])
        if not source.is_absolute() or not _under_roots(source.resolve()):
            errors.append(
                {
                    "path": f"/spec/mounts/{index}/source",
                    "message": "not under a directory the platform allows (EAI_SANDBOX_ROOTS)",
                }
            )
        target = mount["target"]
        if (
            not target.startswith("/")
            or ".." in target.split("/")
            or target.rstrip("/")
            in (
                "",
                "/usr",
                "/etc",
                "/proc",
                "/dev",
                SANDBOX_TMP,
            )
        ):
            errors.append(
                {"path": f"/spec/mounts/{index}/target", "message": "not a place to mount on"}
            )
    return errors


def _under_roots(resolved: Path) -> bool:
    """Whether a resolved path is one of `EAI_SANDBOX_ROOTS` or under one."""
    roots = [Path(r).resolve() for r in settings.EAI_SANDBOX_ROOTS]
    return any(resolved == root or root in resolved.parents for root in roots)


@contextmanager
def _opened_mounts(profile: Profile) -> Iterator[list[tuple[int, str]]]:
    """Each mount's source opened (O_PATH) and checked again now: a directory under
    `EAI_SANDBOX_ROOTS` at apply time may since have become a symlink to the gateway's
    checkout, or the platform may have dropped that root. bwrap binds the very file
    descriptor checked (`--ro-bind-fd`), so no later swap of the path counts."""
    fds: list[tuple[int, str]] = []
    try:
        for source, target in profile.mounts:
            try:
                fd = os.open(source, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                fd = -1
            if fd >= 0:
                fds.append((fd, target))
            if fd < 0 or not _under_roots(Path(os.readlink(f"/proc/self/fd/{fd}"))):
                raise SandboxError(
                    "tool_unavailable",
                    Text(_("a mount of its sandbox profile is not allowed here now")),
                    "unavailable",
                )
        yield fds
    finally:
        for fd, _target in fds:
            os.close(fd)


def profile_from_manifest(manifest: dict[str, Any]) -> Profile:
    spec = manifest["spec"]
    defaults = BUILTIN["egress" if spec.get("network") == "host" else "strict"]
    return Profile(
        name=manifest["metadata"]["name"],
        network=spec.get("network", defaults.network),
        memory_mb=spec.get("memory_mb", defaults.memory_mb),
        cpu_seconds=spec.get("cpu_seconds", defaults.cpu_seconds),
        processes=spec.get("processes", defaults.processes),
        output_bytes=spec.get("output_bytes", defaults.output_bytes),
        tmp_mb=spec.get("tmp_mb", defaults.tmp_mb),
        mounts=tuple((m["source"], m["target"]) for m in spec.get("mounts") or []),
    )


def runtime_state() -> tuple[str, str]:
    """("ok", "bwrap") when sandboxes can run, else ("off" | "unavailable", why)."""
    if settings.EAI_SANDBOX_RUNTIME == "off":
        return "off", "EAI_SANDBOX_RUNTIME=off"
    if settings.EAI_SANDBOX_RUNTIME != "bwrap":
        return "unavailable", f"unknown EAI_SANDBOX_RUNTIME {settings.EAI_SANDBOX_RUNTIME!r}"
    if not shutil.which("bwrap") or not shutil.which("prlimit"):
        return "unavailable", "bwrap (bubblewrap) or prlimit is not installed"
    if CGROUPS.root() is UNUSABLE:
        return "unavailable", "EAI_SANDBOX_CGROUP is not a cgroup directory this process can use"
    return "ok", "bwrap"


class SandboxError(Exception):
    """How a sandboxed call ended badly: `code` is the API error code."""

    def __init__(self, code: str, reason: Any, status: str) -> None:
        super().__init__(str(reason))
        self.code, self.reason, self.status = code, reason, status


class _Slots:
    """Sandboxes running at once in this process, in all and per tenant."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._free: list[int] = []
        self._busy: set[int] = set()
        self._size = 0
        self._per_tenant: Counter[str] = Counter()

    @contextmanager
    def take(self, tenant: str) -> Iterator[int]:
        total = settings.EAI_SANDBOX_SLOTS
        per_tenant = settings.EAI_SANDBOX_TENANT_SLOTS or max(1, total // 2)
        deadline = time.monotonic() + WAIT_FOR_SLOT_S
        with self._cond:
            if self._size != total:  # settings changed (tests): a fresh pool
                # Without the slots still held: never handed out twice at once.
                self._free = [s for s in range(total) if s not in self._busy]
                self._size = total
            while not self._free or self._per_tenant[tenant] >= per_tenant:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxError(
                        "tool_unavailable",
                        Text(_("every sandbox slot is busy; try again shortly")),
                        "unavailable",
                    )
                self._cond.wait(left)
            slot = self._free.pop()
            self._busy.add(slot)
            self._per_tenant[tenant] += 1
        try:
            yield slot
        finally:
            with self._cond:
                self._per_tenant[tenant] -= 1
                self._busy.discard(slot)
                if slot < self._size and slot not in self._free:
                    self._free.append(slot)
                self._cond.notify_all()


SLOTS = _Slots()


_UID_TURN = itertools.count()


@contextmanager
def _claimed_uid() -> Iterator[int]:
    """A uid no other sandbox on this machine runs as now, held by an flock on
    UID_LOCK_DIR/<uid> (released when the call ends or this process dies): every API
    and worker process has slots of its own, so a uid per slot alone would let one
    process's fork bomb spend another's sandbox's RLIMIT_NPROC."""
    os.makedirs(UID_LOCK_DIR, mode=0o700, exist_ok=True)
    info = os.lstat(UID_LOCK_DIR)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SandboxError(
            "tool_unavailable",
            Text(_("sandboxed tools cannot run here (%(why)s)"), why=f"unsafe {UID_LOCK_DIR}"),
            "unavailable",
        )
    start = (os.getpid() * 64 + next(_UID_TURN)) % UID_POOL
    for step in range(UID_POOL):
        uid = UID_BASE + (start + step) % UID_POOL
        fd = os.open(
            f"{UID_LOCK_DIR}/{uid}", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if _tasks_of(uid):
            # The last sandbox of this uid is still dying (a fork bomb's thousands, or
            # zombies no init reaps): its tasks would count against the next one's
            # RLIMIT_NPROC. Another uid.
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)
        return
    raise SandboxError(
        "tool_unavailable",
        Text(_("every sandbox slot is busy; try again shortly")),
        "unavailable",
    )


@contextmanager
def _environment_fd(env: dict[str, str]) -> Iterator[int]:
    """The tool's environment as bwrap arguments (`--clearenv --setenv NAME VALUE…`) in
    an anonymous file bwrap reads with `--args`: never in an argv (any local user reads
    it), never in the environment of setpriv, prlimit or bwrap on the host (readable in
    /proc/<pid>/environ, and a name like LD_PRELOAD would steer them, as root)."""
    fd = os.memfd_create("eai-sandbox-env")
    try:
        words = ["--clearenv"]
        for name, value in env.items():
            words += ["--setenv", name, value]
        os.write(fd, b"".join(w.encode() + b"\0" for w in words))
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _bwrap_argv(
    profile: Profile,
    command: list[str],
    *,
    env_fd: int | None = None,
    mounts: list[tuple[int, str]] | None = None,
) -> list[str]:
    """bwrap's arguments; `mounts` are the profile's, opened (`_opened_mounts`)."""
    argv = [
        shutil.which("bwrap") or "bwrap",
        *(["--args", str(env_fd)] if env_fd is not None else []),
        "--unshare-all",
        # No user namespace of its own inside (it would be root there, and every
        # namespaced corner of the kernel would open to it).
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--hostname",
        "sandbox",
    ]
    if profile.network == "host":
        argv.append("--share-net")
    for directory in SYSTEM_DIRS:
        if os.path.isdir(directory):
            argv += ["--ro-bind", directory, directory]
    for link in ("bin", "lib", "lib64", "sbin", "lib32"):
        path = Path("/") / link
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), f"/{link}"]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), f"/{link}"]
    for name in ETC_ALLOWED:
        path = Path("/etc") / name
        if path.exists():
            argv += ["--ro-bind", str(path), str(path)]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(profile.tmp_mb * 1024 * 1024), "--tmpfs", SANDBOX_TMP]
    for fd, target in mounts or ():
        argv += ["--ro-bind-fd", str(fd), target]
    # bwrap's own root and its /dev are writable tmpfs with no size bound (host memory):
    # read-only both, so the bounded /tmp is the one place to write (/dev/null still is).
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SANDBOX_TMP]
    # The environment comes from `--args` (see `_environment_fd`). bwrap adds PWD, which
    # `env -u` takes away.
    return [*argv, "--", "/usr/bin/env", "-u", "PWD", "--", *command]


def tool_environment(env: dict[str, str]) -> dict[str, str]:
    """Exactly what the tool sees: PATH, HOME, LANG, TMPDIR and the leased credential."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": SANDBOX_TMP,
        "LANG": "C.UTF-8",
        "TMPDIR": SANDBOX_TMP,
        **env,
    }


def _limits_argv(profile: Profile, uid: int | None) -> list[str]:
    processes = profile.processes
    if uid is None:
        # Unprivileged: RLIMIT_NPROC counts every task of this uid (the gateway's threads
        # too), so the bound is what runs now plus the profile's processes.
        processes += _tasks_of(os.getuid())
    memory = profile.memory_mb * 1024 * 1024
    argv = [
        shutil.which("prlimit") or "prlimit",
        f"--as={memory}",
        f"--cpu={profile.cpu_seconds}",
        f"--nproc={processes}",
        f"--fsize={profile.tmp_mb * 1024 * 1024}",
        "--core=0",
        "--",
    ]
    if uid is not None:
        argv = [
            shutil.which("setpriv") or "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
            *argv,
        ]
    return argv


def _tasks_of(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


class _Cgroups:
    """A memory cgroup per sandbox, so that the profile's memory bounds the whole tree
    and not each process (RLIMIT_AS alone lets four processes hold four times it).

    Where: `EAI_SANDBOX_CGROUP`, a cgroup directory the gateway may create children in
    (cgroup v2: delegated, with `memory` in its `cgroup.subtree_control`; v1: a directory
    of the memory hierarchy), `off` for none, or `auto` (the default): as root on a
    cgroup v1 machine, this process's own memory cgroup. Without one, RLIMIT_AS is the
    only memory bound (per process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: tuple[Path, int] | None = None
        self._setting: str | None = None
        self._count = itertools.count()

    def root(self) -> tuple[Path, int] | None:
        """(directory, cgroup version) children are made in, None, or `UNUSABLE` when the
        setting names a directory that cannot serve (sandboxes then do not run)."""
        setting = settings.EAI_SANDBOX_CGROUP
        with self._lock:
            if self._setting != setting:
                self._setting = setting
                self._root = self._find(setting)
            return self._root

    @staticmethod
    def _find(setting: str) -> tuple[Path, int] | None:
        if setting == "off":
            return None
        if setting == "auto":
            if os.geteuid() != 0:
                return None
            try:
                lines = Path("/proc/self/cgroup").read_text().splitlines()
            except OSError:
                return None
            own = next(
                (ln.split(":", 2)[2] for ln in lines if "memory" in ln.split(":")[1].split(",")),
                None,
            )
            if own is None:
                return None  # cgroup v2 only: its own cgroup holds processes, cannot nest
            candidate = Path("/sys/fs/cgroup/memory") / own.lstrip("/")
        else:
            candidate = Path(setting)
        version = 2 if (candidate / "cgroup.controllers").exists() else 1
        limit_file = "memory.max" if version == 2 else "memory.limit_in_bytes"
        probe = candidate / f"{CGROUP_PREFIX}{os.getpid()}-probe"
        try:
            probe.mkdir(exist_ok=True)
            # A process must be able to join it too (cgroup v2 refuses a join where the
            # gateway's own cgroup holds processes, or without write access above).
            ok = (probe / limit_file).exists()  # the kernel's: a cgroup, not a directory
            if ok:
                joined = subprocess.run(  # noqa: S603 - fixed argv
                    ["/bin/sh", "-c", CGROUP_JOIN, str(probe), "/bin/true"],
                    env=HOST_ENV,
                    capture_output=True,
                    timeout=10,
                    check=False,
                )
                ok = joined.returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        finally:
            _empty_and_remove(probe)
        if not ok:
            return None if setting == "auto" else UNUSABLE
        _Cgroups._sweep(candidate)
        return candidate, version

    @staticmethod
    def _sweep(root: Path) -> None:
        """Children left by a process that died mid-call: empty ones of dead pids go."""
        for child in root.glob(f"{CGROUP_PREFIX}*"):
            pid = child.name[len(CGROUP_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):
                    child.rmdir()

    @contextmanager
    def of(self, profile: Profile) -> Iterator[Path | None]:
        """A fresh cgroup bounded at the profile's memory and processes, emptied (its
        processes killed) and removed afterwards; None where there is no cgroup root."""
        found = self.root()
        if found is None:
            yield None
            return
        if found is UNUSABLE:  # runtime_state() said so already; never run unbounded
            raise SandboxError(
                "tool_unavailable",
                Text(_("sandboxed tools cannot run here (%(why)s)"), why="EAI_SANDBOX_CGROUP"),
                "unavailable",
            )
        root, version = found
        path = root / f"{CGROUP_PREFIX}{os.getpid()}-{next(self._count)}"
        memory = str(profile.memory_mb * 1024 * 1024)
        if version == 2:
            limits = {"memory.max": memory, "memory.swap.max": "0"}
            limits["pids.max"] = str(profile.processes)
        else:
            limits = {"memory.limit_in_bytes": memory, "memory.memsw.limit_in_bytes": memory}
        try:
            path.mkdir()
            for name, value in limits.items():
                if (path / name).exists() or name in ("memory.max", "memory.limit_in_bytes"):
                    (path / name).write_text(value)
        except OSError as exc:  # fail closed: never a sandbox without its bound
            _empty_and_remove(path)
            raise SandboxError(
                "tool_unavailable",
                Text(
                    _("the sandbox's memory cgroup could not be made (%(why)s)"),
                    why=exc.strerror or type(exc).__name__,
                ),
                "unavailable",
            ) from exc
        try:
            yield path
        finally:
            _empty_and_remove(path)


def _empty_and_remove(path: Path) -> None:
    if not path.exists():
        return
    deadline = time.monotonic() + 5
    while True:
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for pid in pids:
            _kill_member(path, pid)
        try:
            path.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # swept when this process is gone (`_Cgroups._sweep`)
            time.sleep(0.02)


def _kill_member(path: Path, pid: int) -> None:
    """SIGKILL `pid` if it is still the process of the cgroup at `path`: a pidfd names
    that very process, so one that ended and whose number was reused since is left
    alone (read as root, a number alone could name anybody's process)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        member = Path(f"/proc/{pid}/cgroup").read_text()
        if f"/{path.name}\n" in member or member.rstrip("\n").endswith(f"/{path.name}"):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


CGROUPS = _Cgroups()
UNUSABLE = (Path("/nonexistent"), 0)


def run(
    endpoint: dict[str, Any], payload: Any, *, profile: Profile, tenant: str, env: dict[str, str]
) -> Any:
    """Run the sandboxed command with `payload` on stdin; its stdout (JSON), or raise."""
    state, why = runtime_state()
    if state != "ok":
        raise SandboxError(
            "tool_unavailable",
            Text(_("sandboxed tools cannot run here (%(why)s)"), why=why),
            "unavailable",
        )
    timeout_s = endpoint.get("timeout_ms", 30000) / 1000
    stdin = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    with SLOTS.take(tenant), contextlib.ExitStack() as stack:
        uid = stack.enter_context(_claimed_uid()) if os.geteuid() == 0 else None
        cgroup = stack.enter_context(CGROUPS.of(profile))
        with _environment_fd(tool_environment(env)) as env_fd, _opened_mounts(profile) as mounts:
            argv = _limits_argv(profile, uid) + _bwrap_argv(
                profile, endpoint["command"], env_fd=env_fd, mounts=mounts
            )
            if cgroup is not None:
                argv = ["/bin/sh", "-c", CGROUP_JOIN, str(cgroup), *argv]
            return _communicate(
                argv,
                stdin,
                timeout_s,
                profile.output_bytes,
                (env_fd, *(fd for fd, _target in mounts)),
                secrets=tuple(env.values()),
            )


def _communicate(
    argv: list[str],
    stdin: bytes,
    timeout_s: float,
    limit: int,
    fds: tuple[int, ...],
    *,
    secrets: tuple[str, ...] = (),
) -> bytes:
    started = time.monotonic()
    process = subprocess.Popen(  # noqa: S603 - argv built above, no shell
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        pass_fds=fds,
        env=HOST_ENV,  # the tool's own comes through `--args` (`_environment_fd`)
        # bwrap is the sandbox's PID 1, whose /proc/1/environ and cwd the tool can read:
        # nothing of the gateway's checkout there either.
        cwd="/",
    )
    out, err = bytearray(), bytearray()
    overflow = timed_out = False
    selector = selectors.DefaultSelector()
    try:
        # The input is written as the tool reads it, under the same clock: written all at
        # once, a tool that never reads a payload larger than a pipe holds would block
        # this thread past any timeout.
        pending = memoryview(stdin)
        os.set_blocking(process.stdin.fileno(), False)  # type: ignore[union-attr]
        if pending:
            selector.register(process.stdin, selectors.EVENT_WRITE, None)  # type: ignore[arg-type]
        else:
            process.stdin.close()  # type: ignore[union-attr]
        selector.register(process.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
        selector.register(process.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
        while selector.get_map():
            left = timeout_s - (time.monotonic() - started)
            if left <= 0:
                timed_out = True
                break
            for key, _events in selector.select(min(left, 0.5)):
                if key.data is None:  # the tool's stdin
                    try:
                        pending = pending[os.write(key.fd, pending[:65536]) :]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it stopped reading: its answer will say
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(key.fileobj)
                        process.stdin.close()  # type: ignore[union-attr]
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer: bytearray = key.data
                if buffer is out and len(out) + len(chunk) > limit:
                    overflow = True
                    break
                buffer.extend(chunk)
                if buffer is err and len(err) > STDERR_LIMIT:
                    # The tail is kept (a traceback ends there); the head's cut edge
                    # stays far from the part quoted (`_scrubbed_reason`).
                    del err[: len(err) - STDERR_LIMIT]
            if overflow:
                break
        if timed_out or overflow:
            _kill(process)
        else:
            try:
                process.wait(timeout=max(0.1, timeout_s - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill(process)
    finally:
        selector.close()
        _kill(process)
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()  # type: ignore[union-attr]
    diagnostic = err.decode("utf-8", "replace")
    for secret in secrets:
        # Masked here already (the pipeline's DLP masks it again, encoded forms too): the
        # exception's text may reach a log or a traceback before the pipeline scrubs it.
        if secret:
            diagnostic = diagnostic.replace(secret, "[SECRET]")
    diagnostic = diagnostic.strip()[-2000:]
    if timed_out:
        raise SandboxError("tool_timeout", "timeout", "timed_out")
    if overflow:
        raise SandboxError(
            "tool_error",
            Text(_("the tool printed more than %(limit)s bytes"), limit=limit),
            "failed",
        )
    if process.returncode != 0:
        if process.returncode < 0:
            reason = Text(
                _("the tool was killed by signal %(signal)s (a limit of its profile?)"),
                signal=signal.Signals(-process.returncode).name,
            )
        else:
            reason = Text(
                _("the tool exited with status %(status)s: %(diagnostic)s"),
                status=process.returncode,
                # Cut to its last 500 characters only once masked (a cut through a
                # secret would leave a piece the mask no longer recognises).
                diagnostic=diagnostic or "-",
            )
        raise SandboxError("tool_error", reason, "failed")
    if not out.strip():
        raise SandboxError("invalid_output", Text(_("the tool's output is not JSON")), "failed")
    return bytes(out)  # parsed by the caller (endpoints.parse_answer)


def _kill(process: subprocess.Popen) -> None:
    """The whole tree: bwrap's session (it is the group leader); --die-with-parent takes
    the PID namespace down with it, double-forked children included."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
