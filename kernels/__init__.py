"""jgraph.kernels: Pallas kernels, each beside a pure-jnp reference with the same
signature. Shipped as `jgraph.kernels` (this top-level folder is mapped into the package
by pyproject.toml); import it as `jgraph.kernels`, never as `kernels`."""
