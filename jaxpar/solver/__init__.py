"""Pure combinatorial optimization: one configuration per node minimizing unary, pairwise and
higher-order cost tables. `search` holds the problem, OptCNN's elimination and block descent;
`kcut` SoyBean's k-cut. Imports nothing else of jaxpar (numpy only).
"""
