"""The program a train step is: a flat list of equations over tensors, with phases, layers,
loop regions and the jaxpr helpers the stages share. Pure: no jax import; JAX objects are read by
attribute.
"""
