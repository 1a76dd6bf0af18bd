"""Rollouts: a schedule's firing started across its racks in waves, within budgets, halting on failures.

`rackflow.domain.rollouts` is the pure rule (which scopes may start now, and whether to halt); `service`
applies it to the runs in the database (the one seam), and `driver` is the loop in every instance that
keeps rolling runs moving.
"""
