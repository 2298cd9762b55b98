"""Notifications: events that matter (a run's end, a preemption, a budget, a watchdog's action, a
leak, a sweep's end) sent to signed webhooks and human channels (docs/notifications.md).

`hooks.py`: what the deciding code calls; `targets.py` + `model.py`: where events go and what they
are (read by config and recipes, so they, and this file, import nothing above them); `outbox.py`,
`send.py`, `signing.py`: storing, delivering and signing them.
"""
