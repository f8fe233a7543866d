"""tierlog: the product around the rlmm and rsm libraries (agent, audit archiver, CLI, Spark jobs)."""
