"""The systemd user unit: values quoted and escaped, unsafe values refused, systemctl steps."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall import service_unit
from agentcall.local.home import Home
from agentcall.service_unit import ServiceUnitError, UnitSpec

PYTHON = "/usr/bin/python3"


def systemd_words(value: str, *, exec_line: bool) -> list[str]:
    """What systemd reads back from a line of quoted words (the subset we write).

    ``$`` is expanded only in the arguments of an exec line, not in its program.
    """
    words: list[str] = []
    index = 0
    while index < len(value):
        expands_dollar = exec_line and bool(words)
        if value[index] == " ":
            index += 1
            continue
        if value[index] != '"':
            raise ValueError(f"unquoted word at {index}: {value!r}")
        index += 1
        word = ""
        while value[index] != '"':
            char = value[index]
            if char == "\\":
                index += 1
                char = value[index]
                if char not in '\\"':
                    raise ValueError(f"unexpected escape \\{char}")
            elif char in "%$":
                # Specifiers (and, in ExecStart, variables): only the doubled form is literal.
                if char == "$" and not expands_dollar:
                    word += char
                    index += 1
                    continue
                if value[index + 1] != char:
                    raise ValueError(f"live {char} in {value!r}")
                index += 1
            word += char
            index += 1
        words.append(word)
        index += 1
    return words


def directive(text: str, name: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(name + "=")]


def spec_for(tmp_path: Path, environ: dict[str, str] | None = None) -> UnitSpec:
    home = Home.from_environ({"HOME": str(tmp_path)})
    return service_unit.listener_spec(
        home, environ or {}, python=PYTHON, path_dirs=["/opt/claude/bin", "/usr/bin"]
    )


def test_the_unit_runs_the_listener_with_home_path_and_log(tmp_path: Path) -> None:
    """ExecStart runs `python -m agentcall listen`; HOME and PATH are set; output to the journal."""
    text = service_unit.render_unit(spec_for(tmp_path, {"AGENTCALL_HOME": "/srv/ac"}))
    (exec_start,) = directive(text, "ExecStart")
    assert systemd_words(exec_start, exec_line=True) == [PYTHON, "-m", "agentcall", "listen"]
    environment = [systemd_words(v, exec_line=False)[0] for v in directive(text, "Environment")]
    assert environment == [
        f"HOME={tmp_path}",
        "PATH=/opt/claude/bin:/usr/bin:/usr/local/bin:/bin",
        "AGENTCALL_HOME=/srv/ac",
    ]
    # Its output goes to the journal, which rotates it: no log file of its own to grow.
    assert directive(text, "StandardOutput") == ["journal"]
    assert directive(text, "StandardError") == ["journal"]
    for line in ("Restart=always", "RestartSec=2", "WantedBy=default.target", "Type=simple"):
        assert line in text.splitlines()


values = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=0, max_size=40)


@given(values)
def test_any_printable_value_survives_quoting(value: str) -> None:
    """What systemd reads back is exactly the value: quotes, backslashes, % and $ included."""
    line = service_unit.quote_exec_program("/bin/x") + " " + service_unit.quote_exec_arg(value)
    assert systemd_words(line, exec_line=True) == ["/bin/x", value]
    quoted = service_unit.quote_environment("X", value)
    assert systemd_words(quoted, exec_line=False) == [f"X={value}"]


def test_hostile_values_are_escaped(tmp_path: Path) -> None:
    """%h, $HOME, quotes and backslashes come out inert wherever systemd would act on them."""
    odd = tmp_path / "we%ird $HOME dir"
    tricky = 'say "hi" \\ %h $HOME'
    spec = UnitSpec(
        argv=(str(odd / "python"), tricky),
        environment=(("PATH", tricky),),
    )
    text = service_unit.render_unit(spec)
    (exec_start,) = directive(text, "ExecStart")
    assert systemd_words(exec_start, exec_line=True) == [str(odd / "python"), tricky]
    assert exec_start.startswith(f'"{str(odd).replace("%", "%%")}/python" ')
    (environment,) = directive(text, "Environment")
    assert systemd_words(environment, exec_line=False) == [f"PATH={tricky}"]


@pytest.mark.parametrize("program", ['/opt/"x"/python', "/opt/x\\y/python", "/opt/it's/python"])
def test_quotes_in_the_program_path_are_refused(program: str) -> None:
    """systemd refuses such an executable name, so setup says so instead of writing it."""
    with pytest.raises(ServiceUnitError, match="quote or a backslash"):
        service_unit.render_unit(UnitSpec((program,), ()))


@pytest.mark.parametrize("bad", ["a\nExecStartPre=/bin/rm -rf ~", "nul\x00", "cr\r", "esc\x1b"])
def test_line_breaks_and_controls_are_refused(tmp_path: Path, bad: str) -> None:
    """A value that could start a new directive never reaches the file."""
    spec = spec_for(tmp_path, {"SSL_CERT_FILE": bad})
    with pytest.raises(ServiceUnitError, match="control character"):
        service_unit.render_unit(spec)
    with pytest.raises(ServiceUnitError):
        service_unit.quote_exec_arg(bad)


def test_relative_paths_and_bad_names_are_refused(tmp_path: Path) -> None:
    """The interpreter and log must be absolute; variable names must be names."""
    home = Home.from_environ({"HOME": str(tmp_path)})
    with pytest.raises(ServiceUnitError):
        service_unit.listener_spec(home, {}, python="python3")
    with pytest.raises(ServiceUnitError):
        service_unit.render_unit(UnitSpec((), ()))
    with pytest.raises(ServiceUnitError):
        service_unit.quote_environment("BAD NAME", "x")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_accepts_the_rendered_unit(tmp_path: Path) -> None:
    """systemd's own parser finds no error in a unit full of characters that need escaping."""
    odd = tmp_path / "a%b $c d"
    odd.mkdir()
    python = odd / "python"
    python.symlink_to(shutil.which("python3") or "/bin/sh")
    spec = UnitSpec(
        argv=(str(python), "-m", 'say "hi" \\ %h $HOME', "listen"),
        environment=(("HOME", str(odd)), ("PATH", "/usr/bin:/bin")),
    )
    unit = tmp_path / "agentcall-listener.service"
    unit.write_text(service_unit.render_unit(spec))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    if "Failed to initialize manager" in done.stderr:
        pytest.skip("systemd-analyze cannot run here")
    assert done.returncode == 0, done.stderr


def test_the_unit_path_follows_xdg_config_home(tmp_path: Path) -> None:
    """~/.config by default; $XDG_CONFIG_HOME when it is an absolute path."""
    home = Home.from_environ({"HOME": str(tmp_path)})
    name = "systemd/user/agentcall-listener.service"
    assert service_unit.unit_path(home, {}) == tmp_path / ".config" / name
    assert service_unit.unit_path(home, {"XDG_CONFIG_HOME": "/x"}) == Path("/x") / name
    assert service_unit.unit_path(home, {"XDG_CONFIG_HOME": "rel"}) == tmp_path / ".config" / name


class Systemctl:
    def __init__(self, failing: str | None = None, active: bool = False) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.failing = failing
        self.active = active

    def __call__(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(tuple(args))
        failed = args[0] == self.failing or (args[0] == "is-active" and not self.active)
        stderr = "Failed to connect to bus: No medium found\n" if failed else ""
        return subprocess.CompletedProcess(list(args), 1 if failed else 0, "", stderr)


def test_install_writes_a_private_unit_then_enables_and_restarts(tmp_path: Path) -> None:
    """The file is 0600; daemon-reload, enable and restart run in that order."""
    path = tmp_path / "user" / "agentcall-listener.service"
    systemctl = Systemctl()
    assert service_unit.install(path, "[Unit]\n", systemctl) is True
    assert path.read_text() == "[Unit]\n"
    assert path.stat().st_mode & 0o777 == 0o600
    assert systemctl.calls == [
        ("daemon-reload",),
        ("enable", "agentcall-listener.service"),
        ("restart", "agentcall-listener.service"),
    ]


def test_install_leaves_an_unchanged_active_unit_running(tmp_path: Path) -> None:
    """Same text and already active: nothing is reloaded or restarted."""
    path = tmp_path / "agentcall-listener.service"
    path.write_text("[Unit]\n")
    systemctl = Systemctl(active=True)
    assert service_unit.install(path, "[Unit]\n", systemctl) is False
    assert systemctl.calls == [("is-active", "--quiet", "agentcall-listener.service")]


def test_a_systemctl_failure_is_one_line_with_its_reason(tmp_path: Path) -> None:
    """The error names the command and systemctl's own last line."""
    path = tmp_path / "agentcall-listener.service"
    with pytest.raises(ServiceUnitError) as error:
        service_unit.install(path, "[Unit]\n", Systemctl(failing="enable"))
    message = str(error.value)
    assert "systemctl --user enable" in message and "No medium found" in message
    assert "\n" not in message


def test_availability_is_probed_with_show_environment() -> None:
    """A user manager that answers means systemd can run the listener."""
    assert service_unit.systemd_available(Systemctl()) is True
    assert service_unit.systemd_available(Systemctl(failing="show-environment")) is False


def test_uninstall_stops_removes_and_reloads(tmp_path: Path) -> None:
    """disable --now, delete the file, daemon-reload, reset-failed."""
    path = tmp_path / "agentcall-listener.service"
    path.write_text("[Unit]\n")
    systemctl = Systemctl()
    service_unit.uninstall(path, systemctl)
    assert not path.exists()
    assert [c[0] for c in systemctl.calls] == ["disable", "daemon-reload", "reset-failed"]


def test_the_reference_unit_matches_the_generated_one(tmp_path: Path) -> None:
    """packaging/systemd documents the same directives setup writes."""
    reference = Path(__file__).resolve().parents[2] / "packaging/systemd/agentcall-listener.service"

    def names(text: str) -> set[str]:
        return {
            line.split("=", 1)[0]
            for line in text.splitlines()
            if "=" in line and not line.startswith("#")
        }

    generated = service_unit.render_unit(spec_for(tmp_path))
    assert names(reference.read_text()) == names(generated)


def test_the_launchd_agent_is_a_valid_property_list_that_refuses_controls(tmp_path: Path) -> None:
    import plistlib

    spec = spec_for(tmp_path, {})
    data = service_unit.render_launchd_plist(spec, tmp_path / "agent.log")
    agent = plistlib.loads(data)
    assert agent["Label"] == "com.agentcall.listener"
    assert agent["ProgramArguments"] == list(spec.argv)
    assert agent["StandardOutPath"] == agent["StandardErrorPath"] == str(tmp_path / "agent.log")
    bad = UnitSpec(argv=(PYTHON, "-m", "agentcall", "listen\n"), environment=())
    with pytest.raises(ServiceUnitError, match="control character"):
        service_unit.render_launchd_plist(bad, tmp_path / "agent.log")
