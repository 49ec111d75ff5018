"""Pure combinatorial optimization: one configuration per node minimizing unary, pairwise and
higher-order cost tables, optionally under a memory limit. `problem` holds the problem,
`elimination` OptCNN's exact elimination, `descent` the search the planner runs (exact, else
block descent and local search; `solve_within` under a deadline), `anytime` the search for
graphs that do not eliminate (IOPDDL-contest scale), `kcut` SoyBean's k-cut. Imports nothing
else of jaxpar (numpy only).
"""
