"""Outbound redaction of credential shapes and exact secrets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentcall.listener.redact import REDACTED, redact, redacted_excerpt

# Fake credentials built at run time so no scanner mistakes this file for a leak.
ALNUM36 = "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\nq3J5bm9wc2lzZXhhbXBsZQ=="

SHAPES = [
    "sk-" + "proj-" + "a1B2c3D4e5F6g7H8i9J0",
    "sk-" + "ant-api03-" + "Zz9_Yy8-Xx7Ww6Vv5Uu4",
    "ghp_" + ALNUM36,
    "gho_" + ALNUM36,
    "ghu_" + ALNUM36,
    "ghs_" + ALNUM36,
    "ghr_" + ALNUM36,
    "github_pat_" + "11ABCDEFG0123456789_abcdefghijklmnop",
    "AKIA" + "IOSFODNN7EXAMPLE",
    "ASIA" + "ZXCVBNMASDFGHJKL",
    "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0In0" + ".c2lnbmF0dXJlLXBhcnQ",
    "-----BEGIN PRIVATE KEY-----\n" + PEM_BODY + "\n-----END PRIVATE KEY-----",
    "-----BEGIN OPENSSH PRIVATE KEY-----\n" + PEM_BODY + "\n-----END OPENSSH PRIVATE KEY-----",
    "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00FF\n\n"
    + PEM_BODY
    + "\n-----END RSA PRIVATE KEY-----",
]


@pytest.mark.parametrize("secret", SHAPES)
def test_each_shape_is_redacted(secret: str) -> None:
    """Each credential shape, inside ordinary text, is replaced and nothing of it remains."""
    out = redact(f"the key is {secret} ok.")
    assert out == f"the key is {REDACTED} ok."


def test_bearer_keeps_the_scheme_word() -> None:
    """A bearer token goes; the word Bearer stays so the reader knows what was removed."""
    token = "abcDEF123456._~+/=-xyz"
    assert redact(f"Authorization: Bearer {token}") == f"Authorization: Bearer {REDACTED}"
    assert redact(f"bearer  {token}") == f"bearer  {REDACTED}"


def test_pem_without_end_line_still_loses_its_body() -> None:
    """A private key quoted without its END line loses the BEGIN line and the base64 body."""
    text = f"start\n-----BEGIN EC PRIVATE KEY-----\n{PEM_BODY}\nand then prose follows."
    assert redact(text) == f"start\n{REDACTED}\nand then prose follows."


def test_public_key_blocks_are_left_alone() -> None:
    """Certificates and public keys are not secrets and are not redacted."""
    text = (
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----"
    )
    assert redact(text) == text


INNOCENT = [
    "Ask the task-runner about risk-assessment-framework-v2 today.",
    "sk-short",
    "ghp_tooshort",
    "AKIAtoolowercase0000",
    "The bearer of bad news arrived.",
    "eyJ is how base64 of '{\"' starts",
    "git commit -m 'fix' && git push origin main",
    "A hash: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
]


@pytest.mark.parametrize("text", INNOCENT)
def test_innocent_text_is_untouched(text: str) -> None:
    """Text without a credential shape is returned unchanged."""
    assert redact(text) == text


def test_exact_secrets_are_redacted_everywhere() -> None:
    """Each exact secret is replaced wherever it occurs, even with no known shape."""
    token = "Zq8xW3vN5tR7yU1iO9pL"
    out = redact(f"{token} and again:{token}!", secrets=[token])
    assert out == f"{REDACTED} and again:{REDACTED}!"


def test_short_exact_secrets_are_ignored() -> None:
    """An exact secret under 16 characters is not used, so innocent text is not mangled."""
    assert redact("the word abc stays", secrets=["abc", "fifteen-chars!!"]) == "the word abc stays"


def test_longest_exact_secret_wins() -> None:
    """A secret that contains another is removed whole, not split around the shorter one."""
    short, long = "0123456789abcdef", "0123456789abcdef-and-more"
    assert redact(f"x {long} y", secrets=[short, long]) == f"x {REDACTED} y"


def test_exact_secret_that_is_not_a_regex() -> None:
    """Secrets with regex metacharacters are matched literally."""
    token = "a.b*c+d?e(f)g[h]i{j}k"
    assert redact(f"<{token}> axbxc", secrets=[token]) == f"<{REDACTED}> axbxc"


def test_redact_then_cut_leaks_no_prefix() -> None:
    """A key straddling the cut is redacted before cutting, so no fragment of it remains."""
    key = "sk-" + "live-0123456789abcdefghij"
    text = "x" * 189 + " " + key + " tail"
    out = redacted_excerpt(text, 200)
    assert out == "x" * 189 + " " + REDACTED
    assert "sk-" not in out
    # Cutting first would have left a prefix the shapes no longer recognise.
    assert "sk-" in redact(text[:200])


def test_excerpt_is_bounded() -> None:
    """An excerpt never exceeds its limit; a negative limit is a programming error."""
    assert len(redacted_excerpt("y" * 1000, 200)) == 200
    with pytest.raises(ValueError):
        redacted_excerpt("y", -1)


@given(st.text(), st.sampled_from(SHAPES))
def test_shapes_never_survive_surrounding_text(prefix: str, secret: str) -> None:
    """Whatever precedes a key on its own line, the key does not come through."""
    out = redact(f"{prefix}\n{secret}\n")
    body = secret.splitlines()[0]
    assert body not in out


@given(st.text(alphabet=st.sampled_from(list("sk-ghp_AKIeyJ.Bearer 0123456789abcXYZ\n-"))))
def test_redaction_is_idempotent(text: str) -> None:
    """Redacting an already redacted text changes nothing."""
    once = redact(text)
    assert redact(once) == once
