"""The domain's values and enums: what a rack, task, schedule, run, window, rollout policy, budget and audit
event are. Frozen dataclasses and enums with the rules that belong to a value alone; they import nothing
but `timespec/` and each other, so the store, the services and the API can all use them without a cycle."""
