"""Maintenance windows and freezes: the resource (`rackflow.domain.windows`), how windows combine
(`rules`), the use cases (`service`) and the executor's start gate (`gate`). See docs/WINDOWS.md."""
