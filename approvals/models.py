"""The reviewers' side of approvals (decisions, per-tool rights) — see gateway for the
request row the pipeline writes when it parks a call."""
