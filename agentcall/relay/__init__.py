"""The relay: a router and a directory that never sees a prompt or a reply.

It holds the registry (orgs, members, invites, published keys, audit rows) in one store, routes
sealed envelopes between live sessions, and keeps call lifecycles, deadlines and rate windows.
"""
