"""The Landlock system calls, the ABI probe, the exec wrapper and what an agent needs."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentcall.confine import landlock, main, needs, prepare
from agentcall.confine.rules import Confinement

ABI, WHY_NOT = landlock.probe()
needs_landlock = pytest.mark.skipif(ABI < 1, reason=f"no Landlock on this kernel: {WHY_NOT}")


def answering(result: int, err: int = 0) -> landlock.Syscall:
    def call(number: int, *args: object) -> tuple[int, int]:
        assert number == landlock.SYS_CREATE_RULESET
        return result, err

    return call


@pytest.mark.parametrize(
    ("result", "err", "abi", "reason"),
    [
        (7, 0, 7, ""),
        (1, 0, 1, ""),
        (-1, errno.ENOSYS, 0, "no Landlock"),
        (-1, errno.EOPNOTSUPP, 0, "not enabled"),
        (-1, errno.EPERM, 0, "seccomp"),
        (-1, errno.EINVAL, 0, "probe failed"),
    ],
)
def test_the_probe_reads_the_abi_or_says_why_not(
    result: int, err: int, abi: int, reason: str
) -> None:
    found, why = landlock.probe(answering(result, err), platform="linux")
    assert found == abi
    assert reason in why


def test_landlock_exists_only_on_linux() -> None:
    assert landlock.probe(answering(7), platform="darwin") == (0, "Landlock exists only on Linux")


def test_a_failing_call_is_an_error_naming_it() -> None:
    def refuse(number: int, *args: object) -> tuple[int, int]:
        return -1, errno.EINVAL

    with pytest.raises(landlock.LandlockError, match="landlock_create_ruleset"):
        landlock.restrict(1, [], syscall=refuse)


def test_the_real_probe_agrees_with_the_kernel() -> None:
    abi, why = landlock.probe()
    assert (abi >= 1) == (why == "")
    assert landlock.cached_abi() == abi


# --- the exec wrapper --------------------------------------------------------------------------


def write_ruleset(path: Path, body: bytes, mode: int = 0o600) -> str:
    path.write_bytes(body)
    path.chmod(mode)
    return str(path)


@pytest.mark.parametrize(
    "entries",
    [
        [],
        [("/usr", "read")],
        [("/usr", "read"), ("/tmp/a b\nc\td", "write"), ("/h/.claude", "list")],
        [("/dev", "device"), ("/h/tools.log", "append")],
        [("/usr", "read"), ("bind-none", "tcp"), ("443", "connect"), ("65535", "connect")],
        [("bind-none", "tcp")],
    ],
)
def test_a_ruleset_reads_back_as_it_was_written(
    tmp_path: Path, entries: list[tuple[str, str]]
) -> None:
    path = write_ruleset(tmp_path / "r", main.encode_ruleset(entries))
    assert main.read_ruleset(path) == entries
    assert not os.path.exists(path)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"agentcall-ruleset-2\0",
        b"agentcall-ruleset-1",
        b"agentcall-ruleset-1\0read\0",
        b"agentcall-ruleset-1\0read\0relative\0",
        b"agentcall-ruleset-1\0everything\0/x\0",
        b"agentcall-ruleset-1\0read\0/x",
        b'{"version": 1, "rules": []}',
        # Network rules: only the runner's forms, and no port without the network restricted.
        b"agentcall-ruleset-1\0connect\x00443\0",
        b"agentcall-ruleset-1\0tcp\0bind-all\0",
        b"agentcall-ruleset-1\0tcp\0/x\0",
        *(
            b"agentcall-ruleset-1\0tcp\0bind-none\0connect\0" + port + b"\0"
            for port in (
                b"0",
                b"65536",
                b"+443",
                b" 443",
                b"4_43",
                b"-1",
                b"",
                b"443x",
                b"\xd9\xa3",
            )
        ),
    ],
)
def test_a_malformed_ruleset_is_refused_and_removed(tmp_path: Path, body: bytes) -> None:
    path = write_ruleset(tmp_path / "r", body)
    with pytest.raises(main.RulesetError):
        main.read_ruleset(path)
    assert not os.path.exists(path)


def test_a_ruleset_others_may_read_is_refused(tmp_path: Path) -> None:
    path = write_ruleset(tmp_path / "r", main.encode_ruleset([]), mode=0o644)
    with pytest.raises(main.RulesetError, match="private"):
        main.read_ruleset(path)


def test_the_wrapper_refuses_to_start_the_agent_without_its_ruleset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.main([str(tmp_path / "missing.json"), "/bin/true"]) == main.FAILED_EXIT
    assert "was not started" in capsys.readouterr().err
    assert main.main(["only-one"]) == main.FAILED_EXIT


def test_network_rules_are_not_applied_on_a_kernel_without_them() -> None:
    # Refused before a descriptor is opened or a system call made: no half boundary.
    rules = [("/usr", "read"), ("bind-none", "tcp"), ("443", "connect")]
    with pytest.raises(main.RulesetError, match="ABI 4, this kernel has 3"):
        main.apply(rules, abi=3)


def run_confined(conf: Confinement, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    prepared = prepare.prepare(conf, ["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"})
    try:
        return subprocess.run(
            list(prepared.argv),
            env=prepared.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        prepare.cleanup(prepared.private_tmp)


@needs_landlock
def test_the_wrapper_makes_the_run_a_session_and_group_of_its_own(tmp_path: Path) -> None:
    """The runner's kill timer signals the run's group: the wrapper leads a new one itself
    (no setsid(1) in front of it), with the pid the runner was given, before the agent runs."""
    conf = Confinement((str(tmp_path),), (), str(tmp_path))
    prepared = prepare.prepare(conf, ["/bin/sh", "-c", "echo $$; read _"], {"PATH": "/bin"})
    try:
        with subprocess.Popen(
            list(prepared.argv),
            env=prepared.env,
            cwd=tmp_path,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        ) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            # The agent has started (exec'd in the wrapper's place) and waits on its stdin.
            assert int(proc.stdout.readline()) == proc.pid
            assert os.getsid(proc.pid) == proc.pid
            assert os.getpgid(proc.pid) == proc.pid
            assert os.getsid(proc.pid) != os.getsid(0)
            proc.stdin.write("go\n")
            proc.stdin.close()
            assert proc.wait(timeout=60) == 0
    finally:
        prepare.cleanup(prepared.private_tmp)


def test_the_package_root_holds_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    root = prepare.package_root()
    assert root is not None
    assert os.path.isfile(os.path.join(root, "agentcall", "confine", "main.py"))
    # A package that is not a plain directory (a zip) is run by name, with site.
    monkeypatch.setattr(prepare, "package_root", lambda: None)
    assert prepare.wrapper_argv("/tmp/r", ["/bin/agent"]) == [
        os.path.abspath(sys.executable),
        *("-I", "-m", "agentcall.confine", "/tmp/r", "/bin/agent"),
    ]


@needs_landlock
@pytest.mark.slow
def test_a_confined_shell_reads_its_root_and_nothing_of_the_denylist(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("KEY")
    (home / "notes.txt").write_text("NOTES")
    (tmp_path / "outside.txt").write_text("OUTSIDE")
    log = tmp_path / "tools.log"
    conf = Confinement((str(home),), (), str(home), append_files=(str(log),))
    script = (
        f"cat {home}/notes.txt; cat {home}/.ssh/id_ed25519; cat {tmp_path}/outside.txt;"
        f" ls {home}; echo logged >> {log}; echo x > {home}/new.txt;"
        " echo t > $TMPDIR/t && cat $TMPDIR/t"
    )
    done = run_confined(conf, script, home)
    assert "NOTES" in done.stdout
    assert "KEY" not in done.stdout and "OUTSIDE" not in done.stdout
    assert done.stderr.count("Permission denied") == 3, done.stderr
    assert log.read_text() == "logged\n"
    assert not (home / "new.txt").exists()
    assert done.stdout.rstrip().endswith("t")


PROBE_TCP = """
import socket, sys
for port in map(int, sys.argv[1:]):
    with socket.socket() as s:
        try:
            s.connect(("127.0.0.1", port))
            print(port, "connected")
        except OSError as exc:
            print(port, "refused", exc.errno)
with socket.socket() as s:
    try:
        s.bind(("127.0.0.1", 0))
        print("bound")
    except OSError as exc:
        print("bind refused", exc.errno)
"""


@pytest.mark.skipif(ABI < 4, reason=f"no Landlock TCP rules on this kernel (ABI {ABI})")
@pytest.mark.slow
def test_a_confined_run_connects_only_to_its_ports_and_binds_none(tmp_path: Path) -> None:
    import socket

    with socket.socket() as allowed, socket.socket() as other:
        for server in (allowed, other):
            server.bind(("127.0.0.1", 0))
            server.listen(1)
        ports = [allowed.getsockname()[1], other.getsockname()[1]]
        probe = tmp_path / "probe.py"
        probe.write_text(PROBE_TCP)
        conf = Confinement((str(tmp_path),), (), str(tmp_path), connect_ports=(ports[0],))
        done = run_confined(conf, f"{sys.executable} -I {probe} {ports[0]} {ports[1]}", tmp_path)
        free = run_confined(
            conf._replace(connect_ports=None), f"{sys.executable} -I {probe} {ports[1]}", tmp_path
        )
    lines = done.stdout.splitlines()
    assert lines == [
        f"{ports[0]} connected",
        f"{ports[1]} refused {errno.EACCES}",
        f"bind refused {errno.EACCES}",
    ], done.stderr
    # Without connect_ports the network is left alone.
    assert free.stdout.splitlines() == [f"{ports[1]} connected", "bound"], free.stderr


# --- what an agent needs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "port"),
    [
        ("https://api.openai.com/v1", 443),
        ("http://127.0.0.1:8080/v1", 8080),
        ("http://proxy", 80),
        ("proxy.corp:3128", 3128),
        ("socks5h://127.0.0.1:9050", 9050),
        ("socks5://gw", 1080),
        ("", None),
        ("http://host:99999", None),
        ("http://host:abc", None),
        ("ftp://host", None),
        ("http://[::1", None),
    ],
)
def test_the_port_a_url_names(url: str, port: int | None) -> None:
    assert needs.url_port(url) == port


def test_codex_ports_come_from_https_its_proxy_and_its_configuration(tmp_path: Path) -> None:
    codex_home = tmp_path / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model_provider = "local"\n'
        'openai_base_url = "http://127.0.0.1:7000"\n'
        "[model_providers.local]\n"
        'base_url = "http://127.0.0.1:8001/v1"\n'
        "[mcp_servers.docs]\n"
        'url = "https://docs.corp:8443/mcp"\n'
        'command_url_note = "http://ignored:1"\n'
    )
    environ = {"https_proxy": "http://proxy:3128", "OPENAI_BASE_URL": "http://gw:9000"}
    found = needs.agent_ports("codex", str(tmp_path), environ)
    assert found == (443, 3128, 7000, 8001, 8443, 9000)
    # CODEX_HOME wins over the home's .codex; a configuration that does not parse adds none.
    (codex_home / "config.toml").write_text("this is [not toml")
    assert needs.agent_ports("codex", str(tmp_path), {}) == (443,)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "config.toml").write_text('openai_base_url = "http://127.0.0.1:7100"\n')
    assert needs.agent_ports("codex", str(tmp_path), {"CODEX_HOME": str(other)}) == (443, 7100)
    assert needs.agent_ports("claude", str(tmp_path), environ) == ()


def test_an_npm_program_gets_its_whole_node_modules() -> None:
    real = "/p/lib/node_modules/@openai/codex/bin/codex.js"
    assert needs.install_root(real) == "/p/lib/node_modules"
    assert needs.install_root("/usr/bin/claude") == "/usr/bin"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"#!/usr/bin/python3\n", "/usr/bin/python3"),
        (b"#! /bin/sh -e\n", "/bin/sh"),
        (b"#!/usr/bin/env -S sh -e\n", "FOUND:sh"),
        (b"#!/usr/bin/env\n", None),
        (b"#!\n", None),
        (b"\x7fELF", None),
    ],
)
def test_the_interpreter_of_a_script(line: bytes, expected: str | None) -> None:
    found = needs.shebang_interpreter(line, "/usr/bin:/bin")
    if expected is not None and expected.startswith("FOUND:"):
        assert found is not None and os.path.basename(found) == "sh"
    else:
        assert found == expected


def test_a_venv_interpreter_brings_its_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python3").symlink_to(sys.executable)
    script = tmp_path / "tool" / "agent"
    script.parent.mkdir()
    script.write_text(f"#!{venv / 'bin' / 'python3'}\n")
    found = needs.program_paths(str(script), "/usr/bin")
    assert str(script.parent) in found
    assert str(venv) in found


def test_the_agent_state_of_each_kind() -> None:
    assert needs.agent_state("claude", "/h", {}, 5) == (["/h/.claude"], ["/h/.claude.json"])
    assert needs.agent_state("claude", "/h", {"CLAUDE_CONFIG_DIR": "/c"}, 5) == (["/c"], [])
    assert needs.agent_state("codex", "/h", {}, 5) == (["/h/.codex", "/tmp/codex-daemon-5"], [])
    assert needs.agent_state("codex", "/h", {"CODEX_HOME": "/x"}, 5)[0][0] == "/x"
    assert needs.agent_state("command", "/h", {}, 5) == ([], [])


def test_the_guard_runtime_holds_this_python_and_the_package() -> None:
    read, listed = needs.guard_runtime()
    import agentcall

    package = os.path.dirname(os.path.abspath(agentcall.__file__))
    assert sys.prefix in read and package in read
    assert listed == [os.path.dirname(package)]


def test_prepare_writes_a_private_ruleset_and_cleanup_removes_the_temp_dir(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    log = tmp_path / "state" / "tools.log"
    log.parent.mkdir()
    conf = Confinement(
        (str(home),), (), str(home), agent_state=(str(home / ".claude"),), append_files=(str(log),)
    )
    prepared = prepare.prepare(conf, ["/bin/true"], {"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"})
    try:
        # Isolated and without site; the package's own directory after the standard library.
        assert prepared.argv[1:5] == ("-I", "-S", "-c", prepare.BOOT)
        assert prepared.argv[5] == prepare.package_root()
        assert os.path.isdir(os.path.join(prepared.argv[5], "agentcall", "confine"))
        ruleset = prepared.argv[6]
        assert prepared.argv[7:] == ("/bin/true",)
        assert os.stat(ruleset).st_mode & 0o777 == 0o600
        assert os.stat(prepared.private_tmp).st_mode & 0o777 == 0o700
        assert prepared.env["TMPDIR"] == prepared.private_tmp
        entries = main.read_ruleset(ruleset)
        # Its .claude (denylisted for the file tools) makes the home open child by child.
        assert (str(home), "list") in entries
        assert (prepared.private_tmp, "write") in entries
        assert (str(log), "append") in entries
        assert log.exists() and os.stat(log).st_mode & 0o777 == 0o600
        assert (home / ".claude").is_dir()
    finally:
        prepare.cleanup(prepared.private_tmp)
    assert not os.path.exists(prepared.private_tmp)


def test_a_command_agent_brings_the_files_its_words_name(tmp_path: Path) -> None:
    script = tmp_path / "agent" / "main.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    found = needs.command_paths(("-u", str(script), "/nowhere/x", "relative.py", str(tmp_path)))
    assert found == [str(script.parent), str(tmp_path)]
