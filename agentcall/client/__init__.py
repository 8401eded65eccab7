"""The client side of the relay connection: relay URLs, TLS trust, the HTTP API, WebSockets.

Used by the CLI, the listener, the tests and the benchmarks. Nothing here imports the global
reactor; every entry point takes the reactor it should use.
"""
