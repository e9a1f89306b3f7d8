"""What the API keeps in memory between requests: job statuses (kept fresh by Postgres
notifications) and verified API tokens (dropped on a token change)."""
