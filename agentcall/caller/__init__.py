"""The caller's side of a call: place it and believe only a verified answer (:mod:`.call`),
and remember the conversations it opened for follow-ups (:mod:`.outbound`, stored by
:mod:`.outboundstore`)."""
