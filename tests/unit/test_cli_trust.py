"""`agentcall trust --reset`: the fix the changed-identity error names actually exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentcall.cli.main import main
from agentcall.crypto import records
from agentcall.crypto.keys import EncryptionKey, IdentityKey
from agentcall.crypto.pins import PinBook, PinState
from agentcall.errors import IdentityChanged
from agentcall.local.home import Home
from agentcall.local.statedb import StateDb
from tests.unit.cli_helpers import install, isolate

PEER = "@acme/ken"


def _pin_peer(home: Home, origin: str, identity: IdentityKey) -> None:
    served_identity = records.make_identity_record(identity, origin, PEER)
    served_encryption = records.make_encryption_record(
        identity,
        EncryptionKey.generate(),
        origin,
        PEER,
        epoch=1,
        not_before=1_000,
        not_after=2_000,
        previous=None,
    )
    db = StateDb.open(home)
    try:
        PinBook(db.pins).check_and_pin(PEER, served_identity, served_encryption, 1_500)
    finally:
        db.close()


def _state(home: Home, origin: str, identity: IdentityKey) -> PinState:
    db = StateDb.open(home)
    try:
        return PinBook(db.pins).peek_state(origin, PEER, identity.public_b64)
    finally:
        db.close()


def test_reset_forgets_a_pin_so_a_new_key_can_be_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home, config, _keys = install(isolate(monkeypatch, tmp_path))
    old, new = IdentityKey.generate(), IdentityKey.generate()
    _pin_peer(home, config.relay_origin, old)
    with pytest.raises(IdentityChanged, match="agentcall trust --reset"):
        _pin_peer(home, config.relay_origin, new)
    assert main(["trust", "--reset", PEER]) == 0
    assert "forgot" in capsys.readouterr().out
    assert _state(home, config.relay_origin, old) is PinState.UNSEEN
    _pin_peer(home, config.relay_origin, new)
    assert _state(home, config.relay_origin, new) is PinState.MATCHED


def test_reset_of_an_unknown_peer_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(isolate(monkeypatch, tmp_path))
    assert main(["trust", "--reset", "ken"]) == 0
    assert "nothing changed" in capsys.readouterr().out
    assert main(["trust", "--reset", "@other/ken"]) == 1
