"""Maintenance windows and freezes: the resource (`rackflow.domain.windows`), how windows combine
(`rackflow.domain.window_rules`), the use cases (`service`) and the executor's start gate (`gate`). See
docs/WINDOWS.md."""
