"""This installation's own state under ``~/.agentcall``: where it lives (:mod:`.home`), the
settings (:mod:`.config`), the keys (:mod:`.keystore`), the contacts (:mod:`.contacts`) and
the machine state database (:mod:`.statedb`)."""
