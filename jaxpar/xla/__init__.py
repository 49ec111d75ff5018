"""Models of XLA's own passes, each measured against the compiled program: fusion, buffer
assignment, the all-reduce combiner, the SPMD partitioner's reshard paths, and the operand
layouts library calls want. Pure.
"""
