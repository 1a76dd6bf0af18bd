"""The audit trail: who changed what, when, with what outcome, and the schedule before and after.

`trail.AuditTrail` records and lists events (one per action, whichever front end took it: the gRPC
interceptor in `rackflow.api.audit`, or any other that calls `AuditTrail.record`), `spool.AuditSpool`
keeps the events a database outage refused until it is back, `retention.AuditPruner` deletes the old
ones, `changes` carries what a service changed beyond what the request names into its call's event,
`decisions` records what rackflow decides about tasks outside any call (a window's owed decisions, a
freeze's hold let go of, by an executor's look again) in the decision's own transaction,
`rackflow.domain.audit.AuditEvent` is one event. Its SQL is `rackflow.store.audit`.
"""
