"""``GET /invite/<org>``: what a person sees who opens an invite link in a browser.

An invite is ``<relay>/invite/<org>#<secret>``. Browsers never send what follows ``#``, so the
relay does not learn the secret here either: the page's one small script reads the link from
the address bar and shows the exact ``agentcall setup`` command to paste; without scripts it
says what to type. The page is the same for every well-formed organisation name (it does not
say whether one exists), carries no third-party anything, and its Content-Security-Policy lets
only that one script and style run.
"""

from __future__ import annotations

import base64
import hashlib
import html

from twisted.web import resource, server

from agentcall import ids

_SCRIPT = """
var link = window.location.href;
var ok = /#[A-Za-z0-9_-]{43}$/.test(link);
var out = document.getElementById("command");
if (ok) {
  out.textContent = "agentcall setup --invite '" + link + "' --handle YOUR-HANDLE";
  document.getElementById("note").textContent =
    "Choose your handle (the name coworkers call you by), then paste this in a terminal.";
} else {
  document.getElementById("note").textContent =
    "This link is incomplete: the part after # is missing. Ask for the whole link again.";
}
"""
_STYLE = """
body { font-family: sans-serif; max-width: 44rem; margin: 3rem auto; padding: 0 1rem; }
pre { background: #f3f3f3; padding: 1rem; white-space: pre-wrap; word-break: break-all; }
"""


def _digest(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


# Only the page's own script and style, by hash; nothing loaded from anywhere.
CSP = (
    "default-src 'none'; "
    f"script-src 'sha256-{_digest(_SCRIPT)}'; "
    f"style-src 'sha256-{_digest(_STYLE)}'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def page(org: str) -> bytes:
    """The page for ``org`` (a well-formed name; escaped anyway)."""
    name = html.escape(org)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>AgentCall invite to {name}</title>
<style>{_STYLE}</style></head>
<body>
<h1>You are invited to {name} on AgentCall</h1>
<p>AgentCall lets coworkers call each other's coding agents. To join, install it and run:</p>
<pre id="command">agentcall setup --invite 'THE WHOLE LINK' --handle YOUR-HANDLE</pre>
<p id="note">Use the whole link, including the part after #: that part is your one-time secret,
and it never leaves your machine for this page.</p>
<p>The invite works once. Treat it like a password.</p>
<script>{_SCRIPT}</script>
</body></html>
""".encode()


class InvitePages(resource.Resource):
    """``/invite/<org>``: the page above; 404 for anything else."""

    isLeaf = True

    def render_GET(self, request: server.Request) -> bytes:
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"x-content-type-options", b"nosniff")
        request.setHeader(b"referrer-policy", b"no-referrer")
        path = [part.decode("ascii", "replace") for part in request.postpath or []]
        if len(path) != 1 or not ids.is_org(path[0]):
            request.setResponseCode(404)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return b"not an invite link\n"
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"content-security-policy", CSP.encode())
        return page(path[0])
