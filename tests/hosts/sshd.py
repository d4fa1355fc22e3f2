"""A real ``sshd`` in every namespaced host, with a throwaway host key and client key.

``SshHosts(hosts, tmp)`` starts ``/usr/sbin/sshd -D`` inside each namespace of a
:class:`~tests.hosts.bridged.BridgedHosts`, listening on that host's address, accepting
only a key generated for the test. :attr:`rsh` is the ``--rsh`` template that logs in
with it. :func:`sshd_missing` says why not (and how to install it) when it cannot run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .bridged import BridgedHosts

__all__ = ["SshHosts", "sshd_missing"]

SSHD = "/usr/sbin/sshd"


def sshd_missing() -> str | None:
    if not os.path.exists(SSHD) or shutil.which("ssh") is None:
        return "sshd/ssh not installed (apt-get install -y openssh-server openssh-client)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not installed (apt-get install -y openssh-client)"
    return None


class SshHosts:
    def __init__(self, hosts: BridgedHosts, tmp: Path) -> None:
        self.hosts = hosts
        self.dir = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)],
                check=True,
                timeout=30,
            )
        (tmp / "authorized_keys").write_bytes((tmp / "client_key.pub").read_bytes())
        os.chmod(tmp / "authorized_keys", 0o600)
        try:
            for i, name in enumerate(hosts.names):
                cfg = tmp / f"sshd_config.{i}"
                cfg.write_text(
                    f"ListenAddress {hosts.host_addr(i)}\nPort 22\n"
                    f"HostKey {tmp / 'host_key'}\nAuthorizedKeysFile {tmp / 'authorized_keys'}\n"
                    f"PidFile {tmp / f'sshd.{i}.pid'}\nStrictModes no\nUsePAM no\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                    "KbdInteractiveAuthentication no\nPrintMotd no\nLogLevel ERROR\n"
                )
                self.procs.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", name, SSHD, "-D", "-e", "-f", str(cfg)],
                        stdin=subprocess.DEVNULL,
                    )
                )
            for i in range(len(hosts.names)):
                self._wait_listening(hosts.host_addr(i))
        except BaseException:
            self.close()
            raise

    def _wait_listening(self, addr: str) -> None:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection((addr, 22), timeout=2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    @property
    def rsh(self) -> str:
        return (
            "ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=no "
            f"-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i {self.dir / 'client_key'} "
            "{host}"
        )

    def daemon_pids(self) -> set[str]:
        return {str(p.pid) for p in self.procs}

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()
