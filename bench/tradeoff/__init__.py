"""Accuracy against inter-node bytes: each method's own knobs searched on both backends for
the two objectives together, each method's front, and seeds on the front at the budgets
params.yaml names (section `tradeoff`).

    python -m bench.tradeoff --dry-run        # the searches and seed runs, their time
    python -m bench.tradeoff                  # run what is not finished (resumes)
    python -m bench.tradeoff --report-only    # rebuild reports/tradeoff from runs/tradeoff
    python -m bench.tradeoff --render         # page, figure, verdict from points.json

A study on bench.study's skeleton, not part of `dvc repro` or CI (about 32 min here). For
each method, in this order:
- Optuna's search of the method's space (`tradeoff.spaces`) under objective `tradeoff`:
  both objectives, the best validation error and the inter-node bytes per rank, natively
  (multi-objective TPE, no pruning);
- Propulate's, which minimises one number: the error under a byte budget (each budget of
  `tradeoff.budgets`, as a fraction of DDP's bytes, a search of its own; over the budget
  the error plus 100 points per budget's worth sent: search.context.tradeoff_loss). DDP's
  bytes come from its Optuna search, which runs first; DDP's own bytes are fixed by the
  schedule, so its Propulate search has no budget.
Every search is `python -m search` under mpirun on `tradeoff.ranks` ranks (workers of
search.ranks_per_worker ranks, standing for `tradeoff.nodes` nodes, so the ledger counts
what would cross a node), its runs `train` with `tradeoff.train` and the point's values.
Then, at each budget, each method's best point within it is trained again at the seeds
after the search's own (`python -m abtrain.launch`, the same shape): its top-1 is the mean
over `tradeoff.seeds` seeds.

Writes reports/tradeoff/points.json (one record per evaluated configuration), README.md
and tradeoff.png; the verdict leads the README's headline. MLflow: the study as a parent
run, each point a nested run, the figure and the record as artifacts.
"""
