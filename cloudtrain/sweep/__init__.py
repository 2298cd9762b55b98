"""Cost-limited training sweeps: many trials of one recipe under a hard dollar budget.

`core.py` is the scheduler, a pure state machine (no I/O, an injected clock): dollar admission,
VM placement and warm reuse, retries, recovery. It talks to a small `Backend` protocol; `sim.py`
is an in-memory backend (tests, benchmark) and `backend.py` the real one, which runs each trial
through the `run` pipeline on a kept per-slot cluster. Optuna samples parameters and prunes
losing trials (`space.py`); `store.py` keeps the scheduler's records in the state database;
`session.py` wires it all for `cloudtrain sweep`; `results.py` writes the leaderboard and plots.
The scheduler's money is the budget guard only: what a sweep spent is `ledger.py`, the billed
intervals in state per cluster incarnation, the numbers `cloudtrain cost` shows.
"""
