"""The driver's channel: bounds, TLS, token scopes, answers, pins, budgets' ledger."""
