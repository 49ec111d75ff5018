"""The jax side of the inputs: a user's step traced to a flat `Program` (`tracing`), the
trip counts tracing knows (`while_trips`), and the user's mesh described (`meshes`).
"""
