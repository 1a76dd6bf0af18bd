"""Fleet-wide operation budgets: the resource (`rackflow.domain.budgets`), the admission rule (`rules`),
the use cases (`service`) and the executor's start gate (`gate`). See docs/ROLLOUTS.md, "Budgets"."""
