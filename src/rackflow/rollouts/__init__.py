"""Rollouts: a schedule's firing started across its racks in waves, within budgets, halting on failures.

The pure parts sit in the domain: `rackflow.domain.rollouts` is the rule (which scopes may start now, and
whether to halt), and the planner (`rackflow.domain.firing`) orders a new rollout's scopes and settles the
ones a step starts. `service` applies them to the runs in the database: `RolloutService.advance` is the one
entry point that moves a rollout, and `driver` is the loop in every instance that calls it.
"""
