"""The servers the runs talk to, apart from the flows that use them: :mod:`services.local` (a throwaway local
Prefect server for tests and benchmarks, and the health check every server start waits on) and the services a team
shares across machines (docs/cluster.md): :mod:`services.team` (``python -m services.team up`` / ``down``: the
credentials, Prefect's and MLflow's servers), :mod:`services.team_postgres` (their PostgreSQL cluster),
:mod:`services.team_checks` (every setting checked before anything starts) and :mod:`services.team_config` (where
they listen, their certificate)."""
