"""The driver's channel: the only code that speaks its protocol.

Owns the small HTTPS server on the driver (:mod:`.server`: bounded threads, memory and
time; :mod:`.socket_io`, :mod:`.protocol`), its key, certificate and scoped tokens
(:mod:`.credentials`), the answers it gives (:mod:`.answers`: which version a task scores
with, payload downloads, budget reports), the driver's server of versions and payload
copies (:mod:`.version_server`, :mod:`.payload_folder`, :mod:`.driver_address`), its
record of versions and pins (:mod:`.versions`, :mod:`.scopes`), the budgets' ledger
(:mod:`.budget_ledger`) and the workers' side of the conversation (:mod:`.client`: TLS
with the driver's certificate pinned).

Trust: the server trusts nothing that crosses its socket: every request must show the
token of the scope it asks about (a handle's or a budget's), is parsed with bounds and
never unpickled; what a request may change (pins, counts) is checked against what the
driver knows is running. Workers trust only a server that shows the pinned certificate.
Imports no front-end (:mod:`spark_keras.spark`) and no executor code.
"""
