"""The domain's values and enums: what a rack, task, schedule, run, window, rollout policy, budget and audit
event are, and the pure rules over them: how windows combine (`window_rules`), the rollout rule
(`rollouts.decide`) and the planner that decides every firing (`firing`). Frozen dataclasses, enums and
functions without I/O or clock; they import nothing but `timespec/` and each other, so the store, the
services and the API can all use them without a cycle."""
