"""The planner: a run's programs built and measured for hardware that is not here
(`jgraph compile`), from a partitioned graph or from a graph's counts alone."""
