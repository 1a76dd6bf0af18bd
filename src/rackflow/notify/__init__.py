"""Notifications (docs/NOTIFICATIONS.md): the events the write sites record (`events`), channels
(`service`), and the delivery loop every instance runs (`delivery`, `senders`)."""
