"""Pre-flight checks (docs/CHECKS.md): the resource, the checker that asks the fleet, and the start gate
that reads what it found."""
