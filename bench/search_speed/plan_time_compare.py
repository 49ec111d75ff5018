"""Planning time and predicted step, this checkout against another one (e.g. a previous commit).

Plans one zoo model several times in one process and prints the median of trace + graph + costs
+ search, the median search time, the predicted step and whether it is certified. Used for the
issue 8 before/after table in bench/search_speed/README.md (results:
bench/search_speed/results/plan_time_compare.md):

    git worktree add /tmp/oldtree 2f1a813
    for tree in /tmp/oldtree .; do
        python bench/search_speed/plan_time_compare.py $tree vgg16 "{'node': 4, 'gpu': 4}" \\
            512 p100 3
    done
"""

import ast
import statistics
import sys

# The objective the committed results were planned with: OptCNN Eq. 1 ("time", the planner's
# default until 2026-11-24; the default is now "overlap").
OBJECTIVE = "time"


def main() -> None:
    tree, name, mesh_text, batch, cluster_name, runs = sys.argv[1:7]
    sys.path.insert(0, tree)  # the checkout to measure
    import jaxpar_zoo as zoo

    import jaxpar

    mesh = ast.literal_eval(mesh_text)
    ex = zoo.get(name, batch=int(batch))
    devices = 1
    for size in mesh.values():
        devices *= size
    cluster = jaxpar.Cluster.preset(cluster_name, devices=devices)
    times, searches = [], []
    for _ in range(int(runs)):
        plan = jaxpar.plan(ex.step, *ex.args, mesh=mesh, cluster=cluster, objective=OBJECTIVE)
        times.append(sum(plan.stats[k] for k in ("trace_s", "graph_s", "cost_s", "search_s")))
        searches.append(plan.stats["search_s"])
    print(
        f"{name} {mesh} plan_s median {statistics.median(times):.3f} (min {min(times):.3f}) "
        f"search_s median {statistics.median(searches):.3f} "
        f"step_ms {plan.cost.step_s * 1e3:.3f} optimal {plan.optimal}"
    )


if __name__ == "__main__":
    main()
