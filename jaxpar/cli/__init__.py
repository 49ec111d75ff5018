"""The command line: `jaxpar plan`, `clusters`, `calibrate`, `demo` (`main`), and checking what
the user typed (`arguments`).
"""
