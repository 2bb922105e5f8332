"""Routing: from a query to a tier (rules today; the trained classifier plugs in beside them)."""
