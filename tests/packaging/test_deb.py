"""The Debian package, as a packager and an operator meet it (the package tier).

Builds the .deb with packaging/build-deb, checks it with lintian, installs it into a fresh
Debian 12 root made with debootstrap, and inside that root runs the relay the way systemd would
run the installed unit: its ExecStart= line expanded with the installed relay.env, as the unit's
user, with the unit's umask, its credentials directory and a notify socket. Then an
organisation is bootstrapped (as that user), /readyz answers, and a call goes through the relay
from this checkout's own CLI to a listener on this host.

Opt-in (AGENTCALL_PACKAGE_TIER=1; .ci/run sets it): it needs root, Debian 12, PyPI and the
Debian mirror, and skips with the reason when any is missing. The pristine debootstrap root and
the .debs apt fetched into it are kept in /var/cache/agentcall-tests (AGENTCALL_TEST_CACHE), so
only the first run downloads a system.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from agentcall.testing.tlsca import make_ca
from tests.e2e.installs import Install
from tests.e2e.processes import REPO, LogFollower, free_port
from tests.unit.test_debian_pins import pins

# network: the skip check dials the mirror and PyPI from this process.
pytestmark = [pytest.mark.packaging, pytest.mark.slow, pytest.mark.network]

TIER_ENV = "AGENTCALL_PACKAGE_TIER"
CACHE = Path(os.environ.get("AGENTCALL_TEST_CACHE", "/var/cache/agentcall-tests"))
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
BUILD_TOOLS = (
    "debootstrap",
    "dh-virtualenv",
    "lintian",
    "dpkg-dev",
    "debhelper",
    "python3.11-venv",
)
VENV = "/usr/lib/agentcall/venv"
UNIT = "agentcall-relay.service"
# Bounds waits for events (a datagram, a process ending); never a delay.
WAIT_S = 120.0


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=10):
            return True
    except OSError:
        return False


def _skip_reason() -> str | None:
    if os.environ.get(TIER_ENV) != "1":
        return f"the package tier runs only with {TIER_ENV}=1 (.ci/run sets it)"
    if os.geteuid() != 0:
        return "the package tier needs root (debootstrap, chroot, apt-get)"
    release = Path("/etc/os-release")
    if not release.exists() or 'VERSION_ID="12"' not in release.read_text():
        return "the package tier builds for Debian 12 and runs only there"
    for host, port, what in (
        ("deb.debian.org", 80, "the Debian mirror"),
        ("pypi.org", 443, "PyPI"),
    ):
        if not _reachable(host, port):
            return f"{what} ({host}:{port}) cannot be reached; the package tier needs it"
    return None


def _run(
    args: list[str],
    *,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> str:
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, check=False, env=env, cwd=cwd
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{shlex.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout


def _install_build_tools() -> None:
    status = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Status}\n", *BUILD_TOOLS],
        capture_output=True,
        text=True,
        check=False,
    )
    if status.returncode == 0 and set(status.stdout.split()) == {"installed"}:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", *BUILD_TOOLS]
    if subprocess.run(install, capture_output=True, env=env, check=False).returncode != 0:
        update = subprocess.run(
            ["apt-get", "update"], capture_output=True, text=True, env=env, check=False
        )
        if update.returncode != 0 or "Err:" in update.stdout:
            pytest.skip(f"apt cannot reach its mirror to install {' '.join(BUILD_TOOLS)}")
        _run(install, env=env)


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    _install_build_tools()
    out = tmp_path_factory.mktemp("deb")
    printed = _run([str(REPO / "packaging" / "build-deb"), str(out)], cwd=REPO)
    built = Path(printed.strip().splitlines()[-1])
    assert built.is_file(), printed
    return built


def _contents(deb: Path) -> set[str]:
    listing = _run(["dpkg-deb", "--contents", str(deb)])
    return {
        line.split(None, 5)[5].split(" -> ")[0].removeprefix(".") for line in listing.splitlines()
    }


def test_the_package_holds_what_an_operator_needs(deb: Path, tmp_path: Path) -> None:
    names = _contents(deb)
    expected = {
        "/usr/bin/agentcall",
        f"{VENV}/bin/twistd",
        f"{VENV}/lib/python3.11/site-packages/twisted/plugins/agentcall_plugins.py",
        f"/lib/systemd/system/{UNIT}",
        "/usr/lib/sysusers.d/agentcall.conf",
        "/usr/lib/tmpfiles.d/agentcall.conf",
        "/etc/agentcall/relay.env",
        "/usr/share/man/man1/agentcall.1.gz",
        "/usr/share/man/man1/agentcall-call.1.gz",
        "/usr/share/man/man8/agentcall-relay.8.gz",
        "/usr/share/bash-completion/completions/agentcall",
        "/usr/share/zsh/vendor-completions/_agentcall",
        "/usr/share/fish/vendor_completions.d/agentcall.fish",
        "/usr/share/doc/agentcall/copyright",
    }
    assert expected - names == set()
    assert not [n for n in names if "__pycache__" in n or n.endswith("dropin.cache")]
    # The environment holds the pinned libraries and nothing the pins left to chance.
    site = f"{VENV}/lib/python3.11/site-packages/"
    carried = {
        canonicalize_name(n.removeprefix(site).split("-")[0])
        for n in (name.rstrip("/") for name in names)
        if n.startswith(site) and n.endswith(".dist-info") and "/" not in n.removeprefix(site)
    }
    assert carried == {*pins(), "agentcall"}
    # The unit is upstream's, with only twistd's path changed to the package's environment.
    _run(["dpkg-deb", "--extract", str(deb), str(tmp_path)])
    installed = (tmp_path / "lib" / "systemd" / "system" / UNIT).read_text()
    upstream = (REPO / "packaging" / "systemd" / UNIT).read_text()
    assert installed == upstream.replace("/usr/bin/twistd", f"{VENV}/bin/twistd")
    conffiles = _run(["dpkg-deb", "--info", str(deb), "conffiles"])
    assert conffiles.split() == ["/etc/agentcall/relay.env"]


def test_lintian_reports_no_errors_and_every_warning_is_explained(deb: Path) -> None:
    done = subprocess.run(
        ["lintian", "--tag-display-limit", "0", str(deb)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    tags = re.findall(r"^([EW]): agentcall: (\S+)", done.stdout, re.MULTILINE)
    assert [tag for level, tag in tags if level == "E"] == [], done.stdout
    readme = (REPO / "packaging" / "README.md").read_text()
    unexplained = {tag for _level, tag in tags if f"`{tag}`" not in readme}
    assert unexplained == set(), done.stdout


# --- the relay from the package, in a fresh Debian 12 root --------------------------------------


def _pristine_root() -> Path:
    """A minbase Debian 12 root, made once and kept in the cache (each copy fetches apt's lists)."""
    root = CACHE / f"{SUITE}-minbase"
    if (root / "etc" / "debian_version").exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    making = CACHE / f"{SUITE}-minbase.partial"
    shutil.rmtree(making, ignore_errors=True)
    _run(["debootstrap", "--variant=minbase", SUITE, str(making), MIRROR], timeout=1800)
    os.rename(making, root)
    return root


@contextlib.contextmanager
def _fresh_root(parent: Path) -> Iterator[Path]:
    """A copy of the pristine root with /proc, /dev and apt's archive cache mounted; every
    mount is undone and the copy removed on the way out, whatever happened inside."""
    root = parent / "root"
    _run(["cp", "-a", str(_pristine_root()), str(root)])
    archives = CACHE / "apt-archives"
    (archives / "partial").mkdir(parents=True, exist_ok=True)
    mounts: list[Path] = []
    try:
        for source, target, args in (
            ("proc", root / "proc", ["-t", "proc"]),
            ("/dev", root / "dev", ["--bind"]),
            (str(archives), root / "var" / "cache" / "apt" / "archives", ["--bind"]),
        ):
            _run(["mount", *args, source, str(target)])
            mounts.append(target)
        shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
        yield root
    finally:
        for target in reversed(mounts):
            if subprocess.run(["umount", str(target)], check=False).returncode != 0:
                subprocess.run(["umount", "--lazy", str(target)], check=False)
        if not any(os.path.ismount(target) for target in mounts):
            shutil.rmtree(root, ignore_errors=True)


def _unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def _env_file(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def _expand(exec_start: str, env: dict[str, str]) -> list[str]:
    """systemd's rules: ``${VAR}`` is one word, a word that is just ``$VAR`` splits on spaces."""
    words: list[str] = []
    for word in shlex.split(exec_start):
        if re.fullmatch(r"\$[A-Z_]+", word):
            words += env.get(word[1:], "").split()
        else:
            words.append(re.sub(r"\$\{([A-Z_]+)\}", lambda m: env.get(m.group(1), ""), word))
    return words


def _as_user(root: Path, user: str, group: str, argv: list[str]) -> list[str]:
    return [
        "chroot",
        str(root),
        "setpriv",
        f"--reuid={user}",
        f"--regid={group}",
        "--init-groups",
        "--",
        *argv,
    ]


def test_the_installed_relay_runs_as_its_unit_says_and_carries_a_call(
    deb: Path, tmp_path: Path
) -> None:
    with _fresh_root(tmp_path) as root:
        shutil.copy(deb, root / "tmp" / deb.name)
        apt_env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "DEBIAN_FRONTEND": "noninteractive",
            "LC_ALL": "C",
        }
        _run(["chroot", str(root), "apt-get", "update"], env=apt_env)
        _run(
            [
                "chroot",
                str(root),
                "apt-get",
                "install",
                "-y",
                "--no-install-recommends",
                f"/tmp/{deb.name}",
            ],
            env=apt_env,
        )

        # What the package set up: its user (sysusers.d) and state directory (tmpfiles.d).
        unit = _unit_settings((root / "lib" / "systemd" / "system" / UNIT).read_text())
        [user], [group] = unit["User"], unit["Group"]
        [state] = unit["StateDirectory"]
        passwd = {
            line.split(":")[0]: line.split(":")
            for line in (root / "etc" / "passwd").read_text().splitlines()
        }
        assert user in passwd
        uid, gid = int(passwd[user][2]), int(passwd[user][3])
        state_dir = root / "var" / "lib" / state
        info = state_dir.stat()
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (uid, gid, 0o700)
        assert not (root / "etc" / "systemd" / "system" / "multi-user.target.wants" / UNIT).exists()

        # The operator's part: the TLS key and chain in /etc/agentcall, relay.env edited.
        ca = make_ca(tmp_path / "ca")
        cert = ca.issue_server(tmp_path / "tls", hostnames=("localhost",), ips=("127.0.0.1",))
        etc = root / "etc" / "agentcall"
        shutil.copy(cert.key_file, etc / "key.pem")
        shutil.copy(cert.cert_file, etc / "cert.pem")
        port = free_port()
        url = f"https://localhost:{port}"
        [env_file] = unit["EnvironmentFile"]
        relay_env = root / env_file.lstrip("/")
        listen = rf"\g<1>{port}:interface=127.0.0.1:"
        edited = re.sub(r"(?m)^(AGENTCALL_RELAY_LISTEN=ssl:)8443:", listen, relay_env.read_text())
        edited = re.sub(r"(?m)^AGENTCALL_RELAY_URL=.*$", f"AGENTCALL_RELAY_URL={url}", edited)
        relay_env.write_text(edited)
        settings = _env_file(edited)

        # What systemd does before ExecStart=: LoadCredential= copies, readable by the user only.
        credentials = root / "run" / "credentials" / UNIT
        credentials.mkdir(parents=True)
        for spec in unit["LoadCredential"]:
            name, _, source = spec.partition(":")
            shutil.copy(root / source.lstrip("/"), credentials / name)
            os.chown(credentials / name, uid, gid)
            os.chmod(credentials / name, 0o400)
        os.chown(credentials, uid, gid)
        os.chmod(credentials, 0o500)
        notify_path = root / "run" / "agentcall-test-notify.sock"
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # Bound by its name from inside its directory: the full path under pytest's temporary
        # directory can pass the 107 bytes a socket address holds (the relay, in the root,
        # uses the short /run path).
        here = os.getcwd()
        os.chdir(notify_path.parent)
        try:
            notify.bind(notify_path.name)
        finally:
            os.chdir(here)
        os.chown(notify_path, uid, gid)
        notify.settimeout(WAIT_S)

        account = pwd.struct_passwd(passwd[user])
        service_env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
            "HOME": account.pw_dir,
            "USER": user,
            "LOGNAME": user,
            "SHELL": account.pw_shell,
            "NOTIFY_SOCKET": "/run/agentcall-test-notify.sock",
            "CREDENTIALS_DIRECTORY": f"/run/credentials/{UNIT}",
            "STATE_DIRECTORY": f"/var/lib/{state}",
            **settings,
        }
        umask = int(unit["UMask"][0], 8)

        bootstrap = subprocess.run(
            _as_user(
                root,
                user,
                group,
                [
                    "/usr/bin/agentcall",
                    "relay",
                    "bootstrap",
                    "--database",
                    settings["AGENTCALL_RELAY_DATABASE"],
                    "--org",
                    "acme",
                    "--url",
                    url,
                ],
            ),
            env=service_env,
            umask=umask,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert bootstrap.returncode == 0, bootstrap.stderr
        admin_invite = bootstrap.stdout.strip()
        database = root / settings["AGENTCALL_RELAY_DATABASE"].lstrip("/")
        assert database.stat().st_uid == uid and database.stat().st_mode & 0o077 == 0

        [exec_start] = unit["ExecStart"]
        argv = _expand(exec_start, service_env)
        assert argv[0] == f"{VENV}/bin/twistd" and "agentcall-relay" in argv
        relay = subprocess.Popen(
            _as_user(root, user, group, argv),
            env=service_env,
            umask=umask,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        log = LogFollower(relay.stdout, tmp_path / "relay.log")
        ann = Install("ann", tmp_path / "ann", str(cert.ca_cert_file))
        ken = Install("ken", tmp_path / "ken", str(cert.ca_cert_file))
        try:
            ready = notify.recv(4096).decode()
            assert "READY=1" in ready.split("\n"), ready
            context = ssl.create_default_context(cafile=str(cert.ca_cert_file))
            opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
            )
            with opener.open(f"{url}/readyz", timeout=WAIT_S) as r:
                assert r.status == 200

            ann.setup(admin_invite, "ann", "--caller-only")
            made = ann.cli("invite", "create")
            assert made.returncode == 0, made.stderr
            ken.setup(made.stdout.strip(), "ken", "--agent", "claude")
            ken.set_scenario("happy")
            ken.start_listener()
            done = ann.cli("call", "@acme/ken", "does the packaged relay carry calls?")
            assert done.returncode == 0, done.stderr + log.text()
            assert done.stdout.strip() == "FAKE-AGENT-ANSWER: does the packaged relay carry calls?"
        finally:
            ken.stop()
            if relay.poll() is None:
                relay.terminate()
                try:
                    relay.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    relay.kill()
                    relay.wait(timeout=10)
            notify.close()
        text = log.text()
        # twistd ends on SIGTERM by the signal itself, which systemd counts as a clean stop.
        assert relay.returncode in (0, -signal.SIGTERM), text
        # twistd found its plugin cache written by postinst, and nothing failed on the way.
        assert "plugin cache" not in text and "Traceback" not in text, text

        # Removing the package leaves nothing of it behind (prerm takes what postinst made),
        # but keeps the relay's data and its user.
        purged = subprocess.run(
            ["chroot", str(root), "apt-get", "purge", "-y", "agentcall"],
            env=apt_env,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert purged.returncode == 0, purged.stdout + purged.stderr
        left = [line for line in purged.stderr.splitlines() if "/usr/lib/agentcall" in line]
        assert left == [], purged.stderr
        assert not (root / "usr" / "lib" / "agentcall").exists()
        assert not (root / "etc" / "agentcall" / "relay.env").exists()
        assert database.exists()
