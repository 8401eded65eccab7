"""The callee side: one socket to the relay, and a one-shot agent per admitted call."""
