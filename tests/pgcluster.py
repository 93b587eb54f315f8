"""A throwaway PostgreSQL cluster for one test session.

``initdb`` and ``pg_ctl`` in a temporary directory; the server listens on
127.0.0.1 at a free port and on a unix socket in that directory. PostgreSQL
refuses to run as root, so when the suite runs as root the cluster belongs to
the ``postgres`` user and every server command runs through ``runuser`` (or
``su``). Durability is off (fsync, synchronous_commit, full_page_writes): a
crash of the machine loses a test cluster, nothing else.

Databases are made by cloning a template (``CREATE DATABASE ... TEMPLATE``),
which copies a migrated schema in milliseconds instead of migrating per test.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

TOOLS = ("initdb", "pg_ctl")
OWNER = "postgres"  # the OS user that runs the server when we are root; also the superuser

SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "log_min_messages": "warning",
    "log_min_error_statement": "panic",
}


class ClusterError(RuntimeError):
    """The test cluster could not be created, started or stopped."""


def missing_tools() -> list[str]:
    """The server programs (and privilege tools, as root) that are not available here."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OWNER)
        except KeyError:
            missing.append(f"a {OWNER!r} user (PostgreSQL will not run as root)")
        if shutil.which("runuser") is None and shutil.which("su") is None:
            missing.append("runuser or su")
    return missing


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgCluster:
    """One running PostgreSQL server in a temporary directory; ``stop()`` removes it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.log = root / "postgres.log"
        self.port = 0
        self._names = itertools.count(1)
        self._admin: psycopg.Connection | None = None
        self._as_root = os.geteuid() == 0

    # --- lifecycle ---------------------------------------------------------------

    @classmethod
    def start(cls) -> PgCluster:
        """initdb a new cluster and start it; everything is removed again on failure."""
        root = Path(tempfile.mkdtemp(prefix="durably-pg-"))
        cluster = cls(root)
        try:
            cluster._initdb()
            cluster._start_on_free_port()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def stop(self) -> None:
        """Stop the server at once (nothing in it is worth a clean shutdown) and delete it."""
        self._close_admin()
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def restart(self) -> None:
        """``pg_ctl restart``: every open connection is cut, the data stays."""
        self._close_admin()
        self._run(
            "pg_ctl", "restart", "-D", str(self.data), "-m", "fast", "-w", "-l", str(self.log)
        )

    # --- databases -----------------------------------------------------------------

    def url(self, dbname: str, user: str = OWNER) -> str:
        """A postgresql:// URL for a database of this cluster, over TCP."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def execute(self, statement: str) -> None:
        """Run one statement in the ``postgres`` database, outside any transaction."""
        self.admin().execute(statement)  # type: ignore[arg-type]

    def create_database(self, template: str | None = None, prefix: str = "test") -> str:
        """A new database (a copy of ``template`` if given, else empty); returns its name."""
        name = f"{prefix}_{next(self._names)}"
        clause = f" TEMPLATE {template or 'template0'}"
        if self.admin().info.server_version >= 150000:
            # Copying the files beats logging every block for a small template (the
            # checkpoint it needs is cheap with fsync off).
            clause += " STRATEGY FILE_COPY"
        self.execute(f"CREATE DATABASE {name}{clause}")
        return name

    def drop_database(self, name: str) -> None:
        """Drop the database, cutting any connection still open to it."""
        self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def admin(self) -> psycopg.Connection:
        """An autocommit superuser connection to the ``postgres`` database."""
        if self._admin is None or self._admin.closed:
            self._close_admin()
            self._admin = psycopg.connect(self.url("postgres"), autocommit=True)
        return self._admin

    # --- internals -------------------------------------------------------------------

    def _close_admin(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            admin.close()

    def _initdb(self) -> None:
        if self._as_root:
            entry = pwd.getpwnam(OWNER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)
        self._run(
            "initdb",
            "-D", str(self.data),
            "-U", OWNER,
            "-A", "trust",
            "-E", "UTF8",
            "--no-locale",
            "--no-sync",
            "--no-instructions",
        )  # fmt: skip

    def _start_on_free_port(self, attempts: int = 3) -> None:
        for attempt in itertools.count(1):
            self.port = free_port()
            self._configure()
            try:
                self._run("pg_ctl", "start", "-D", str(self.data), "-w", "-l", str(self.log))
                return
            except ClusterError:
                if attempt >= attempts:  # someone took the port between bind and listen?
                    raise
                time.sleep(0.1)

    def _configure(self) -> None:
        settings = {
            **SETTINGS,
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
        }
        # postgresql.auto.conf is read last, so rewriting it wins over the defaults.
        text = "".join(f"{key} = {value}\n" for key, value in settings.items())
        conf = self.data / "postgresql.auto.conf"
        conf.write_text(text)
        if self._as_root:
            entry = pwd.getpwnam(OWNER)
            os.chown(conf, entry.pw_uid, entry.pw_gid)

    def _run(self, tool: str, *args: str) -> None:
        path = shutil.which(tool)
        if path is None:
            raise ClusterError(f"{tool} is not on PATH")
        command = [path, *args]
        if self._as_root:
            if shutil.which("runuser"):
                command = ["runuser", "-u", OWNER, "--", *command]
            else:
                command = ["su", OWNER, "-s", "/bin/sh", "-c", shlex.join(command)]
        done = subprocess.run(
            command,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            log = ""
            with contextlib.suppress(OSError):
                log = "\n".join(self.log.read_text().splitlines()[-20:])
            raise ClusterError(
                f"{shlex.join(command)} exited {done.returncode}\n{done.stdout}{done.stderr}"
                + (f"\nserver log:\n{log}" if log else "")
            )
