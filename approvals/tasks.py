"""Approval tasks: the expiry sweeper (Celery beat in production, a thread under
`make run`). Expiry is a periodic sweep, never a long countdown: Redis redelivers
unacknowledged tasks after its visibility timeout, and a sweep is safe to repeat."""

from celery import shared_task

from approvals.decisions import expire_all


@shared_task(name="approvals.tasks.expire_approvals")
def expire_approvals() -> int:
    return expire_all()
