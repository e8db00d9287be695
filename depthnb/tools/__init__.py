"""The tooling beside the science: the cluster planner, the benchmarks, the docs site, its check and the README."""
